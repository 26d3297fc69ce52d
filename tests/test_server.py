"""The PostgreSQL floor: migrate, the worker and the sweeper refuse an older server.

An old server is faked by setting ``pg_version`` (the server's ``server_version_num``,
which Django caches on the connection) on the default connection: it is the only thing
``django_pgqueue.server.check_server_version`` reads."""

from __future__ import annotations

import logging

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, connections

from django_pgqueue.exceptions import UnsupportedServerError
from django_pgqueue.models import Job
from django_pgqueue.server import MIN_SERVER_VERSION_NUM, check_server_version, version_text

OLD = 130012  # PostgreSQL 13.12
REFUSED = "django-pgqueue needs PostgreSQL 14 or later; database 'default' is on PostgreSQL 13.12"


@pytest.fixture
def old_server(monkeypatch):
    monkeypatch.setattr(connections["default"], "pg_version", OLD)
    # The commands set the package logger's level from --verbosity: restore it for the
    # tests that follow (setLevel also clears the loggers' level cache).
    logger = logging.getLogger("django_pgqueue")
    level = logger.level
    yield
    logger.setLevel(level)


@pytest.mark.parametrize(
    ("num", "text"), [(130012, "13.12"), (150004, "15.4"), (180000, "18.0"), (90605, "9.6.5")]
)
def test_version_text__reads_like_the_release(num, text):
    assert version_text(num) == text


@pytest.mark.django_db
def test_check_server_version__accepts_this_server():
    assert connections["default"].pg_version >= MIN_SERVER_VERSION_NUM
    check_server_version("default")  # raises if not


@pytest.mark.django_db
def test_check_server_version__refuses_below_14_naming_both_versions(old_server):
    with pytest.raises(UnsupportedServerError, match=REFUSED):
        check_server_version("default")


@pytest.mark.django_db
def test_check_server_version__accepts_exactly_14(monkeypatch):
    monkeypatch.setattr(connections["default"], "pg_version", MIN_SERVER_VERSION_NUM)
    check_server_version("default")


@pytest.mark.django_db
def test_migrate__stops_before_changing_anything(old_server):
    # Unapplying every migration of the app would drop the jobs table: it must not start.
    with pytest.raises(CommandError, match=REFUSED):
        call_command("migrate", "django_pgqueue", "zero", verbosity=0)
    assert "pgqueue_job" in connection.introspection.table_names()


@pytest.mark.django_db
@pytest.mark.parametrize("command", ["pgqueue_worker", "pgqueue_sweep"])
def test_command__stops_on_an_old_server_and_touches_no_job(old_server, job_factory, command):
    job = job_factory()
    args = ["--burst"] if command == "pgqueue_worker" else []
    with pytest.raises(CommandError, match=REFUSED):
        call_command(command, *args, verbosity=0)
    job.refresh_from_db()
    assert (job.status, job.attempts) == ("pending", 0)
    assert Job.objects.count() == 1
