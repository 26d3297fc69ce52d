"""What a running task can say about its own job: snooze, retry after its own delay,
and its progress.

* ``raise Snooze(seconds)``: not a failure. The runner hands it to :func:`snooze`, which
  puts the job back to ``scheduled`` (``sql.JOB_SNOOZE``, fenced), its attempt given
  back and counted in ``Job.snoozes``, up to ``PGQUEUE_MAX_SNOOZES``.
* ``raise Retry(seconds, reason=...)`` and ``@task(backoff=callable)``: a failed
  attempt whose retry delay is the task's, not the backoff's (:func:`retry_plan`,
  asked by ``Job.objects.fail``).
* ``current_job().set_progress(value)``: one fenced primary-key UPDATE
  (``sql.JOB_SET_PROGRESS``) on the runner's own connection (:func:`set_progress`).
* ``current_job().parents()``: the outcomes of the jobs it depended on
  (:func:`parents`), for a job released with ``on_parent_failure="run"``.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
from dataclasses import dataclass
from typing import Any

from . import db, validation
from .conf import settings
from .exceptions import (
    InvalidJob,
    InvalidResult,
    LeaseLost,
    Retry,
    Snooze,
    SnoozeLimitExceeded,
    delay_seconds,
    exception_line,
)
from .framework import to_task_result
from .sql import lifecycle as sql
from .taskapi import Task

# Annotations only: the models, the manager and the worker sit above this module.
Job = Any
JobRunner = Any


logger = logging.getLogger(__name__)


def retry_plan(job: Job, exc: BaseException, retry: bool) -> tuple[bool, float | None]:
    """Whether a failed attempt of ``job`` may be retried, and after how many seconds
    (None: the exponential backoff of ``PGQUEUE_RETRY_BACKOFF_*``).

    ``Retry(seconds)`` gives its own delay; a task's ``backoff`` option computes one
    from the exception and the job's ``TaskResult`` (a failing or bad one is logged and
    the backoff used); too many snoozes are never retried."""
    if isinstance(exc, SnoozeLimitExceeded):
        return False, None
    if not retry:
        return False, None
    if isinstance(exc, Retry):
        return True, exc.seconds
    return True, _task_backoff(job, exc)


def _task_backoff(job: Job, exc: BaseException) -> float | None:
    """The delay ``@task(backoff=...)`` of ``job``'s task says for ``exc`` (None: none).

    Only a task whose module is imported already (the worker imported it to run it) is
    asked: a failure is never the place to import code, which may be what failed."""
    module, _, name = job.task.rpartition(".")
    task = getattr(sys.modules.get(module), name, None)
    if not isinstance(task, Task):
        return None
    backoff = getattr(task, "backoff", None)
    if backoff is None:
        return None
    try:
        value = backoff(exc, to_task_result(job, task))
        return None if value is None else delay_seconds(value, "backoff")
    except Exception as error:  # noqa: BLE001 - a bad backoff must not lose the failure
        logger.warning(
            "job %s: backoff of %s raised %s; using the default backoff",
            job.id,
            job.task,
            exception_line(error),
            extra={"action": "retry", "job_id": job.id},
        )
        return None


def snooze(runner: JobRunner, job: Job, request: Snooze) -> BaseException | None:
    """Record a task's ``Snooze``, fenced; None once handled (recorded, or the lease
    was lost and logged). Over ``PGQUEUE_MAX_SNOOZES``, nothing is written and the
    ``SnoozeLimitExceeded`` to record as the attempt's failure is returned instead."""
    limit = int(settings.MAX_SNOOZES)
    if job.snoozes >= limit:
        return SnoozeLimitExceeded(
            f"job {job.id} already snoozed {job.snoozes} times, the limit "
            f"(PGQUEUE_MAX_SNOOZES = {limit}); this attempt fails and is not retried"
        )
    runner._mark_recording(job)
    written, found = runner.write_retrying(
        lambda: snooze_job(runner.alias, job, runner.worker_id, request.seconds),
        jobs=[job],
        outcome="snooze",
    )
    if not written:
        return None
    if not found:
        runner.report_lost(job, "snooze")
        return None
    runner.state.stats.count("snoozed")
    logger.info(
        "job %s %s snoozed for %gs (snooze %d, %s)",
        job.id,
        job.task,
        request.seconds,
        job.snoozes + 1,
        found,
        extra={"action": "snooze", "job_id": job.id, "worker_id": runner.worker_id},
    )
    return None


