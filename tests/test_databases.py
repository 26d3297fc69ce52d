"""Several jobs databases: each ``TASKS`` alias names its own (``databases.py``).

The test project has two backends: ``default`` on the default database and ``second``
on a second database of the same server (``OPTIONS["DATABASE"] = "second"``), and a
router that lets only django_pgqueue migrate on the second.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import pytest
from django.core import checks
from django.db import connections, transaction
from django.test import override_settings
from django.urls import reverse

from django_pgqueue.backend import PgQueueBackend
from django_pgqueue.bulk import enqueue_many
from django_pgqueue.databases import backend_database, default_database, listen_target
from django_pgqueue.models import Job
from django_pgqueue.sweeper import Sweeper
from django_pgqueue.taskapi import task_backends
from testproject.demo import fault_tasks
from testproject.demo.models import Execution
from testproject.demo.tasks import add

from .conftest import ManagedProcess, wait_for

BOTH = ["default", "second"]
pytestmark = pytest.mark.django_db(databases=BOTH, transaction=True)

PGQUEUE = "django_pgqueue.backend.PgQueueBackend"


def ids(alias: str, **filters: object) -> set[int]:
    return set(Job.objects.using(alias).filter(**filters).values_list("id", flat=True))


def tables(alias: str) -> set[str]:
    return set(connections[alias].introspection.table_names())


def test_backend__each_alias_names_its_database() -> None:
    assert backend_database("default") == "default" == default_database()
    assert backend_database("second") == "second"
    assert task_backends["second"].database == "second"
    with pytest.raises(ValueError, match="TASKS has no backend 'nope'"):
        backend_database("nope")


def test_enqueue__goes_to_the_backends_database() -> None:
    first = add.enqueue(1, 2)
    second = add.using(backend="second").enqueue(3, 4)
    assert ids("default") == {int(first.id)}
    assert ids("second") == {int(second.id)}
    assert Job.objects.using("second").get().backend == "second"
    # get_result reads the same database it wrote.
    assert add.using(backend="second").get_result(second.id).args == [3, 4]


def test_enqueue__joins_the_transaction_of_its_own_database() -> None:
    """A rolled-back transaction on the second database takes its job with it; one on
    the default database does not (the job was never part of it)."""
    with transaction.atomic(using="second"):
        add.using(backend="second").enqueue(1, 1)
        transaction.set_rollback(True, using="second")
    assert ids("second") == set()
    with transaction.atomic(using="default"):
        kept = add.using(backend="second").enqueue(2, 2)
        transaction.set_rollback(True, using="default")
    assert ids("second") == {int(kept.id)}
    assert ids("default") == set()


def test_bulk_enqueue__goes_to_the_backends_database() -> None:
    created = enqueue_many(add.using(backend="second"), (([n, n], None) for n in range(250)))
    assert created == 250
    assert len(ids("second")) == 250 and ids("default") == set()
    assert Job.objects.db_manager("second").bulk_enqueue([{"task": add, "args": [1, 1]}]) == 1
    assert len(ids("second")) == 251 and ids("default") == set()


def test_migrations__apply_where_the_router_allows() -> None:
    """The router lets only django_pgqueue migrate on the second database: its jobs
    table and indexes are there, the other apps' tables are not."""
    assert {"pgqueue_job", "demo_execution", "auth_user"} <= tables("default")
    second = tables("second")
    assert "pgqueue_job" in second
    assert not {"demo_execution", "auth_user", "django_admin_log"} & second
    with connections["second"].cursor() as cursor:
        cursor.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'pgqueue_job'")
        indexes = {row[0] for row in cursor.fetchall()}
    assert {"pgqueue_job_claim_idx", "pgqueue_job_dead_idx"} <= indexes


class JobsToSecond:
    """Routes the Job model to the second database."""

    def db_for_write(self, model: type, **hints: object) -> str | None:
        return "second" if model._meta.app_label == "django_pgqueue" else None

    db_for_read = db_for_write


class NoJobsOnSecond:
    def allow_migrate(self, db: str, app_label: str, **hints: object) -> bool | None:
        return False if db == "second" and app_label == "django_pgqueue" else None


def test_backend__without_options_database_follows_the_router() -> None:
    with override_settings(
        DATABASE_ROUTERS=[JobsToSecond()],
        TASKS={"default": {"BACKEND": PGQUEUE}},
    ):
        assert task_backends["default"].database == "second"
        job = add.enqueue(5, 5)
        assert ids("second") == {int(job.id)}
        assert Job.objects.enqueue(add, [6, 6]).id in ids("second")


def test_check__router_forbids_the_jobs_database() -> None:
    with override_settings(
        DATABASE_ROUTERS=[NoJobsOnSecond()],
        TASKS={"second": {"BACKEND": PGQUEUE, "OPTIONS": {"DATABASE": "second"}}},
    ):
        codes = [m.id for m in task_backends["second"].check()]
    assert codes == ["pgqueue.E051"]


