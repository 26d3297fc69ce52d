"""The chaos suite, CI length: about a minute of SIGKILLs, SIGSTOPs, terminated
backends, leaking tasks and two PostgreSQL restarts on the suite's own server; nothing
may be lost. And the oracle's own tests: planted faults must each fail a run.

The full run (20,000 jobs) is ``python -m bench.chaos``; see docs/reliability.md.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from django.utils import timezone

from testkit import oracle

from .conftest import REPO


def chaos(*args: str, timeout: float = 240) -> tuple[int, dict[str, str], str, str]:
    """Run ``bench.chaos``; return its exit code, summary counts, summary line and
    stderr. A failed run keeps its logs: removed here once read."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench.chaos", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("jobs=")]
    assert lines, f"no summary line; stderr:\n{proc.stderr[-4000:]}"
    kept = re.search(r"worker logs in (\S+)/logs", proc.stderr)
    if kept and "pgqueue-chaos-" in kept.group(1):
        shutil.rmtree(Path(kept.group(1)), ignore_errors=True)
    return proc.returncode, dict(re.findall(r"(\w+)=(\S+)", lines[-1])), lines[-1], proc.stderr


@pytest.mark.slow
def test_chaos__nothing_lost_stuck_or_duplicated_transactionally() -> None:
    code, summary, line, stderr = chaos(
        "--jobs", "2000", "--duration", "30", "--drain-seconds", "60", "--seed", "7",
    )  # fmt: skip
    assert code == 0, f"{line}\n{stderr[-4000:]}"
    for name in (*oracle.MUST_BE_ZERO, *oracle.Sampler.NAMES, "oom_kills", "crashes"):
        assert summary[name] == "0", (name, line)
    assert summary["unclean_exits"] == summary["deadlocks"] == "0", line
    assert summary["pg_restarts"] == "2"
    assert int(summary["kills"]) > 0
    assert int(summary["terminated"]) > 0
    assert int(summary["samples"]) > 20  # the invariants were watched during the faults
    assert int(summary["done"]) + int(summary["dead"]) == 2000
    # Exactly the pills and the leaking tasks died; each pill ran at most its attempts.
    assert int(summary["dead"]) == 10 + int(summary["leak_jobs"])
    assert int(summary["leak_jobs"]) > 0
    assert int(summary["poison_runs"]) <= int(summary["pill_attempts"]) == 30


@pytest.mark.slow
def test_chaos__each_planted_fault_fails_the_run() -> None:
    """The oracle is tested against the harness itself: a deleted job, a duplicated
    job, a duplicated transactional effect, a row left running while locked (released
    before the end, so only the sampling sees it), a worker that aborts and one that
    dies of a SIGKILL nobody sent. Each is named in the verdict."""
    code, summary, line, stderr = chaos(
        "--jobs", "200", "--duration", "8", "--calm", "--poison", "0", "--leaks", "0",
        "--work-ms", "5", "--drain-seconds", "40",
        "--plant", "lost,dup_job,dup_effect,stuck,crash,oom",
    )  # fmt: skip
    assert code == 1, line
    failed = re.search(r"FAILED: ([\w, ]+);", stderr)
    assert failed, stderr[-4000:]
    assert set(failed.group(1).split(", ")) >= {
        "lost",
        "dup_jobs",
        "dup_tx",
        "late_leases",
        "crashes",
        "oom_kills",
    }, line
    assert (summary["lost"], summary["oom_kills"], summary["crashes"]) == ("1", "1", "1")
    assert summary["stuck"] == "0", line  # released in time: the final check alone passes


