"""Tasks for the fault tests and the chaos suite; each execution leaves a ledger row.

``Execution`` rows are the oracle's evidence: a transactional task's row commits with
its completion (so exactly one per done job), an ordinary task's row commits at once
(so a job run twice leaves two rows, reported as a plain duplicate).
"""

from __future__ import annotations

import os
import signal
import time

from django.db import transaction

from django_pgqueue.taskapi import task
from django_pgqueue.tasks import current_job

from .models import Execution


def record(kind: str) -> int:
    """Write this execution's ledger row; return the job id."""
    job = current_job()
    assert job is not None, "only a worker runs these tasks"
    Execution.objects.create(
        job_id=job.id, attempt=job.attempt, kind=kind, worker_id=job.worker_id
    )
    return job.id


@task()
def ledger_plain(n: int = 0, work_ms: float = 0.0) -> int:
    """An ordinary task: its effect commits at once (at-least-once)."""
    record("plain")
    time.sleep(work_ms / 1000)
    return n


@task(transactional=True)
def ledger_tx(n: int = 0, work_ms: float = 0.0) -> int:
    """A transactional task: its effect commits with its completion (exactly once)."""
    record("tx")
    time.sleep(work_ms / 1000)
    return n


@task(max_attempts=3)
def poison() -> None:
    """Kills its own worker process every time it runs."""
    os.kill(os.getpid(), signal.SIGKILL)


@task(timeout=1.0)
def hang(seconds: float = 5.0) -> float:
    """Runs far past its 1 s timeout (then records, too late to count)."""
    time.sleep(seconds)
    record("plain")
    return seconds


@task()
def slow_plain(seconds: float = 1.0) -> float:
    """Sleeps, then records: a zombie's effect shows up as a second ledger row."""
    time.sleep(seconds)
    record("plain")
    return seconds


@task(transactional=True)
def slow_tx(seconds: float = 1.0) -> float:
    """Records, then sleeps, in one transaction with its completion."""
    record("tx")
    time.sleep(seconds)
    return seconds


@task()
def leak_transaction() -> None:
    """Opens an atomic block and never closes it."""
    transaction.atomic().__enter__()
    record("plain")


@task()
def system_exit() -> None:
    """Raises SystemExit (a BaseException) from inside a task."""
    raise SystemExit("task called sys.exit()")


@task(transactional=True)
def on_commit_raises() -> None:
    """Commits its effect, then an on_commit callback raises."""
    record("tx")

    def boom() -> None:
        raise RuntimeError("on_commit callback failed")

    transaction.on_commit(boom)


@task(transactional=True)
def enqueue_child_then_raise() -> None:
    """Writes an effect and enqueues a child job, then fails: both must roll back."""
    record("tx")
    ledger_plain.enqueue(n=-1)
    raise RuntimeError("parent failed after enqueueing a child")