def test_check__pgqueue_database_disagrees_with_options() -> None:
    with override_settings(
        PGQUEUE_DATABASE="second",
        TASKS={"default": {"BACKEND": PGQUEUE, "OPTIONS": {"DATABASE": "default"}}},
    ):
        messages = task_backends["default"].check()
    assert [m.id for m in messages] == ["pgqueue.E050"]
    assert "PGQUEUE_DATABASE is 'second'" in messages[0].msg


def test_check__pgqueue_database_is_the_fallback_without_options() -> None:
    with override_settings(PGQUEUE_DATABASE="second", TASKS={"default": {"BACKEND": PGQUEUE}}):
        assert task_backends["default"].database == "second"
        assert task_backends["default"].check() == []


def test_pgqueue_database__the_documented_default_is_the_one_used(monkeypatch) -> None:
    """conf.Settings.DATABASE (the settings reference's default) used to say 'default'
    while the code read PGQUEUE_DATABASE itself and, unset, asked the routers."""
    from django_pgqueue.conf import Settings, settings
    from django_pgqueue.databases import options_database

    with override_settings(DATABASE_ROUTERS=[JobsToSecond()]):
        assert Settings.DATABASE is None and settings.DATABASE is None
        assert options_database({}) == "second"  # unset: the routers' choice
        # The default is read through conf.settings, not beside it.
        monkeypatch.setattr(Settings, "DATABASE", "default")
        assert options_database({}) == "default"


def test_check__listen_database_must_name_something() -> None:
    options = {"DATABASE": "default", "LISTEN_DATABASE": "nowhere"}
    with override_settings(TASKS={"default": {"BACKEND": PGQUEUE, "OPTIONS": options}}):
        messages = task_backends["default"].check()
    assert [m.id for m in messages] == ["pgqueue.E052"]
    assert isinstance(messages[0], checks.Error)


def test_listen_target__pooled_database_polls_unless_told() -> None:
    settings_dict = connections.settings["default"]
    assert listen_target("default", {}).params is not None
    settings_dict["DISABLE_SERVER_SIDE_CURSORS"] = True
    try:
        assert listen_target("default", {}).params is None
        assert listen_target("default", {"LISTEN_DATABASE": "second"}).params is not None
        dsn = listen_target("default", {"LISTEN_DATABASE": "host=db dbname=x"})
        assert dsn.params == {"conninfo": "host=db dbname=x"}
    finally:
        settings_dict["DISABLE_SERVER_SIDE_CURSORS"] = False
    assert listen_target("default", {"LISTEN_DATABASE": None}).params is None


@pytest.mark.slow
def test_worker__backend_runs_only_its_databases_jobs(
    manage: Callable[..., ManagedProcess],
) -> None:
    """``pgqueue_worker --backend second`` drains the second database and leaves the
    default one alone; the default worker then drains the default one."""
    firsts = {int(add.enqueue(n, n).id) for n in range(5)}
    seconds = {int(add.using(backend="second").enqueue(n, n).id) for n in range(7)}
    worker = manage("pgqueue_worker", "--backend", "second", "--burst")
    assert worker.wait(60) == 0, worker.output()
    assert "database=second" in worker.output()
    assert ids("second", status="done") == seconds
    assert ids("default", status="pending") == firsts
    worker = manage("pgqueue_worker", "--burst")
    assert worker.wait(60) == 0, worker.output()
    assert ids("default", status="done") == firsts


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["raw_begin", "begin", "read_only"])
def test_worker__leak_on_another_database_fails_the_job_and_hides_no_later_write(
    manage: Callable[..., ManagedProcess], kind: str
) -> None:
    """Defect: a worker of the "second" backend checked only the jobs database's
    connection, so a task that left a transaction open on "default" (where its writes
    go) passed, and the 20 later jobs ended done with their rows never committed (lost
    when the worker exited 0). Now the leaking job fails with TransactionLeak naming
    "default", that connection is discarded, and every later job's row is committed."""
    second = "second"
    leaking = fault_tasks.leak.using(backend=second, priority=5).enqueue(kind=kind)
    later = [fault_tasks.ledger_plain.using(backend=second).enqueue(n) for n in range(20)]
    worker = manage(
        "pgqueue_worker", "--backend", second, "--burst", "--concurrency", "1",
        "--batch-size", "1", env={"PGQUEUE_RETRY_BACKOFF_BASE": "60"},
    )  # fmt: skip
    assert worker.wait(120) == 0, worker.output()
    jobs = Job.objects.using(second)
    assert {jobs.get(pk=j.id).status for j in later} == {"done"}
    ran = set(Execution.objects.values_list("job_id", flat=True).filter(kind="plain"))
    assert {int(j.id) for j in later} <= ran  # committed, seen from another connection
    failed = jobs.get(pk=leaking.id)
    assert failed.status == "scheduled"
    error = failed.errors[-1]
    assert error["exception_class_path"].endswith("TransactionLeak")
    assert "database 'default'" in error["traceback"]
    assert not Execution.objects.filter(kind="leaked").exists()