@pytest.mark.django_db(transaction=True)
def test_oracle__detects_each_violation() -> None:
    """The chaos oracle is only as good as its checks: seed one violation of each kind
    and see every counter move, judged by job identity (a deleted job and a duplicated
    one leave the totals unchanged)."""
    from django_pgqueue.models import Job
    from testproject.demo.models import Execution

    from .conftest import test_database_url

    expected: dict[int, str] = {}

    def make(kind: str, status: str, rows: int, **fields: object) -> Job:
        task = {"tx": "ledger_tx", "plain": "ledger_plain", "poison": "poison"}.get(kind, kind)
        job = Job.objects.enqueue(f"testproject.demo.fault_tasks.{task}")
        Job.objects.filter(pk=job.id).update(status=status, **fields)
        expected[job.id] = "leak" if kind == "leak" else kind
        for attempt in range(rows):
            Execution.objects.create(job_id=job.id, attempt=attempt + 1, kind=kind, worker_id="w")
        return job

    make("tx", "done", 1)  # correct
    make("plain", "done", 1)  # correct
    make("tx", "done", 2)  # dup_tx, i5
    make("tx", "scheduled", 1)  # i5 (effect without completion), stuck
    make("plain", "done", 0)  # lost effect
    make("plain", "done", 3)  # two plain duplicates
    make("plain", "done", 1, attempts=9, max_attempts=2)  # i2
    make("plain", "done", 1, lease_expires_at=timezone.now())  # i4
    make("plain", "dead", 1)  # dead_unexpected
    deleted = make("plain", "done", 1)
    copied = make("plain", "done", 1)
    Job.objects.filter(pk=deleted.id).delete()  # lost, by identity ...
    Job.objects.enqueue("testproject.demo.fault_tasks.ledger_plain")  # ... dup_jobs
    Execution.objects.create(job_id=copied.id + 10_000, attempt=1, kind="tx", worker_id="w")
    pill = make("poison", "dead", 4, attempts=3, max_attempts=3)  # 4 runs > 3 attempts
    make("leak", "done", 0)  # leak_undetected
    make("leak", "dead", 1)  # a write inside a leaked transaction committed
    Execution.objects.filter(job_id=max(expected), kind="leak").update(kind="leaked")
    result = oracle.check(test_database_url(), expected=expected, lease_seconds=2)
    assert {name: result[name] for name in oracle.MUST_BE_ZERO} == {
        "lost": 2,  # the deleted job + one done without its effect
        "dup_jobs": 2,  # a job nobody enqueued + effects of an id nobody enqueued
        "stuck": 1,
        "dup_tx": 1,
        "i1": 0,
        "i2": 1,
        "i4": 1,
        "i5": 2,
        "dead_unexpected": 1,
        "leak_undetected": 1,
        "leaked_rows": 1,
        "poison_overrun": 1,
    }
    assert result["dup_plain"] == 2
    assert result["expected"] == len(expected) and pill.id in expected


@pytest.mark.django_db(transaction=True)
def test_oracle__sample_sees_a_late_lease_and_a_finished_job_still_leased() -> None:
    """The invariants sampled during faults, one violation each."""
    import psycopg

    from django_pgqueue.models import Job

    from .conftest import test_database_url

    late = Job.objects.enqueue("testproject.demo.fault_tasks.ledger_plain")
    leased = Job.objects.enqueue("testproject.demo.fault_tasks.ledger_plain")
    Job.objects.filter(pk=late.id).update(
        status="running",
        lease_owner="w",
        attempts=1,
        lease_expires_at=timezone.now() - timezone.timedelta(seconds=30),
    )
    Job.objects.filter(pk=leased.id).update(status="done", lease_expires_at=timezone.now())
    sampler = oracle.Sampler(lateness=10)
    with psycopg.connect(test_database_url(), autocommit=True) as conn:
        sampler.sample(conn.execute(oracle.SAMPLE, {"lateness": 10}).fetchall())
        sampler.sample(None)  # a sample that could not run (server restarting)
        assert conn.execute(oracle.SAMPLE, {"lateness": 60}).fetchone()[0] == 0
    assert sampler.worst == {"late_leases": 1, "finished_leased": 1, "over_attempts": 0}
    assert (sampler.samples, sampler.skipped) == (1, 1)
