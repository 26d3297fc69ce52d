"""Real ``manage.py`` processes: a worker runs jobs, stops cleanly on a signal, and a
SIGKILLed worker's job is recovered by the sweeper and finished by another worker."""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path

import pytest
from django.db import connection

from django_pgqueue.models import Job
from testproject.demo import tasks
from tests.conftest import wait_for
from tests.tasks import sleep_after_marking

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

WORKER = ("pgqueue_worker", "--poll-interval", "0.1", "--lease-seconds", "1")


def fresh(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def lease_expired(job: Job) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT lease_expires_at < clock_timestamp() FROM pgqueue_job WHERE id = %s",
            [job.pk],
        )
        return bool(cursor.fetchone()[0])


def test_process__worker_runs_jobs_and_exits_0_on_sigterm(job_factory, manage):
    jobs = [job_factory(args=[n, 1]) for n in range(5)]
    worker = manage(*WORKER, "--concurrency", "2", "--worker-id", "proc-1")
    wait_for(lambda: Job.objects.filter(status="done").count() == 5, timeout=30)
    # Work enqueued while it idles is picked up too.
    late = job_factory(args=[10, 10])
    wait_for(lambda: fresh(late).status == "done", timeout=10)
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output()
    rows = [fresh(j) for j in jobs]
    assert [r.result for r in rows] == [1, 2, 3, 4, 5]
    assert {r.lease_owner for r in rows} == {"proc-1"}
    assert fresh(late).result == 20
    assert "done in" in worker.output()  # one INFO line per job


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_process__signal_lets_the_running_job_finish_then_exits_0(
    job_factory, manage, tmp_path, sig
):
    marker = tmp_path / "started"
    slow = job_factory(task=sleep_after_marking, args=[str(marker), 1.5], priority=10)
    waiting = job_factory()  # lower priority: still queued when the signal comes
    worker = manage(*WORKER, "--concurrency", "1")
    # The task body is running (a claimed job not yet started would be released).
    wait_for(marker.exists, timeout=20)
    worker.signal(sig)
    assert worker.wait(timeout=20) == 0, worker.output()
    row = fresh(slow)
    assert (row.status, row.result, row.attempts) == ("done", 1.5, 1), worker.output()
    assert (fresh(waiting).status, fresh(waiting).attempts) == ("pending", 0)
    assert f"{signal.Signals(sig).name} received" in worker.output()


def test_process__second_signal_aborts_at_once(job_factory, manage, tmp_path):
    marker = tmp_path / "started"
    slow = job_factory(task=sleep_after_marking, args=[str(marker), 30])
    worker = manage(*WORKER)
    wait_for(marker.exists, timeout=20)
    worker.signal(signal.SIGTERM)
    wait_for(lambda: "SIGTERM received" in worker.output(), timeout=10)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=10) == 1, worker.output()
    # The job was not finished; its lease will expire and the sweeper recovers it.
    assert fresh(slow).status == "running"


def test_process__sigkilled_workers_job_is_recovered_and_finished(job_factory, manage):
    job = job_factory(task=tasks.slow, args=[1.5], max_attempts=3)
    first = manage(*WORKER, "--worker-id", "doomed")
    wait_for(lambda: fresh(job).lease_owner == "doomed", timeout=20)
    first.signal(signal.SIGKILL)
    assert first.wait() == -signal.SIGKILL

    # Nobody extends the lease now; once it has expired the sweeper takes it back.
    wait_for(lambda: lease_expired(job), timeout=10)
    sweep = manage("pgqueue_sweep")
    assert sweep.wait() == 0, sweep.output()
    assert "recovered=1 dead=0" in sweep.output()
    row = fresh(job)
    assert (row.status, row.lease_owner, row.attempts) == ("pending", None, 1)
    assert row.errors[-1]["worker_id"] == "doomed"

    second = manage(*WORKER, "--worker-id", "rescuer", "--burst")
    assert second.wait(timeout=30) == 0, second.output()
    row = fresh(job)
    assert (row.status, row.result, row.attempts, row.lease_owner) == (
        "done",
        1.5,
        2,
        "rescuer",
    )
    assert [e["exception_class_path"] for e in row.errors] == [
        "django_pgqueue.exceptions.LeaseExpired"
    ]


