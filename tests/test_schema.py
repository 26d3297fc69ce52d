"""schema.py: first-run errors on a database without django-pgqueue's migrations, and a
project whose TASKS names the backend without the app in INSTALLED_APPS.

Subprocess tests run real ``manage.py`` commands against a fresh database this module
creates (and drops) with nothing migrated in it; in-process tests hide the jobs table
inside the test's transaction (rolled back) or, for a worker's threads, for the test.
"""

from __future__ import annotations

import re
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from django.core import checks as django_checks
from django.db import connection, transaction

from django_pgqueue.checks import check_migrated
from django_pgqueue.exceptions import NotMigrated
from django_pgqueue.models import Job
from django_pgqueue.schema import unapplied_migrations
from django_pgqueue.sweeper import Sweeper, sweep
from django_pgqueue.taskapi import task_backends
from django_pgqueue.worker import Worker
from testproject.demo import tasks
from tests.conftest import connect_test_db, test_database_url

MIGRATE = "run `python manage.py migrate`"


def all_migrations() -> str:
    """Every migration of the app, as the messages list them (others may add some)."""
    from django.db.migrations.loader import MigrationLoader

    loader = MigrationLoader(None, ignore_no_migrations=True)
    names = sorted(name for app, name in loader.disk_migrations if app == "django_pgqueue")
    return ", ".join(names)


@pytest.fixture
def bare_database_url() -> Iterator[str]:
    """URL of a new, empty database on the test server (dropped afterwards)."""
    name = f"pgqueue_bare_{secrets.token_hex(4)}"
    admin = connect_test_db(dbname="postgres", autocommit=True)
    try:
        admin.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name)))
        current = connection.settings_dict["NAME"]
        yield test_database_url().replace(f"/{current}", f"/{name}", 1)
    finally:
        admin.execute(
            psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                psycopg.sql.Identifier(name)
            )
        )
        admin.close()


@pytest.mark.slow
@pytest.mark.parametrize(
    "command",
    [
        ("pgqueue_worker",),
        ("pgqueue_worker", "--burst"),
        ("pgqueue_sweep",),
        ("pgqueue_sweep", "--loop"),
        ("pgqueue_status",),
        ("pgqueue_status", "--check"),
    ],
    ids=["worker", "worker-burst", "sweep", "sweep-loop", "status", "status-check"],
)
def test_commands__unmigrated_database_exits_naming_migrate(manage, bare_database_url, command):
    """They used to retry 'relation "pgqueue_job" does not exist' forever (the status
    command printed its traceback)."""
    proc = manage(*command, env={"DATABASE_URL": bare_database_url})
    assert proc.wait(60) == 1, proc.output()
    names = all_migrations()
    expected = (
        f"CommandError: database 'default' lacks {len(names.split(', '))} django-pgqueue "
        f"migration(s) ({names}): {MIGRATE}"
    )
    assert expected in proc.output(), proc.output()
    assert "Traceback" not in proc.output()


@pytest.mark.slow
def test_check__unmigrated_database_warns_naming_migrate(manage, bare_database_url):
    proc = manage("check", "--database", "default", env={"DATABASE_URL": bare_database_url})
    assert proc.wait(60) == 0, proc.output()
    count = len(all_migrations().split(", "))
    expected = f"(pgqueue.W010) Database 'default' lacks {count} django-pgqueue migration(s)"
    assert expected in proc.output(), proc.output()
    assert "HINT: Run `python manage.py migrate`." in proc.output()


@pytest.mark.slow
def test_migrate__still_creates_the_tables_despite_the_warning(manage, bare_database_url):
    """migrate runs database checks first: an error there would block the fix."""
    env = {"DATABASE_URL": bare_database_url}
    assert manage("migrate", "-v", "0", env=env).wait(120) == 0
    proc = manage("check", "--database", "default", env=env)
    assert proc.wait(60) == 0
    assert "pgqueue.W010" not in proc.output(), proc.output()


@pytest.mark.slow
def test_migrate__does_not_warn_to_run_migrate(manage, bare_database_url):
    """The first migrate used to print W010 "run `python manage.py migrate`"."""
    proc = manage("migrate", env={"DATABASE_URL": bare_database_url})
    assert proc.wait(120) == 0, proc.output()
    assert "Applying django_pgqueue.0001_initial... OK" in proc.output()
    assert "pgqueue.W010" not in proc.output(), proc.output()


@pytest.mark.django_db
def test_check_migrated__still_warns_outside_migrate(monkeypatch):
    """The same check, called from anything but migrate, still reports."""
    monkeypatch.setattr("django_pgqueue.schema.unapplied_migrations", lambda alias: ["0099_x"])
    assert [m.id for m in check_migrated(databases=["default"])] == ["pgqueue.W010"]


