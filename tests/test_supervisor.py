"""``pgqueue_worker --processes N`` as real processes: the supervisor starts N workers,
restarts one that is SIGKILLed, drains them all on SIGTERM, and says in its exit code
what happened."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest
from django.db import connection
from django.db.models.functions import Now

from django_pgqueue.models import Job
from django_pgqueue.worker.supervisor import ExitCode, describe_exit
from tests.conftest import ManagedProcess, wait_for
from tests.tasks import sleep_after_marking

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

WORKER = ("pgqueue_worker", "--poll-interval", "0.1", "--lease-seconds", "2")
STARTED = re.compile(r"worker process (\d+) started \(pid (\d+)\)")


def children(proc: ManagedProcess) -> dict[int, int]:
    """Slot -> pid of the newest child the supervisor says it started in that slot."""
    return {int(slot): int(pid) for slot, pid in STARTED.findall(proc.output())}


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def claim_connections() -> set[str]:
    """application_name of every worker's claim connection (``pgqueue claim <id>``)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT application_name FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name LIKE 'pgqueue claim %%'"
        )
        return {row[0] for row in cursor.fetchall()}


def fresh(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def test_supervisor__sigkilled_child_is_restarted_and_jobs_still_finish(job_factory, manage):
    sup = manage(*WORKER, "--processes", "2", "--concurrency", "2")
    pids = wait_for(lambda: len(children(sup)) == 2 and children(sup), timeout=30)
    # Each child is a full worker: it has its own claim connection, named after its pid.
    wait_for(lambda: len(claim_connections()) == 2, timeout=30)
    victim = pids[1]
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: "died after" in sup.output(), timeout=10)
    assert "(killed by SIGKILL); restarting in" in sup.output(), sup.output()
    replacement = wait_for(lambda: children(sup)[1] != victim and children(sup)[1], timeout=20)
    assert alive(replacement) and not alive(victim)
    assert children(sup)[2] == pids[2]  # the other child was left alone
    wait_for(lambda: any(f":{replacement}:" in name for name in claim_connections()), timeout=30)
    jobs = [job_factory(args=[n, 1]) for n in range(20)]
    wait_for(lambda: Job.objects.filter(status="done").count() == 20, timeout=30)
    assert sorted(fresh(j).result for j in jobs) == list(range(1, 21))
    sup.signal(signal.SIGTERM)
    assert sup.wait() == ExitCode.OK, sup.output()


def test_supervisor__sigterm_drains_every_child_then_exits_0(job_factory, manage, tmp_path):
    markers = [tmp_path / f"started-{n}" for n in range(2)]
    running = [
        job_factory(task=sleep_after_marking, args=[str(m), 1.5], priority=10) for m in markers
    ]
    waiting = job_factory()  # lower priority: nobody is free to claim it before SIGTERM
    sup = manage(*WORKER, "--processes", "2", "--concurrency", "1", "--worker-id", "sup")
    # One job in each child (concurrency 1, and a child claims one job at a time).
    wait_for(lambda: all(m.exists() for m in markers), timeout=30)
    pids = children(sup)
    sup.signal(signal.SIGTERM)
    assert sup.wait(timeout=30) == ExitCode.OK, sup.output()
    rows = [fresh(j) for j in running]
    assert [(r.status, r.result, r.attempts) for r in rows] == [("done", 1.5, 1)] * 2
    # Distinct worker ids: the given one plus the child's slot.
    assert sorted(r.lease_owner for r in rows) == ["sup:1", "sup:2"]
    assert (fresh(waiting).status, fresh(waiting).attempts) == ("pending", 0)
    assert not any(alive(pid) for pid in pids.values())
    assert "SIGTERM received: stopping 2 worker processes" in sup.output()
    assert sup.output().count("stopped (exit code 0)") == 2, sup.output()
    assert "died after" not in sup.output()


def test_supervisor__second_signal_aborts_children_and_exits_1(job_factory, manage, tmp_path):
    marker = tmp_path / "started"
    slow = job_factory(task=sleep_after_marking, args=[str(marker), 30])
    sup = manage(*WORKER, "--processes", "2")
    wait_for(marker.exists, timeout=30)
    pids = children(sup)
    sup.signal(signal.SIGINT)
    wait_for(lambda: "SIGINT received" in sup.output(), timeout=10)
    sup.signal(signal.SIGINT)
    assert sup.wait(timeout=20) == ExitCode.ABORTED, sup.output()
    assert not any(alive(pid) for pid in pids.values())
    # Not finished: its lease will expire and the sweeper recovers it.
    assert fresh(slow).status == "running"


def test_supervisor__child_dying_during_the_drain_exits_4(job_factory, manage, tmp_path):
    marker = tmp_path / "started"
    job_factory(task=sleep_after_marking, args=[str(marker), 3])
    sup = manage(*WORKER, "--processes", "2", "--concurrency", "1")
    wait_for(marker.exists, timeout=30)
    sup.signal(signal.SIGTERM)
    wait_for(lambda: "SIGTERM received" in sup.output(), timeout=10)
    busy = next(
        pid
        for pid in children(sup).values()
        if alive(pid) and Job.objects.filter(lease_owner__contains=f":{pid}:").exists()
    )
    os.kill(busy, signal.SIGKILL)
    assert sup.wait(timeout=30) == ExitCode.UNCLEAN, sup.output()
    assert "stopped (killed by SIGKILL)" in sup.output()
    assert "restarting" not in sup.output()  # nothing is restarted once stopping


