"""Enqueueing one job: plain, or keyed for a period (``unique_for``, ``debounce``), and
the wake-ups that tell idle workers of new work. Runs the statements of ``sql/enqueue.py``.

Without a period an ``idempotency_key`` is unique among the live jobs of its queue (the
partial unique index ``pgqueue_job_idempotency_uniq``). With one the arbiter is a row
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

The job's values are prepared by ``defaults.prepare`` (the one preparation every way of
enqueueing shares); this module only stores them.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
from collections.abc import Iterable
from typing import Any

from django.db import models, transaction

from . import db
from .conf import settings
from .exceptions import InvalidJob, delay_seconds
from .sql import enqueue as sql
from .states import LIVE_STATUSES, Status

logger = logging.getLogger(__name__)

#: How often an enqueue tries again when the key's job changed under it.
ROUNDS = 5


def enqueue_one(model: type[models.Model], alias: str, params: dict[str, Any]) -> Any:
    """Store one job of prepared ``params`` (``sql.JOB_ENQUEUE``) and wake idle workers
    at commit; with an ``idempotency_key`` a live job of the queue holds, that job is
    returned and nothing is inserted."""
    for _ in range(ROUNDS):
        row = db.row(alias, sql.JOB_ENQUEUE, params, prepare=True)
        if row is not None:
            return _enqueued(model, alias, params, row)
        # ON CONFLICT: a live job holds the key. It may finish between the insert
        # and this read, in which case the insert is tried again.
        existing = live_with_key(model, alias, params["queue"], params["idempotency_key"])
        if existing is not None:
            return existing
    raise RuntimeError("idempotency key kept changing hands; giving up")


def _enqueued(
    model: type[models.Model], alias: str, params: dict[str, Any], row: tuple[Any, ...]
) -> Any:
    """The ``Job`` ``JOB_ENQUEUE`` stored: the database's id, status and times, the
    rest from what was sent (args and kwargs as jsonb gives them back)."""
    job_id, status, run_at, created_at, _ = row
    trace_context = params.get("trace_context")
    # Every other column of a new job is NULL (lease, result, timestamps, flags).
    values = dict.fromkeys(field_names(model))
    values.update(
        id=job_id,
        backend=params["backend"],
        queue=params["queue"],
        task=params["task"],
        args=db.load_json(params["args"]),
        kwargs=db.load_json(params["kwargs"]),
        priority=params["priority"],
        status=status,
        attempts=0,
        max_attempts=params["max_attempts"],
        run_at=run_at,
        idempotency_key=params["idempotency_key"],
        errors=[],
        snoozes=0,
        concurrency_key=params["concurrency_key"],
        soft_time_limit=params.get("soft_time_limit"),
        time_limit=params.get("time_limit"),
        has_dependants=False,
        waited=False,
        created_at=created_at,
        trace_context=None if trace_context is None else json.loads(trace_context),
        tags=list(params.get("tags", ())),
    )
    return db.instance(model, alias, values)


@functools.cache
def field_names(model: type[models.Model]) -> list[str]:
    """The model's concrete field names in column order, read once (enqueue's hot path
    builds every returned Job from them)."""
    return [f.attname for f in model._meta.concrete_fields]


def live_with_key(model: type[models.Model], alias: str, queue: str, key: str | None) -> Any:
    """The live job of ``queue`` holding idempotency key ``key``, if any."""
    return (
        model._default_manager.db_manager(alias)
        .filter(queue=queue, idempotency_key=key, status__in=LIVE_STATUSES)
        .first()
    )


# --- keyed for a period: unique_for, debounce ---------------------------------------


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


def checked(
    params: dict[str, Any],
    unique_for: float | dt.timedelta | None,
    debounce: float | dt.timedelta | None,
    *,
    run_at_given: bool,
) -> dict[str, Any]:
    """``params`` with the period checked and added (``InvalidJob`` naming what is
    wrong); what :func:`enqueue_keyed` takes."""
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


def enqueue_keyed(
    model: type[models.Model], alias: str, params: dict[str, Any]
) -> tuple[Any, bool]:
    """Enqueue with the period of ``params`` (made by :func:`checked`); the job, and
    whether it is new (False: an existing job was returned, or moved by a debounce)."""
    if "debounce" in params:
        return _debounced(model, alias, params)
    return _unique(model, alias, params)


def _unique(model: type[models.Model], alias: str, params: dict[str, Any]) -> tuple[Any, bool]:
    for _ in range(ROUNDS):
        try:
            with transaction.atomic(using=alias):
                job_id, fresh, inserted = db.row(alias, sql.JOB_ENQUEUE_UNIQUE, params)
                if fresh and not inserted:
                    raise _LiveHolder
        except _LiveHolder:
            live = live_with_key(model, alias, params["queue"], params["idempotency_key"])
            if live is not None:
                return live, False
            continue  # it ended meanwhile: open the window again
        found = model._default_manager.db_manager(alias).filter(pk=job_id).first()
        return (found if found is not None else _gone(model, alias, params, job_id)), fresh
    raise RuntimeError("idempotency key kept changing hands; giving up")


def _debounced(model: type[models.Model], alias: str, params: dict[str, Any]) -> tuple[Any, bool]:
    for _ in range(ROUNDS):
        # No row: the key's job started, or was made by a concurrent enqueue this
        # statement's snapshot predates; the next statement sees which.
        row = db.row(alias, sql.JOB_ENQUEUE_DEBOUNCED, params)
        if row is not None:
            found = model._default_manager.db_manager(alias).filter(pk=row[0]).first()
            if found is not None:
                return found, row[1]
    raise RuntimeError("debounced job kept changing under the enqueue; giving up")


def _gone(model: type[models.Model], alias: str, params: dict[str, Any], job_id: int) -> Any:
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
    job = model(
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
        tags=list(params.get("tags", ())),
    )
    job._state.db = alias
    return job


# --- wake-ups -------------------------------------------------------------------------


def notify(alias: str, queue: str) -> None:
    """Wake workers listening for ``queue`` (at commit of the current transaction)."""
    db.rows(alias, sql.JOB_NOTIFY, {"channel": settings.NOTIFY_CHANNEL, "queue": queue})


def notify_queues(alias: str, queues: Iterable[str]) -> None:
    """Wake workers once for each of ``queues``, in one statement (at commit)."""
    db.rows(
        alias,
        sql.JOB_NOTIFY_MANY,
        {"channel": settings.NOTIFY_CHANNEL, "queues": sorted(set(queues))},
    )


def check_combination(
    *, parents: bool, on_parent_failure: str | None, keyed: bool, time_limited: bool
) -> None:
    """Refuse the options of ``Job.objects.enqueue`` that do not go together, before
    anything is written: a dependant has no key period (it is released by its parents,
    not deduplicated) and no per-job time limits (its row is written by the workflow's
    statement), and ``on_parent_failure`` means nothing without parents."""
    if parents and keyed:
        raise InvalidJob("depends_on cannot be combined with unique_for or debounce")
    if parents and time_limited:
        raise InvalidJob(
            "soft_time_limit and time_limit cannot be given with depends_on: give "
            "them to the task (@task(time_limit=...)) or set PGQUEUE_TIME_LIMIT"
        )
    if on_parent_failure is not None and not parents:
        raise InvalidJob("on_parent_failure needs depends_on: the jobs it applies to")
