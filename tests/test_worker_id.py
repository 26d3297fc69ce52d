"""Issue 28, item 7, with real ``pgqueue_worker`` processes: a ``--worker-id`` held by a
live process was not detected. Two new workers given the ids of two draining ones (a
StatefulSet's new pods) took their rows and deleted them on exit: status said "Workers:
0 live" while jobs ran. Now a second live process is refused at start, and a worker
deletes (and refreshes) only its own row, not one another process took over."""

from __future__ import annotations

import signal

import pytest

from django_pgqueue import monitoring
from django_pgqueue.worker import presence
from tests.conftest import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

WORKER = ("pgqueue_worker", "--poll-interval", "0.1", "--lease-seconds", "1")


def row(worker_id: str) -> monitoring.WorkerInfo | None:
    return next((w for w in monitoring.workers() if w.id == worker_id), None)


def test_worker_id__a_second_live_process_is_refused_at_start(manage):
    first = manage(*WORKER, "--worker-id", "dup-1")
    wait_for(lambda: (r := row("dup-1")) and r.pid == first.pid, timeout=30)
    second = manage(*WORKER, "--worker-id", "dup-1")
    assert second.wait(30) == 3, second.output()  # ExitCode.FATAL: restart it later
    out = second.output()
    assert "worker id 'dup-1' is held by the worker process" in out, out
    assert f"process {first.pid} on " in out, out
    assert row("dup-1").pid == first.pid  # untouched, and still refreshed
    assert first.popen.poll() is None, first.output()
    first.signal(signal.SIGTERM)
    assert first.wait(30) == 0, first.output()
    assert row("dup-1") is None  # its own row: deleted at exit


def test_worker_id__a_worker_deletes_only_its_own_row(manage):
    """The first worker is cut off (SIGSTOP) past its 1 s lease: its row is lost, and
    a second process takes the id over. The first, resumed and stopped, leaves the
    second's row alone; the second deletes it at exit."""
    first = manage(*WORKER, "--worker-id", "dup-2")
    wait_for(lambda: (r := row("dup-2")) and r.pid == first.pid, timeout=30)
    first.signal(signal.SIGSTOP)
    try:
        wait_for(lambda: row("dup-2").lost, timeout=10)
        second = manage(*WORKER, "--worker-id", "dup-2")
        taken = wait_for(lambda: (r := row("dup-2")) and r.pid == second.pid and r, timeout=30)
    finally:
        first.signal(signal.SIGCONT)
    first.signal(signal.SIGTERM)
    assert first.wait(30) == 0, first.output()
    # The same row: not deleted (the second would register again at its next beat, as
    # a row of a later start).
    kept = row("dup-2")
    assert kept is not None and kept.pid == second.pid and not kept.lost
    assert kept.started_at == taken.started_at, (taken, kept)
    assert second.popen.poll() is None, second.output()
    second.signal(signal.SIGTERM)
    assert second.wait(30) == 0, second.output()
    assert row("dup-2") is None


def test_presence__register_takes_over_a_dead_local_holder():
    """A row of this host whose process is gone (a restart with a fixed id, before the
    old row is lost) is taken over at once; one of a live process elsewhere is not."""
    import os
    import subprocess
    import sys

    from django_pgqueue.models import WorkerProcess

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    assert (
        presence.register("default", "fixed-1", queues=None, concurrency=1, lease_seconds=60)
        is None
    )
    WorkerProcess.objects.filter(id="fixed-1").update(instance="old", pid=int(gone.stdout))
    try:
        assert (
            presence.register("default", "fixed-1", queues=None, concurrency=2, lease_seconds=60)
            is None
        )
        assert row("fixed-1").pid == os.getpid() and row("fixed-1").concurrency == 2
        WorkerProcess.objects.filter(id="fixed-1").update(instance="other", hostname="elsewhere")
        refused = presence.register(
            "default", "fixed-1", queues=None, concurrency=3, lease_seconds=60
        )
        assert refused is not None and "on elsewhere, last seen" in refused
        assert row("fixed-1").concurrency == 2  # nothing written
    finally:
        WorkerProcess.objects.filter(id="fixed-1").delete()
        presence.unregister("fixed-1")