def test_supervisor__burst_children_finish_and_it_exits_0(job_factory, manage):
    jobs = [job_factory(args=[n, 0]) for n in range(10)]
    sup = manage(*WORKER, "--processes", "2", "--burst")
    assert sup.wait(timeout=60) == ExitCode.OK, sup.output()
    assert [fresh(j).status for j in jobs] == ["done"] * 10
    assert sup.output().count("finished its work") == 2, sup.output()


def test_describe_exit__names_the_signal_or_the_code():
    assert describe_exit(-signal.SIGKILL) == "killed by SIGKILL"
    assert describe_exit(3) == "exit code 3"


# --- Reliability III: a worker never outlives its supervisor; shutdown is bounded -------


def marked_processes(mark: str) -> set[int]:
    """Pids of live processes started with ``PGQUEUE_TEST_MARK=<mark>`` in their
    environment: the supervisor and every child it forked, logged or not."""
    found = set()
    needle = f"PGQUEUE_TEST_MARK={mark}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0") and alive(int(entry.name)):
            found.add(int(entry.name))
    return found


@pytest.mark.parametrize("moment", ["right-after-fork", "children-started", "job-running"])
def test_supervisor__sigkilled_supervisor_leaves_no_worker_behind(
    job_factory, manage, tmp_path, moment
):
    marker = tmp_path / "started"
    slow = job_factory(task=sleep_after_marking, args=[str(marker), 30], priority=10)
    quick = [job_factory(args=[n, 1]) for n in range(10)]
    mark = f"{os.getpid()}-{moment}"
    sup = manage(
        *WORKER, "--processes", "2", "--stop-seconds", "3", env={"PGQUEUE_TEST_MARK": mark}
    )
    try:
        if moment == "right-after-fork":
            wait_for(lambda: STARTED.search(sup.output()), timeout=30, interval=0.001)
        elif moment == "children-started":
            wait_for(lambda: len(claim_connections()) == 2, timeout=30)
        else:
            wait_for(marker.exists, timeout=30)
        sup.signal(signal.SIGKILL)
        assert sup.wait() == -signal.SIGKILL
        # Every child exits on its own: at once if idle, within --stop-seconds if busy.
        wait_for(lambda: not marked_processes(mark), timeout=20)
    finally:
        for pid in marked_processes(mark):
            os.kill(pid, signal.SIGKILL)
    # No job is lost: whatever a child left running comes back through the sweeper.
    wait_for(lambda: not Job.objects.filter(status="running", lease_expires_at__gt=Now()).exists())
    sweep = manage("pgqueue_sweep")
    assert sweep.wait() == 0, sweep.output()
    assert not Job.objects.filter(status="running").exists()
    assert {fresh(j).status for j in quick} <= {"done", "pending"}
    assert fresh(slow).status == "pending"  # never finished; never lost


def test_supervisor__stopped_child_does_not_block_the_shutdown(manage):
    sup = manage(*WORKER, "--processes", "2")
    wait_for(lambda: len(claim_connections()) == 2, timeout=30)
    stuck = children(sup)[1]
    os.kill(stuck, signal.SIGSTOP)
    sup.signal(signal.SIGTERM)
    # The supervisor sends SIGCONT with the SIGTERM: the child wakes, drains, exits.
    assert sup.wait(timeout=20) == ExitCode.OK, sup.output()
    assert not alive(stuck)


def test_supervisor__child_still_running_past_stop_seconds_is_killed(
    job_factory, manage, tmp_path
):
    marker = tmp_path / "started"
    slow = job_factory(task=sleep_after_marking, args=[str(marker), 60])
    sup = manage(*WORKER, "--processes", "2", "--stop-seconds", "2")
    wait_for(marker.exists, timeout=30)
    pids = children(sup)
    sup.signal(signal.SIGTERM)
    assert sup.wait(timeout=15) == ExitCode.UNCLEAN, sup.output()
    assert "1 worker process(es) still running 2s after the stop signal: killing" in sup.output()
    assert "stopped (killed by SIGKILL)" in sup.output()
    assert not any(alive(pid) for pid in pids.values())
    assert fresh(slow).status == "running"  # its lease expires; the sweeper recovers it


def test_supervisor__sighup_drains_like_sigterm(job_factory, manage, tmp_path):
    marker = tmp_path / "started"
    running = job_factory(task=sleep_after_marking, args=[str(marker), 1.5])
    sup = manage(*WORKER, "--processes", "2")
    wait_for(marker.exists, timeout=30)
    sup.signal(signal.SIGHUP)
    assert sup.wait(timeout=30) == ExitCode.OK, sup.output()
    assert "SIGHUP received: stopping 2 worker processes" in sup.output()
    assert (fresh(running).status, fresh(running).result) == ("done", 1.5)


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.2])
def test_supervisor__sigterm_just_after_a_fork_exits_0(manage, delay):
    sup = manage(*WORKER, "--processes", "2")
    wait_for(lambda: STARTED.search(sup.output()), timeout=30, interval=0.001)
    time.sleep(delay)  # the moment to signal, not a wait for a condition
    sup.signal(signal.SIGTERM)
    assert sup.wait(timeout=30) == ExitCode.OK, sup.output()
    assert "killed by SIGTERM" not in sup.output()