def snooze_job(
    alias: str, job: Job, worker_id: str, seconds: float, *, now: dt.datetime | None = None
) -> str | None:
    """Put a running job back to ``scheduled`` for ``seconds`` (``pending`` for 0), its
    attempt given back and the snooze counted, fenced (``sql.JOB_SNOOZE``); the new
    status, or None if ``worker_id`` lost the lease."""
    rows = db.rows(
        alias,
        sql.JOB_SNOOZE,
        {
            "id": job.id,
            "worker_id": worker_id,
            "attempt": job.attempts,
            "claimed_at": job.last_attempted_at,
            "seconds": seconds,
            "channel": settings.NOTIFY_CHANNEL,
            "now": now,
        },
        prepare=True,
    )
    return rows[0][0] if rows else None


def progress_json(value: Any) -> str:
    """``value`` as the JSON text stored in ``Job.progress``, checked: JSON-safe and at
    most ``PGQUEUE_MAX_PROGRESS_BYTES``; else ``InvalidJob`` naming what is wrong."""
    try:
        text = validation.result_json(value, what="progress")
    except InvalidResult as exc:
        raise InvalidJob(str(exc)) from None
    except (TypeError, ValueError) as exc:
        raise InvalidJob(f"progress must be JSON-serialisable: {exc}") from None
    limit = int(settings.MAX_PROGRESS_BYTES)
    if len(text) > limit:
        raise InvalidJob(
            f"progress is {len(text)} bytes of JSON, over the limit of {limit} "
            "(PGQUEUE_MAX_PROGRESS_BYTES)"
        )
    return text


@dataclass(frozen=True, slots=True)
class ParentOutcome:
    """How one of a job's parents (``depends_on``, a chain's previous step, a group's
    member) finished: ``status`` is ``done``, ``dead`` or ``cancelled`` (or a live
    status, if it has not finished: the job did not wait for it), ``result`` its return
    value when done, ``error`` its last error entry (``exception_class_path``,
    ``traceback``, ...) while its row is kept (None once pruned)."""

    id: int
    status: str
    result: Any
    error: dict[str, Any] | None


def parents(alias: str, job_id: int) -> list[ParentOutcome]:
    """The parents of job ``job_id`` in ``depends_on`` order, with their outcomes
    (``sql.JOB_GET_PARENTS``); [] for a job without parents."""
    return [
        ParentOutcome(
            id=parent_id,
            status=status,
            result=json.loads(result) if isinstance(result, str) else result,
            error=json.loads(error) if isinstance(error, str) else error,
        )
        for parent_id, status, result, error in db.rows(alias, sql.JOB_GET_PARENTS, {"id": job_id})
    ]


def set_progress(
    alias: str,
    job_id: int,
    worker_id: str,
    attempt: int,
    claimed_at: dt.datetime | None,
    value: Any,
) -> None:
    """Store ``value`` as the job's progress, fenced on this attempt; ``LeaseLost`` if
    the worker no longer owns it (nothing written)."""
    params = {
        "id": job_id,
        "worker_id": worker_id,
        "attempt": attempt,
        "claimed_at": claimed_at,
        "progress": progress_json(value),
    }
    if not db.rows(alias, sql.JOB_SET_PROGRESS, params, prepare=True):
        raise LeaseLost(f"job {job_id}: lease lost; progress not stored")
