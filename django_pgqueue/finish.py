"""A worker's writes to the jobs it holds: extend their leases, complete them, record a
failure, give them back unrun. Runs the statements of ``sql/finish.py`` (a snooze and
progress, which the task itself asks for, are ``lifecycle.py``'s).

Every write is fenced on the job's owner, attempt and claim time (``sql.common.FENCE``):
a worker whose lease was taken back changes nothing, and learns so from the rows that
come back (None, False, or an id missing from a result). A completion that ends a job
with dependants resolves them: in the statement itself for a job created with them
(a workflow's parent), else right after (:func:`_completed`).
"""

from __future__ import annotations

import datetime as dt
import logging
import traceback
from collections.abc import Iterable, Sequence
from typing import Any

from django.db import DatabaseError, connections

from . import db, lifecycle, validation, workflows
from .conf import settings
from .sql import finish as sql

logger = logging.getLogger(__name__)


class Owned(set[int]):
    """The ids ``extend_leases`` still owns, and which of them were asked to cancel."""

    cancel_requested: frozenset[int] = frozenset()


def describe_error(exc: BaseException) -> tuple[str, str]:
    """``(exception_class_path, traceback)`` of a failed attempt, as stored in its error
    entry (the entry itself is built by the SQL: ``sql.common.ENTRY``)."""
    cls = type(exc)
    # A NUL or lone surrogate in a message would make jsonb refuse the whole write.
    text = validation.storable_text("".join(traceback.format_exception(exc)))
    return f"{cls.__module__}.{cls.__qualname__}", text


def _fence(job: Any, worker_id: str) -> dict[str, Any]:
    """The parameters every single-job write is fenced on."""
    return {
        "id": job.id,
        "worker_id": worker_id,
        "attempt": job.attempts,
        "claimed_at": job.last_attempted_at,
    }


def extend_leases(
    alias: str,
    worker_id: str,
    jobs: Iterable[Any],
    *,
    lease_seconds: float | None = None,
    now: dt.datetime | None = None,
) -> Owned:
    """Extend the leases ``worker_id`` still holds (``Job`` objects fence on the attempt
    and claim time too, plain ids on the owner only); the ids still owned."""
    owned = sorted(
        (
            (j, None, None) if isinstance(j, int) else (j.id, j.attempts, j.last_attempted_at)
            for j in jobs
        ),
        key=lambda o: o[0],  # ascending ids: a stable lock order
    )
    if not owned:
        return Owned()
    rows = db.rows(
        alias,
        sql.JOB_EXTEND_LEASES,
        {
            "worker_id": worker_id,
            "ids": [o[0] for o in owned],
            "attempts": [o[1] for o in owned],
            "claimed_at": [o[2] for o in owned],
            "lease_seconds": settings.LEASE_SECONDS if lease_seconds is None else lease_seconds,
            "now": now,
        },
    )
    result = Owned(row[0] for row in rows)
    result.cancel_requested = frozenset(row[0] for row in rows if row[1])
    return result


def complete(
    alias: str,
    job: Any,
    worker_id: str,
    *,
    result: Any = None,
    now: dt.datetime | None = None,
) -> str | None:
    """Mark ``job`` done, fenced; its new status (``done``, or ``cancelled`` if its
    cancellation was requested), or None if ``worker_id`` lost the lease."""
    releasing = bool(getattr(job, "has_dependants", False))
    rows = db.rows(
        alias,
        sql.JOB_COMPLETE_RELEASING if releasing else sql.JOB_COMPLETE,
        {
            **_fence(job, worker_id),
            "result": validation.result_json(result),
            "channel": settings.NOTIFY_CHANNEL,
            "now": now,
        },
    )
    if not rows:
        return None
    if not releasing and rows[0][2]:
        _completed(alias, [job.id], now=now)
    return rows[0][1]


