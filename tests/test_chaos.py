"""The chaos suite, CI length: about a minute of SIGKILLs, SIGSTOPs, terminated
backends and two PostgreSQL restarts on the suite's own server; nothing may be lost.

The full run (20,000 jobs) is ``python -m bench.chaos``; see docs/reliability.md.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from django.utils import timezone

from .conftest import REPO


@pytest.mark.slow
def test_chaos__nothing_lost_stuck_or_duplicated_transactionally() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.chaos",
            "--jobs",
            "2000",
            "--duration",
            "30",
            "--drain-seconds",
            "60",
            "--seed",
            "7",
        ],  # fmt: skip
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("jobs=")]
    assert lines, f"no summary line; stderr:\n{proc.stderr[-4000:]}"
    summary = dict(re.findall(r"(\w+)=(\S+)", lines[-1]))
    assert proc.returncode == 0, f"{lines[-1]}\n{proc.stderr[-4000:]}"
    for name in ("lost", "stuck", "dup_tx", "i1", "i2", "i4", "i5", "dead_unexpected"):
        assert summary[name] == "0", lines[-1]
    assert summary["pg_restarts"] == "2"
    assert int(summary["kills"]) > 0
    assert int(summary["terminated"]) > 0
    assert int(summary["done"]) + int(summary["dead"]) == 2000
    assert summary["dead"] == "10"  # exactly the poison pills


@pytest.mark.django_db(transaction=True)
def test_oracle__detects_each_violation() -> None:
    """The chaos oracle is only as good as its checks: seed one violation of each kind
    and see every counter move."""
    from bench import oracle
    from django_pgqueue.models import Job
    from testproject.demo.models import Execution

    from .conftest import test_database_url

    def make(task: str, status: str, rows: int, **fields: object) -> None:
        job = Job.objects.enqueue(f"testproject.demo.fault_tasks.{task}")
        Job.objects.filter(pk=job.id).update(status=status, **fields)
        kind = "tx" if task == "ledger_tx" else "plain"
        for attempt in range(rows):
            Execution.objects.create(job_id=job.id, attempt=attempt + 1, kind=kind, worker_id="w")

    make("ledger_tx", "done", 1)  # correct
    make("ledger_plain", "done", 1)  # correct
    make("ledger_tx", "done", 2)  # dup_tx, i5
    make("ledger_tx", "scheduled", 1)  # i5 (effect without completion), stuck
    make("ledger_plain", "done", 0)  # lost effect
    make("ledger_plain", "done", 3)  # two plain duplicates
    make("ledger_plain", "done", 1, attempts=9, max_attempts=2)  # i2
    make("ledger_plain", "done", 1, lease_expires_at=timezone.now())  # i4
    make("ledger_plain", "dead", 1)  # dead_unexpected
    result = oracle.check(test_database_url(), jobs=10, lease_seconds=2)
    assert {
        name: result[name]
        for name in ("dup_tx", "i5", "stuck", "lost", "dup_plain", "i2", "i4", "dead_unexpected")
    } == {
        "dup_tx": 1,
        "i5": 2,
        "stuck": 1,
        "lost": 2,  # one job never enqueued (jobs=10, 9 rows) + one done without effect
        "dup_plain": 2,
        "i2": 1,
        "i4": 1,
        "dead_unexpected": 1,
    }
