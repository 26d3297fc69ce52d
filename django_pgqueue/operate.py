"""An operator's writes to jobs by id: cancel them, requeue or discard dead letters.
Runs the statements of ``sql/operate.py`` (for ``Job.objects`` and the admin).

Each works in bounded batches of ``PGQUEUE_SWEEP_BATCH_SIZE`` ids, one guarded
statement per batch, its rows locked in id order (a stable lock order: overlapping
operations wait for each other, never deadlock), and changes only jobs still in the
state it acts on: a job that moved on meanwhile is left alone and left out of the result.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from . import db, validation, workflows
from .conf import settings
from .exceptions import InvalidJob
from .sql import operate as sql
from .states import Status

#: How often ``cancel()`` tries again a job locked at that instant (being claimed or
#: completed), and how long it waits in between.
CANCEL_ROUNDS = 5
CANCEL_RETRY_DELAY = 0.05
#: A cancel notification's payload starts with this (a colon: no queue name does), then
#: names up to ``CANCEL_NOTIFY_IDS`` job ids, comma-separated (see ``sql.JOB_NOTIFY_CANCEL``).
CANCEL_NOTIFY_PREFIX = "cancel:"
CANCEL_NOTIFY_IDS = 300


@dataclass(frozen=True)
class CancelResult:
    """What ``Job.objects.cancel()`` did: ``cancelled`` pending or scheduled jobs (they
    will never run), and ``requested`` running jobs whose worker is told at once (a
    NOTIFY) or at its next lease extension. Other ids (finished, unknown) are in neither."""

    cancelled: list[int]
    requested: list[int]


def job_ids(ids: Any, *, what: str = "ids") -> list[int]:
    """Distinct job ids in ascending order (a stable lock order), checked: a collection
    of ints. A str or bytes (whose characters would be read as ids), a bool or any
    other non-int raises ``InvalidJob`` naming it, before anything is changed."""
    if isinstance(ids, str | bytes | bytearray | memoryview) or not isinstance(ids, Iterable):
        raise InvalidJob(
            f"{what} must be a collection of int job ids, not {type(ids).__name__} "
            f"{validation.show(ids)}"
        )
    checked = set()
    for value in ids:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidJob(
                f"{what} must hold int job ids only, not {type(value).__name__} "
                f"{validation.show(value)}"
            )
        checked.add(int(value))
    return sorted(checked)


def chunks(ids: list[int], size: int | None = None) -> Iterator[list[int]]:
    """Checked ids, ``size`` (``PGQUEUE_SWEEP_BATCH_SIZE``) at a time."""
    size = int(settings.SWEEP_BATCH_SIZE) if size is None else size
    for start in range(0, len(ids), size):
        yield ids[start : start + size]


def requeue_dead(
    alias: str,
    ids: Iterable[int],
    *,
    queue: str | None = None,
    priority: int | None = None,
    now: dt.datetime | None = None,
) -> list[int]:
    """Put dead jobs back to pending (see ``Job.objects.requeue_dead``); the ids that
    changed. What a job's death cancelled down the graph waits again, in the same
    transaction as its requeue (``workflows.restore_dependants``)."""
    params: dict[str, Any] = {
        "queue": None if queue is None else validation.queue_name(queue),
        "priority": None if priority is None else validation.priority(priority),
        "channel": settings.NOTIFY_CHANNEL,
        "now": now,
    }
    requeued: list[int] = []
    for chunk in chunks(job_ids(ids)):
        with transaction.atomic(using=alias):
            rows = db.rows(alias, sql.JOB_REQUEUE_DEAD, {**params, "ids": chunk})
            done = [row[0] for row in rows]
            workflows.restore_dependants(alias, done)
        requeued.extend(done)
    return sorted(requeued)


def cancel(alias: str, ids: Iterable[int], *, now: dt.datetime | None = None) -> CancelResult:
    """Cancel jobs by id (see ``Job.objects.cancel``): waiting, pending and scheduled
    ones at once, running ones asked to stop, told by a NOTIFY at commit. A job locked
    at that instant is tried again a few times, then left as it is."""
    cancelled: list[int] = []
    requested: list[int] = []
    for chunk in chunks(job_ids(ids)):
        for round_ in range(CANCEL_ROUNDS):
            busy = []
            for job_id, status in db.rows(
                alias,
                sql.JOB_CANCEL,
                {"ids": chunk, "now": now, "channel": settings.NOTIFY_CHANNEL},
            ):
                if status == Status.CANCELLED:
                    cancelled.append(job_id)
                elif status == Status.RUNNING:
                    requested.append(job_id)
                else:
                    busy.append(job_id)
            if not busy:
                break
            chunk = busy
            if round_ < CANCEL_ROUNDS - 1:
                time.sleep(CANCEL_RETRY_DELAY)
    if requested:
        db.rows(
            alias,
            sql.JOB_NOTIFY_CANCEL,
            {
                "channel": settings.NOTIFY_CHANNEL,
                "prefix": CANCEL_NOTIFY_PREFIX,
                "ids": requested,
                "per_payload": CANCEL_NOTIFY_IDS,
            },
        )
    return CancelResult(cancelled=sorted(cancelled), requested=sorted(requested))


def run_now(alias: str, ids: Iterable[int], *, now: dt.datetime | None = None) -> list[int]:
    """Scheduled jobs (a retry backing off, a job for later) to pending now, attempts
    and errors kept; the ids that changed (never a job no longer scheduled)."""
    changed: list[int] = []
    for chunk in chunks(job_ids(ids)):
        rows = db.rows(
            alias,
            sql.JOB_RUN_NOW,
            {"ids": chunk, "now": now, "channel": settings.NOTIFY_CHANNEL},
        )
        changed.extend(row[0] for row in rows)
    return sorted(changed)


def delete_finished(alias: str, ids: Iterable[int]) -> list[int]:
    """Delete finished (done, dead, cancelled) jobs by id; the ids deleted. A live job
    is never deleted, nor a parent whose dependant still needs its row."""
    deleted: list[int] = []
    for chunk in chunks(job_ids(ids)):
        deleted.extend(row[0] for row in db.rows(alias, sql.JOB_DELETE_FINISHED, {"ids": chunk}))
    return sorted(deleted)


def discard_dead(alias: str, ids: Iterable[int]) -> list[int]:
    """Delete dead jobs by id; the ids deleted (never a job that stopped being dead)."""
    deleted: list[int] = []
    for chunk in chunks(job_ids(ids)):
        deleted.extend(
            row[0]
            for row in db.rows(
                alias,
                sql.JOB_DELETE_DEAD,
                {"ids": chunk, "now": None, "channel": settings.NOTIFY_CHANNEL},
            )
        )
    return sorted(deleted)