@pytest.mark.slow
def test_commands__unknown_backend_is_a_clear_error(
    manage: Callable[..., ManagedProcess],
) -> None:
    for command in ("pgqueue_worker", "pgqueue_sweep"):
        proc = manage(command, "--backend", "nope")
        assert proc.wait(30) != 0
        assert "TASKS has no backend 'nope'" in proc.output()


def test_sweeper__backend_sweeps_only_its_database(now: dt.datetime) -> None:
    """An expired lease on each database: the second backend's sweeper rescues only
    the second one's."""
    jobs = {}
    for alias in BOTH:
        job = Job.objects.db_manager(alias).enqueue(add, [1, 1], backend=alias)
        Job.objects.using(alias).filter(pk=job.pk).update(
            status="running",
            attempts=1,
            lease_owner="gone",
            lease_expires_at=now - dt.timedelta(days=3650 * 10),
        )
        jobs[alias] = job.pk
    assert Sweeper(backend="second").run_once().recovered == 1
    assert Job.objects.using("second").get(pk=jobs["second"]).status == "pending"
    assert Job.objects.using("default").get(pk=jobs["default"]).status == "running"


def test_admin__shows_each_backends_jobs(admin_client: object) -> None:
    """The job list offers one choice per backend and reads the chosen backend's
    database; a change page keeps the choice through ``_changelist_filters``."""
    add.using(queue_name="in-default").enqueue(1, 1)
    second = add.using(backend="second", queue_name="in-second").enqueue(2, 2)
    url = reverse("admin:django_pgqueue_job_changelist")
    page = admin_client.get(url).content.decode()  # type: ignore[attr-defined]
    assert "in-default" in page and "in-second" not in page and "backend=second" in page
    page = admin_client.get(url, {"backend": "second"}).content.decode()  # type: ignore[attr-defined]
    assert "in-second" in page and "in-default" not in page
    change = reverse("admin:django_pgqueue_job_change", args=[second.id])
    response = admin_client.get(change, {"_changelist_filters": "backend=second"})  # type: ignore[attr-defined]
    assert response.status_code == 200 and "in-second" in response.content.decode()


def test_admin__requeue_writes_to_the_backends_database(admin_client: object) -> None:
    job = add.using(backend="second").enqueue(3, 3)
    Job.objects.using("second").filter(pk=job.id).update(status="dead", attempts=5)
    url = reverse("admin:django_pgqueue_deadletter_changelist")
    response = admin_client.post(  # type: ignore[attr-defined]
        f"{url}?backend=second", {"action": "requeue", "_selected_action": [job.id]}
    )
    assert response.status_code == 302
    assert Job.objects.using("second").get(pk=job.id).status == "pending"


def test_worker__in_process_backend_alias(run_worker: Callable[..., object]) -> None:
    job = add.using(backend="second").enqueue(4, 4)
    worker = run_worker(backend="second")
    assert worker.alias == "second"  # type: ignore[attr-defined]
    wait_for(lambda: Job.objects.using("second").get(pk=job.id).status == "done")
    assert isinstance(task_backends["second"], PgQueueBackend)


def test_sweeper__periodic_ticks_go_to_their_backends_database(
    now: dt.datetime,
) -> None:
    """A PGQUEUE_PERIODIC entry's jobs belong to its backend (default "default"): only
    the sweepers of that backend's database enqueue them, so each tick runs once and
    lands where that backend's workers look."""
    entries = {
        "every-minute": {"task": "testproject.demo.tasks.add", "cron": "* * * * *",
                         "args": [1, 2]},
        "every-minute-second": {"task": "testproject.demo.tasks.add", "cron": "* * * * *",
                                "args": [3, 4], "backend": "second"},
    }  # fmt: skip
    with override_settings(PGQUEUE_PERIODIC=entries):
        for backend in ("second", None):
            sweeper = Sweeper(backend=backend, now=now, now_step=61)
            for _ in range(3):
                sweeper.run_once()
    in_default = Job.objects.using("default").filter(task="testproject.demo.tasks.add")
    in_second = Job.objects.using("second").filter(task="testproject.demo.tasks.add")
    assert sorted(j.args for j in in_default) == [[1, 2], [1, 2]]
    assert sorted((j.args, j.backend) for j in in_second) == [([3, 4], "second")] * 2


def test_status__backend_reports_its_databases_queues() -> None:
    from io import StringIO

    from django.core.management import call_command

    add.using(queue_name="in-default").enqueue(1, 1)
    add.using(backend="second", queue_name="in-second").enqueue(2, 2)
    out = StringIO()
    call_command("pgqueue_status", "--json", "--backend", "second", stdout=out)
    assert "in-second" in out.getvalue() and "in-default" not in out.getvalue()
    out = StringIO()
    call_command("pgqueue_status", "--json", stdout=out)
    assert "in-default" in out.getvalue() and "in-second" not in out.getvalue()