@pytest.mark.slow
def test_enqueue__without_the_app_installed_says_to_install_it(manage):
    code = "from testproject.demo.tasks import add; add.enqueue(1, 2)"
    proc = manage(
        "shell", "-c", code, env={"DJANGO_SETTINGS_MODULE": "tests.settings_without_app"}
    )
    assert proc.wait(60) != 0
    assert (
        "ImproperlyConfigured: TASKS uses django_pgqueue.backend.PgQueueBackend but "
        "'django_pgqueue' is not in INSTALLED_APPS: add it there, then run "
        "`python manage.py migrate`." in proc.output()
    ), proc.output()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_quickstart_apps__check_passes_and_a_worker_works_jobs(manage, job_factory):
    """INSTALLED_APPS without django.contrib.postgres (the quickstart's): the workers
    table's ArrayField used to fail `check` with postgres.E005."""
    env = {"DJANGO_SETTINGS_MODULE": "tests.settings_without_postgres"}
    code = "from django.conf import settings; print(settings.INSTALLED_APPS)"
    proc = manage("shell", "-c", code, env=env)
    assert proc.wait(60) == 0, proc.output()
    assert "'django_pgqueue'" in proc.output()
    assert "django.contrib.postgres" not in proc.output()

    proc = manage("check", "--database", "default", env=env)
    assert proc.wait(60) == 0, proc.output()
    assert "System check identified no issues" in proc.output(), proc.output()

    jobs = [job_factory(queue="q") for _ in range(3)]
    proc = manage("pgqueue_worker", "--burst", "--poll-interval", "0.1", "--queue", "q", env=env)
    assert proc.wait(60) == 0, proc.output()
    assert [Job.objects.get(pk=j.pk).status for j in jobs] == ["done"] * 3, proc.output()
    assert Job.objects.filter(pk__in=[j.pk for j in jobs], result=3).count() == 3


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_only_the_app_installed__check_passes_and_a_worker_works_jobs(manage, job_factory):
    """INSTALLED_APPS of "django_pgqueue" alone (no contrib app at all): nothing of the
    package needs another app to pass its checks or to work jobs."""
    env = {"DJANGO_SETTINGS_MODULE": "tests.settings_only_the_app"}
    proc = manage("check", "--database", "default", env=env)
    assert proc.wait(60) == 0, proc.output()
    assert "System check identified no issues" in proc.output(), proc.output()

    jobs = [job_factory(task=f"tests.plain_tasks.{name}") for name in ("add", "add_async")]
    proc = manage("pgqueue_worker", "--burst", "--poll-interval", "0.1", env=env)
    assert proc.wait(60) == 0, proc.output()
    ran = Job.objects.filter(pk__in=[j.pk for j in jobs]).order_by("pk")
    assert list(ran.values_list("status", "result")) == [("done", 3)] * 2, proc.output()


# --- in process ------------------------------------------------------------------------


def hide_jobs_table() -> None:
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE pgqueue_job RENAME TO pgqueue_job_hidden")


@pytest.mark.django_db
def test_enqueue__missing_table_raises_not_migrated(job_factory):
    hide_jobs_table()
    calls = {
        "enqueue": lambda: Job.objects.enqueue(tasks.add, [1, 2]),
        "bulk_enqueue": lambda: Job.objects.bulk_enqueue([{"task": tasks.add}] * 3),
        "task.enqueue": lambda: tasks.add.enqueue(1, 2),
        "get_result": lambda: task_backends["default"].get_result("1"),
        "claim": lambda: Job.objects.claim("w", limit=1),
        "sweep": lambda: sweep(),
    }
    for name, call in calls.items():
        with pytest.raises(NotMigrated) as info, transaction.atomic():
            call()
        message = str(info.value)
        assert message.startswith("the django-pgqueue tables are missing from database "), name
        assert 'relation "pgqueue_job" does not exist' in message, name
        assert message.endswith(MIGRATE), name


@pytest.mark.django_db
def test_not_migrated__is_a_django_programming_error():
    from django.db import DatabaseError, ProgrammingError

    hide_jobs_table()
    with pytest.raises(ProgrammingError), transaction.atomic():
        Job.objects.enqueue(tasks.add, [1, 2])
    assert issubclass(NotMigrated, DatabaseError)


@pytest.mark.django_db
def test_check_migrated__warns_per_missing_migration_and_is_quiet_when_migrated():
    assert unapplied_migrations("default") == []
    assert check_migrated(databases=["default"]) == []
    assert check_migrated(databases=None) == []  # database checks not asked for
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM django_migrations WHERE app = 'django_pgqueue'")
    (warning,) = check_migrated(databases=["default"])
    assert warning.id == "pgqueue.W010" and warning.level == django_checks.WARNING
    assert f"lacks {len(all_migrations().split(', '))} django-pgqueue migration(s)" in warning.msg
    assert all_migrations() in warning.msg
    assert warning.hint == "Run `python manage.py migrate`."


@contextmanager
def jobs_table_hidden() -> Iterator[None]:
    """Rename the jobs table for the block, committed (other threads see it too)."""
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE pgqueue_job RENAME TO pgqueue_job_hidden")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE pgqueue_job_hidden RENAME TO pgqueue_job")


@pytest.mark.django_db(transaction=True)
def test_worker__missing_table_is_fatal_not_retried():
    worker = Worker(burst=False, poll_interval=0.05, worker_id="w-unmigrated")
    with jobs_table_hidden():
        worker.run()  # returns: burst is off, so only a fatal error ends it
    assert worker.fatal is not None and worker.fatal.endswith(MIGRATE)
    assert worker.stats.claimed == 0


# transaction=True: the sweeper's loop closes a connection left inside a transaction.
@pytest.mark.django_db(transaction=True)
def test_sweeper__missing_table_is_raised_not_retried():
    sweeper = Sweeper(interval=0.05)
    timer = threading.Timer(30, sweeper.stop)  # a retry loop would end here, and fail
    timer.start()
    try:
        with jobs_table_hidden(), pytest.raises(NotMigrated, match=re.escape(MIGRATE)):
            sweeper.run_forever()
    finally:
        timer.cancel()
