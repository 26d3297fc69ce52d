"""Workflows run by real worker processes: results passed along, each step after the
ones it waits for (database time), a callback exactly once, a dead parent's dependant
never run; and groups under SIGKILLed workers (bench.workflows' chaos, CI-sized)."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from io import BytesIO
from typing import Any

import pytest

import bench.workflows as workflows_bench
from django_pgqueue import chain, group, step
from django_pgqueue.models import Job
from testproject.demo import fault_tasks
from testproject.demo.models import Execution
from testproject.demo.tasks import add
from tests import tasks
from tests.conftest import REPO, test_database_url, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

WORKER = ("pgqueue_worker", "--concurrency", "4", "--poll-interval", "0.1", "--lease-seconds", "5")


def rows(*jobs: Any) -> list[Job]:
    found = {j.id: j for j in Job.objects.filter(pk__in=[j.id for j in jobs])}
    return [found[j.id] for j in jobs]


def test_process__workflows_run_in_order_pass_results_and_stop_at_a_dead_parent(manage):
    steps = chain(step(add, 1, 2), step(tasks.double), step(tasks.double)).enqueue()
    members_and_callback = group(
        *[step(fault_tasks.ledger_member, n) for n in range(20)],
        then=step(fault_tasks.ledger_sum),
    ).enqueue()
    first = Job.objects.enqueue(tasks.sleep_after_marking, ["/dev/null", 0.3])
    second = Job.objects.enqueue(add, [2, 2])
    both = Job.objects.enqueue(fault_tasks.ledger_member, [7], depends_on=[first, second])
    doomed = chain(step(tasks.fails_for_good), step(fault_tasks.ledger_member, 99)).enqueue()
    anyway = group(
        step(add, 20, 1),
        step(tasks.fails_for_good),
        then=tasks.parents_seen,
        on_parent_failure="run",
    ).enqueue()
    everything = [*steps, *members_and_callback, first, second, both, *doomed, *anyway]

    workers = [manage(*WORKER), manage(*WORKER)]
    wait_for(
        lambda: (
            not Job.objects.filter(
                pk__in=[j.id for j in everything],
                status__in=("pending", "scheduled", "running", "waiting"),
            ).exists()
        ),
        timeout=60,
    )
    for worker in workers:
        worker.signal(15)
    for worker in workers:
        assert worker.wait() == 0, worker.output()

    # A chain of three passes results along, each step started after the one before
    # finished (database time: the completion's and the claim's clock_timestamp()).
    done = rows(*steps)
    assert [j.result for j in done] == [3, 6, 12]
    assert [j.args for j in done] == [[1, 2], [3], [6]]
    for before, after in zip(done, done[1:], strict=False):
        assert after.started_at > before.finished_at

    # A group of 20: its callback ran once, after every member, with every result.
    *members, callback = rows(*members_and_callback)
    assert {m.status for m in members} == {"done"}
    assert (callback.status, callback.result) == ("done", sum(range(20)))
    assert callback.args == [list(range(20))]
    assert callback.started_at > max(m.finished_at for m in members)
    assert Execution.objects.filter(job_id=callback.id, kind="tx").count() == 1

    # Two parents: started after both.
    waited, a, b = rows(both, first, second)
    assert waited.status == "done"
    assert waited.started_at > max(a.finished_at, b.finished_at)

    # A dead parent: its dependant is cancelled, naming it, and never ran.
    dead, cancelled = rows(*doomed)
    assert dead.status == "dead"
    assert cancelled.status == "cancelled" and cancelled.started_at is None
    assert f"parent job {dead.id} ended dead" in cancelled.errors[-1]["traceback"]
    assert not Execution.objects.filter(job_id=cancelled.id).exists()

    # on_parent_failure="run": released anyway, None for the dead member, and
    # current_job().parents() says which parent ended how.
    good, bad, reader = rows(*anyway)
    assert (good.status, bad.status, reader.status) == ("done", "dead", "done")
    assert reader.result == {
        "values": [21, None],
        "parents": [[good.id, "done", 21], [bad.id, "dead", None]],
        "errors": [None, "builtins.RuntimeError"],
    }


def test_process__every_callback_runs_once_with_workers_sigkilled(monkeypatch):
    """bench.workflows' chaos run, CI-sized: groups of 10 with a transactional callback,
    three workers and a sweeper, a worker SIGKILLed (and replaced) every ~0.5 s until
    every callback finished; nothing may be left waiting, no callback may run twice or
    get the wrong results (the full-size run is in bench/README.md)."""
    monkeypatch.setenv("DATABASE_URL", test_database_url())
    verdict = workflows_bench.chaos(
        groups=40, members=10, workers=3, kill_every=0.5, seed=5, work_ms=60, timeout=120
    )
    print("chaos verdict:", verdict)
    assert verdict["kills"] >= 3, verdict
    assert {name: verdict[name] for name in workflows_bench.MUST_BE_ZERO} == dict.fromkeys(
        workflows_bench.MUST_BE_ZERO, 0
    ), verdict


#: A commit of the release before workflows (its migrations end at 0008): what a fleet
#: still runs during a rolling upgrade to this one.
PREVIOUS_RELEASE = "4fe7d6b"


def test_process__a_rolling_upgrades_old_worker_strands_nothing(manage, tmp_path):
    """Issue 28 item 14, with a real worker of the previous release (its source taken
    from git) on the migrated database: it runs the chain's first step and the group's
    members without releasing what waits on them (it knows nothing of dependants); the
    new sweeper releases them, and a new worker finishes every workflow: nothing is
    left waiting."""
    archived = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", PREVIOUS_RELEASE],
        capture_output=True,
    )
    if archived.returncode != 0:
        pytest.skip(f"no commit {PREVIOUS_RELEASE} in this clone (shallow?)")
    old = tmp_path / "previous"
    with tarfile.open(fileobj=BytesIO(archived.stdout)) as tar:
        tar.extractall(old, filter="data")
    steps = chain(step(add, 1, 2), step(add, 10)).enqueue()
    album = group(step(add, 1, 1), step(add, 2, 2), then=step(tasks.total)).enqueue()
    env = {**os.environ, "DATABASE_URL": test_database_url(), "PYTHONPATH": str(old)}
    log = tmp_path / "previous-worker.log"
    with log.open("w") as out:
        code = subprocess.run(
            [sys.executable, str(old / "testproject" / "manage.py"), "pgqueue_worker",
             "--burst", "--worker-id", "w-previous"],
            env=env, cwd=old, stdout=out, stderr=subprocess.STDOUT, timeout=60,
        ).returncode  # fmt: skip
    assert code == 0, log.read_text()
    firsts = [steps[0], album[0], album[1]]
    assert {(r.status, r.lease_owner) for r in rows(*firsts)} == {("done", "w-previous")}
    assert [r.status for r in rows(steps[1], album[2])] == ["waiting", "waiting"]  # stranded
    sweeper = manage("pgqueue_sweep")  # one pass of the new release
    assert sweeper.wait(60) == 0, sweeper.output()
    assert [r.status for r in rows(steps[1], album[2])] == ["pending", "pending"]
    worker = manage("pgqueue_worker", "--burst")
    assert worker.wait(60) == 0, worker.output()
    assert [(r.status, r.result) for r in rows(steps[1], album[2])] == [("done", 13), ("done", 6)]
    assert not Job.objects.filter(status="waiting").exists()
