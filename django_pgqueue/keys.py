"""Idempotency keys that outlive a job's live states: ``unique_for`` and ``debounce``.

Without these, an ``idempotency_key`` is unique among the live jobs of its queue (the
partial unique index ``pgqueue_job_idempotency_uniq``). With them the arbiter is a row
of ``pgqueue_job_key`` per (kind, queue, key), taken by an upsert, so concurrent
enqueues of one key take turns on that row and make one job:

``unique_for=seconds``
    The first enqueue opens a window of that length from its job's creation; every
    enqueue of the key inside it returns that job, whatever its state (done and dead
    included). After it, the next enqueue creates a new job and a new window. A live
    job holding the key still wins, as without ``unique_for`` (it is returned, and the
    window is not renewed). The key's row outlives the job: a job pruned inside its
    window (``PGQUEUE_RETENTION_SECONDS`` shorter than the window, or a dead letter
    discarded) still dedupes; the enqueue then returns an unsaved ``Job`` with the first
    job's id and status ``done`` (:func:`_gone`). The sweeper deletes a key once its
    window closed (``sql.JOB_DELETE_EXPIRED_KEYS``).
``debounce=seconds``
    While the key's job has not started, each enqueue replaces its args and kwargs and
    moves its run time to now + seconds; once it started (or ended), the next enqueue
    makes a new job. The job itself holds no ``idempotency_key`` (a running one would
    keep the next one from being created), so ``current_job().idempotency_key`` is None.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from django.db import transaction

from . import db, sql
from .conf import settings
from .exceptions import InvalidJob, delay_seconds
from .states import Status

# Annotations only: the models, the manager and the worker sit above this module.
JobManager = Any
Job = Any


logger = logging.getLogger(__name__)

#: How often an enqueue tries again when the key's job changed under it.
ROUNDS = 5


class _LiveHolder(Exception):  # noqa: N818 - internal: roll the key's window back
    """The window was ours to open, but a live job holds the key."""


def period(value: Any, what: str) -> float:
    """A ``unique_for``/``debounce`` period in seconds, checked: > 0; ``InvalidJob``
    naming the argument otherwise."""
    try:
        seconds = delay_seconds(value, what)
    except (TypeError, ValueError):
        seconds = -1.0
    if seconds <= 0:
        raise InvalidJob(f"{what} must be a number of seconds > 0 or a timedelta, not {value!r}")
    return seconds


def enqueue(
    manager: JobManager,
    params: dict[str, Any],
    *,
    unique_for: float | dt.timedelta | None,
    debounce: float | dt.timedelta | None,
    run_at_given: bool,
) -> Job:
    """``Job.objects.enqueue`` with ``unique_for`` or ``debounce``; ``params`` are the
    validated parameters of ``sql.JOB_ENQUEUE``. Checked before anything is written."""
    return store(manager, checked(params, unique_for, debounce, run_at_given=run_at_given))[0]


def checked(
    params: dict[str, Any],
    unique_for: float | dt.timedelta | None,
    debounce: float | dt.timedelta | None,
    *,
    run_at_given: bool,
) -> dict[str, Any]:
    """``params`` with the period checked and added (``InvalidJob`` naming what is
    wrong); what :func:`store` takes."""
    if unique_for is not None and debounce is not None:
        raise InvalidJob("give unique_for or debounce, not both")
    what = "unique_for" if unique_for is not None else "debounce"
    seconds = period(unique_for if unique_for is not None else debounce, what)
    if params["idempotency_key"] is None:
        raise InvalidJob(f"{what} needs an idempotency_key: the key it applies to")
    if debounce is not None:
        if run_at_given:
            raise InvalidJob("debounce sets the run time (now + debounce): give no run_at")
        return {**params, "debounce": seconds}
    return {**params, "unique_for": seconds}


def store(manager: JobManager, params: dict[str, Any]) -> tuple[Job, bool]:
    """Enqueue with the period of ``params`` (made by :func:`checked`); the job, and
    whether it is new (False: an existing job was returned, or moved by a debounce)."""
    if "debounce" in params:
        return _debounced(manager, params)
    return _unique(manager, params)


def _unique(manager: JobManager, params: dict[str, Any]) -> tuple[Job, bool]:
    alias = manager.db_alias
    for _ in range(ROUNDS):
        try:
            with transaction.atomic(using=alias):
                job_id, fresh, inserted = db.row(alias, sql.JOB_ENQUEUE_UNIQUE, params)
                if fresh and not inserted:
                    raise _LiveHolder
        except _LiveHolder:
            live = manager.live_with_key(params["queue"], params["idempotency_key"])
            if live is not None:
                return live, False
            continue  # it ended meanwhile: open the window again
        found = manager.db_manager(alias).filter(pk=job_id).first()
        return (found if found is not None else _gone(manager, params, job_id)), fresh
    raise RuntimeError("idempotency key kept changing hands; giving up")


def _debounced(manager: JobManager, params: dict[str, Any]) -> tuple[Job, bool]:
    alias = manager.db_alias
    for _ in range(ROUNDS):
        # No row: the key's job started, or was made by a concurrent enqueue this
        # statement's snapshot predates; the next statement sees which.
        row = db.row(alias, sql.JOB_ENQUEUE_DEBOUNCED, params)
        if row is not None:
            found = manager.db_manager(alias).filter(pk=row[0]).first()
            if found is not None:
                return found, row[1]
    raise RuntimeError("debounced job kept changing under the enqueue; giving up")


def _gone(manager: JobManager, params: dict[str, Any], job_id: int) -> Job:
    """The job of an open window that is no longer in the table (pruned when done, or a
    discarded dead letter): an unsaved ``Job`` with its id, status ``done`` (what
    pruning deletes) and this call's task and payload."""
    logger.info(
        "enqueue: key %r of queue %s is unique until its window closes; its job %s was "
        "pruned, so nothing was enqueued",
        params["idempotency_key"],
        params["queue"],
        job_id,
        extra={"action": "enqueue", "job_id": job_id},
    )
    job = manager.model(
        id=job_id,
        backend=params["backend"],
        queue=params["queue"],
        task=params["task"],
        args=[],
        kwargs={},
        priority=params["priority"],
        status=Status.DONE,
        max_attempts=params["max_attempts"],
        idempotency_key=params["idempotency_key"],
    )
    job._state.db = manager.db_alias
    return job


def prune_expired(using: str, *, now: dt.datetime | None = None, max_batches: int) -> int:
    """Delete keys whose window closed, and debounce keys whose job started, in batches
    of ``PGQUEUE_SWEEP_BATCH_SIZE``; return how many."""
    batch_size = int(settings.SWEEP_BATCH_SIZE)
    params: dict[str, Any] = {"now": now, "batch_size": batch_size}
    pruned = 0
    for _ in range(max_batches):
        count = db.rowcount(using, sql.JOB_DELETE_EXPIRED_KEYS, params)
        pruned += count
        if count < batch_size:
            break
    return pruned