def _completed(alias: str, ids: list[int], *, now: dt.datetime | None) -> None:
    """Resolve the dependants of jobs a plain completion just finished, which got
    them after they were created (a job created with dependants, a workflow's, has
    them resolved by the completion itself: ``sql.JOB_COMPLETE_RELEASING``). In the
    completion's transaction if there is one (a transactional task's); else right
    after its commit, and if that fails the sweeper resolves them (their edges are
    marked for repair), so the completion stands either way."""
    try:
        workflows.resolve_parents(alias, ids, now=now)
    except DatabaseError:
        if connections[alias].in_atomic_block:
            raise
        logger.warning(
            "jobs %s: their dependants could not be released now; the sweeper will",
            ids,
            exc_info=True,
            extra={"action": "release"},
        )


def complete_many(
    alias: str,
    completions: Sequence[tuple[Any, Any]],
    worker_id: str,
    *,
    now: dt.datetime | None = None,
    encoded: bool = False,
) -> list[str | None]:
    """Mark many ``(job, result)`` done in one statement, each fenced; each job's new
    status in input order (None where the lease was lost). ``encoded``: the results
    are the JSON text ``validation.result_json`` made of them already."""
    if not completions:
        return []
    # Ascending ids: the lock order of the heartbeat's JOB_EXTEND_LEASES.
    order = sorted(range(len(completions)), key=lambda i: completions[i][0].id)
    jobs = [completions[i][0] for i in order]
    # A workflow's parents' dependants are released by the completion itself; other
    # batches take the lean statement (see _completed).
    releasing = any(getattr(job, "has_dependants", False) for job in jobs)
    rows = db.rows(
        alias,
        sql.JOB_COMPLETE_MANY_RELEASING if releasing else sql.JOB_COMPLETE_MANY,
        {
            "worker_id": worker_id,
            "ids": [job.id for job in jobs],
            "attempts": [job.attempts for job in jobs],
            "claimed_at": [job.last_attempted_at for job in jobs],
            "results": [
                completions[i][1] if encoded else validation.result_json(completions[i][1])
                for i in order
            ],
            "channel": settings.NOTIFY_CHANNEL,
            "now": now,
        },
        prepare=True,
        binary_lists=True,
    )
    statuses: list[str | None] = [None] * len(completions)
    for row in rows:
        statuses[order[row[0] - 1]] = row[1]
    if not releasing:
        found = [jobs[row[0] - 1].id for row in rows if row[2]]
        if found:
            _completed(alias, found, now=now)
    return statuses


def fail(
    alias: str,
    job: Any,
    worker_id: str,
    exc: BaseException,
    *,
    retry: bool = True,
    now: dt.datetime | None = None,
) -> str | None:
    """Record a failed attempt, fenced: retried after the delay of ``lifecycle.retry_plan``
    (``Retry``'s, the task's ``backoff``, else the exponential backoff) while attempts
    remain and ``retry``, else dead; the new status, or None if ``worker_id`` lost the
    lease."""
    error_path, error_traceback = describe_error(exc)
    retry, retry_delay = lifecycle.retry_plan(job, exc, retry)
    rows = db.rows(
        alias,
        sql.JOB_FAIL,
        {
            **_fence(job, worker_id),
            "error_path": error_path,
            "error_traceback": error_traceback,
            "retry": retry,
            "retry_delay": retry_delay,
            "backoff_base": float(settings.RETRY_BACKOFF_BASE),
            "backoff_max": float(settings.RETRY_BACKOFF_MAX),
            "keep_errors": settings.KEEP_ERRORS,
            "channel": settings.NOTIFY_CHANNEL,
            "now": now,
        },
        # Prepared: the statement resolves what waits on a job that ends (its plan
        # is big); planned once per connection rather than once per failure.
        prepare=True,
    )
    return rows[0][0] if rows else None


def release(alias: str, job: Any, worker_id: str) -> bool:
    """Give an unstarted claimed job back to pending without charging the attempt."""
    return bool(
        db.rows(
            alias,
            sql.JOB_RELEASE,
            {**_fence(job, worker_id), "channel": settings.NOTIFY_CHANNEL, "now": None},
        )
    )
