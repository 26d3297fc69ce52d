"""``manage.py pgqueue_status``: the table, the ``--json`` contract, ``--watch`` and the
``--check`` exit codes."""

from __future__ import annotations

import datetime as dt
import io
import json
import signal
import time

import pytest
from django.core.management import CommandError, call_command

from django_pgqueue.management.commands.pgqueue_status import age
from django_pgqueue.models import Job
from django_pgqueue.worker import presence
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def status(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = 0
    try:
        call_command("pgqueue_status", *args, stdout=out, stderr=err)
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def backlog(job_factory):
    """Two queues: 'mail' with 3 pending jobs (the oldest due 2 minutes ago) and 'web'
    with one dead letter; one live worker."""
    old = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=2)
    for _ in range(3):
        job_factory(queue="mail", run_at=old)
    dead = job_factory(queue="web")
    Job.objects.filter(pk=dead.pk).update(status="dead", finished_at=old)
    presence.register("default", "host:9:w", queues=None, concurrency=4, lease_seconds=60)
    yield
    presence.unregister("host:9:w")


def test_age__reads_at_a_glance():
    assert [age(None), age(0.25), age(42), age(185), age(7800)] == [
        "—",
        "250 ms",
        "42 s",
        "3 min 5 s",
        "2 h 10 min",
    ]


def test_status__table_shows_queues_and_workers(backlog):
    code, out, _ = status()
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == [
        "queue",
        "pending",
        "scheduled",
        "waiting",
        "running",
        "dead",
        "done/5m",
        "failed/5m",
        "cancelled/5m",
        "finished/s",
        "oldest",
        "pending",
    ]
    mail = next(line for line in lines if line.startswith("mail"))
    assert mail.split()[:6] == ["mail", "3", "0", "0", "0", "0"]
    assert "2 min" in mail
    assert next(line for line in lines if line.startswith("web")).split()[5] == "1"
    assert "Workers: 1 live" in out
    assert "host:9:w" in out


def test_status__json_contract(backlog):
    code, out, _ = status("--json")
    data = json.loads(out)
    assert code == 0
    mail = data["queues"]["mail"]
    for key in (
        "pending",
        "scheduled",
        "waiting",
        "running",
        "dead",
        "oldest_pending_age_seconds",
    ):
        assert key in mail
    assert mail["cancelled_5m"] == 0
    assert (mail["pending"], data["queues"]["web"]["dead"]) == (3, 1)
    assert 119 < mail["oldest_pending_age_seconds"] < 300
    (worker,) = data["workers"]
    assert (worker["id"], worker["concurrency"], worker["state"]) == ("host:9:w", 4, "live")


@pytest.mark.parametrize(
    ("args", "code", "named"),
    [
        (("--max-latency", "300", "--max-dead", "1", "--min-workers", "1"), 0, []),
        (
            (
                "--max-latency",
                "60",
            ),
            1,
            ["queue 'mail': oldest pending job waited"],
        ),
        (
            (
                "--max-dead",
                "0",
            ),
            1,
            ["queue 'web': 1 dead jobs (max 0)"],
        ),
        (
            (
                "--min-workers",
                "2",
            ),
            1,
            ["1 live workers (min 2)"],
        ),
        (
            ("--max-latency", "1", "--max-dead", "0", "--min-workers", "3"),
            1,
            ["queue 'mail'", "queue 'web'", "1 live workers (min 3)"],
        ),
    ],
    ids=["all-ok", "latency", "dead", "workers", "all-three"],
)
def test_status_check__exit_code_names_what_is_over(backlog, args, code, named):
    got, out, err = status("--check", *args)
    assert got == code, err
    for text in named:
        assert text in err
    assert ("OK" in out) == (code == 0)


def test_status_check__a_lost_worker_does_not_count(backlog):
    from django_pgqueue.models import WorkerProcess

    WorkerProcess.objects.update(last_seen_at=dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
    code, _, err = status("--check", "--min-workers", "1")
    assert code == 1 and "0 live workers (min 1)" in err


def test_status__thresholds_need_check():
    code, _, err = status("--max-dead", "3")
    assert code == 2 and "--max-dead needs --check" in err


@pytest.mark.slow
def test_status_watch__redraws_until_interrupted(backlog, manage):
    proc = manage("pgqueue_status", "--watch", "0.1", "--json")
    wait_for(lambda: proc.output().count("\n") >= 3, timeout=20)
    proc.signal(signal.SIGINT)
    assert proc.wait(timeout=10) == 0, proc.output()
    snapshots = [json.loads(line) for line in proc.output().splitlines() if line.startswith("{")]
    assert len(snapshots) >= 3
    assert all(s["queues"]["mail"]["pending"] == 3 for s in snapshots)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["--check", "--json", "table"])
def test_status__locked_jobs_table_gives_up_within_its_timeout(
    backlog, manage, other_connection, mode
):
    """With pgqueue_job locked by another connection, the probe used to wait for the
    lock (over 30 s); now it exits 3 with one line after --timeout."""
    locker = other_connection()
    locker.execute("LOCK TABLE pgqueue_job IN ACCESS EXCLUSIVE MODE")  # held until rollback
    args = [] if mode == "table" else [mode]
    started = time.monotonic()
    proc = manage("pgqueue_status", *args, "--timeout", "1")
    assert proc.wait(timeout=20) == 3, proc.output()
    elapsed = time.monotonic() - started
    lines = proc.output().strip().splitlines()
    assert lines == [
        "CommandError: database 'default' did not answer within 1 s (statement timeout: "
        "a lock on a table it reads, or an overloaded server)"
    ], proc.output()
    assert elapsed < 15, elapsed
    locker.rollback()
    proc = manage("pgqueue_status", *args, "--timeout", "1")
    assert proc.wait(timeout=30) == 0, proc.output()


def test_status__timeout_leaves_nothing_on_the_connection(backlog):
    """The bound is SET LOCAL: after the command the connection's own is back."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW statement_timeout")
        before = cursor.fetchone()
    assert status("--json", "--timeout", "2")[0] == 0
    with connection.cursor() as cursor:
        cursor.execute("SHOW statement_timeout")
        assert cursor.fetchone() == before


def test_status__timeout_out_of_range_is_a_usage_error():
    with pytest.raises(CommandError, match="--timeout"):
        call_command("pgqueue_status", "--timeout", "0")
