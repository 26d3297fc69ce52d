"""``pgqueue_worker --processes N`` as real processes: the supervisor starts N workers,
restarts one that is SIGKILLed, drains them all on SIGTERM, and says in its exit code
what happened."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest
from django.db import connection

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