def test_process__sweep_loop_exits_0_on_sigterm(job_factory, manage):
    job_factory(max_attempts=3)
    (job,) = Job.objects.claim("gone", limit=1, lease_seconds=0.01)
    sweeper = manage("pgqueue_sweep", "--loop", "--interval", "0.1")
    # Its first pass recovers the expired lease: by then the loop (and its handlers) run.
    wait_for(lambda: fresh(job).status == "pending", timeout=20)
    wait_for(lambda: "sweep: recovered=1" in sweeper.output(), timeout=10)
    sweeper.signal(signal.SIGTERM)
    assert sweeper.wait(timeout=10) == 0, sweeper.output()


# --- Reliability III: early signals, SIGHUP, a burst run against a dead database ----------


def catches_sigterm(pid: int) -> bool:
    """Whether ``pid`` has a handler for SIGTERM (its SigCgt mask in /proc)."""
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(next(line for line in status.splitlines() if line.startswith("SigCgt:"))[7:], 16)
    return bool(mask & (1 << (signal.SIGTERM - 1)))


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.1, 0.2, 0.3, 0.5])
def test_process__sigterm_during_start_up_exits_0(manage, delay):
    worker = manage(*WORKER)
    # From django_pgqueue's import on (while Django sets up, before the worker runs): a
    # signal before that, while Python imports Django, is out of the package's reach.
    wait_for(lambda: catches_sigterm(worker.pid), timeout=30, interval=0.001)
    time.sleep(delay)  # the moment to signal, not a wait for a condition
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output()


def test_process__sighup_lets_the_running_job_finish_then_exits_0(job_factory, manage, tmp_path):
    marker = tmp_path / "started"
    slow = job_factory(task=sleep_after_marking, args=[str(marker), 1.5])
    worker = manage(*WORKER)
    wait_for(marker.exists, timeout=20)
    worker.signal(signal.SIGHUP)
    assert worker.wait(timeout=20) == 0, worker.output()
    assert (fresh(slow).status, fresh(slow).result) == ("done", 1.5)
    assert "SIGHUP received" in worker.output()


def closed_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("processes", ["1", "2"])
def test_process__burst_gives_up_on_an_unreachable_database(manage, processes):
    url = f"postgres://postgres@127.0.0.1:{closed_port()}/pgqueue_nowhere"
    began = time.monotonic()
    worker = manage(
        *WORKER,
        "--burst",
        "--processes",
        processes,
        env={"DATABASE_URL": url, "PGQUEUE_BURST_CONNECT_TIMEOUT": "3"},
    )
    assert worker.wait(timeout=60) == 3, worker.output()
    assert time.monotonic() - began < 30
    output = worker.output()
    assert "still failing after 3s of retries" in output, output
    assert "'default' (pgqueue_nowhere on 127.0.0.1:" in output
    assert "giving up (--burst: PGQUEUE_BURST_CONNECT_TIMEOUT)" in output
    assert "Traceback" not in output


def test_process__sigterm_while_the_start_up_checks_wait_exits_0(manage):
    """A worker whose start-up is held up (its first connection, the server check,
    waits on a server that accepted the socket but says nothing) gets SIGTERM there:
    once the check fails and the worker starts, it stops at once and exits 0."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"postgres://postgres@127.0.0.1:{silent.getsockname()[1]}/pgqueue_nowhere"
        worker = manage(*WORKER, env={"DATABASE_URL": url})
        silent.settimeout(60)
        held, _ = silent.accept()  # the worker is in its start-up checks now
        worker.signal(signal.SIGTERM)
        time.sleep(0.2)  # let the signal land while the check still waits
    held.close()  # the check fails; the rest of the start-up finds the port closed
    assert worker.wait(timeout=30) == 0, worker.output()
    assert "SIGTERM received" in worker.output()
