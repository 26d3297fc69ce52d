"""Bulk enqueue: many jobs in one call, through COPY, all or nothing.

The order of preference is the seed's (section 2, "Batch writes"):

1. **COPY** (psycopg 3 ``cursor.copy()``, binary format) for every batch it can express:
   jobs without an idempotency key.
2. **A bounded multi-row INSERT** (``INSERT ... SELECT FROM unnest(...) ON CONFLICT DO
   NOTHING``) for batches holding idempotency keys, because COPY has no ON CONFLICT.
3. **One explicit transaction** (a savepoint inside the caller's) around the whole call.
4. **Every error checked**: each statement's error, and COPY's final result, surface as
   Django ``DatabaseError``\\ s; nothing is fired and forgotten.

Jobs are read from the iterable lazily, ``batch_size`` at a time: each batch is
validated completely before its first byte is sent, then written, then dropped, so a
generator of a million jobs is never held in memory.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from django.db import DatabaseError, connections, transaction
from django.tasks import Task
from psycopg.abc import Buffer
from psycopg.adapt import Dumper
from psycopg.postgres import types as pg_types
from psycopg.pq import Format

from . import sql, validation
from .conf import settings
from .exceptions import InvalidJob

logger = logging.getLogger(__name__)

#: Jobs validated, held and written per statement: caps client memory, the size of one
#: COPY or INSERT (WAL burst), and how long one statement holds its locks.
DEFAULT_BATCH_SIZE = 5000

#: Keys a job mapping may have: ``Job.objects.enqueue()``'s parameters.
JOB_KEYS = frozenset(
    {
        "task",
        "args",
        "kwargs",
        "queue",
        "priority",
        "run_at",
        "max_attempts",
        "idempotency_key",
        "backend",
    }
)

#: Columns of one row, in the order of JOB_BULK_COPY's column list.
COLUMNS = (
    "backend",
    "queue",
    "task",
    "args",
    "kwargs",
    "priority",
    "status",
    "max_attempts",
    "run_at",
    "created_at",
    "errors",
    "idempotency_key",
)

#: PostgreSQL types of COLUMNS. Binary COPY applies no casts, so each value is sent in
#: exactly its column's binary form. The jsonb values are JSON text that validation has
#: already produced; _JsonTextDumper sends them without parsing them again.
COPY_TYPES = (
    "text",
    "text",
    "text",
    "jsonb",
    "jsonb",
    "int4",
    "text",
    "int4",
    "timestamptz",
    "timestamptz",
    "jsonb",
    "text",
)

_ERRORS_EMPTY = "[]"


class BulkResult(int):
    """How many jobs a bulk call created (it *is* that ``int``), plus ``skipped``: the
    jobs left out because a live job in their queue already held their idempotency key."""

    skipped: int

    def __new__(cls, created: int = 0, skipped: int = 0) -> BulkResult:
        obj = super().__new__(cls, created)
        obj.skipped = skipped
        return obj

    @property
    def created(self) -> int:
        return int(self)

    def __repr__(self) -> str:
        return f"BulkResult(created={int(self)}, skipped={self.skipped})"


class _JsonTextDumper(Dumper):
    """Binary jsonb from JSON text already made by ``validation.payload``.

    psycopg's own jsonb dumper would ``json.dumps`` the value again (turning text into a
    JSON string); jsonb's binary form is simply a version byte, 1, and the text."""

    format = Format.BINARY
    oid = pg_types["jsonb"].oid

    def dump(self, obj: str) -> Buffer:
        return b"\x01" + obj.encode()


class _RowMaker:
    """Turns one job mapping into one row of COLUMNS, with ``enqueue()``'s defaults and
    checks. Per-call state: the database clock and a cache of imported task paths."""

    def __init__(self, now: dt.datetime) -> None:
        self.now = now
        self.max_attempts = validation.max_attempts(settings.MAX_ATTEMPTS)
        self.max_bytes = settings.MAX_PAYLOAD_BYTES
        self.task_paths: dict[str, str] = {}

    def __call__(self, job: Any) -> tuple[Any, ...]:
        if not isinstance(job, Mapping):
            raise InvalidJob(
                f"a job must be a mapping of enqueue() arguments, not {type(job).__name__}"
            )
        if not job.keys() <= JOB_KEYS:
            unknown = ", ".join(sorted(map(repr, job.keys() - JOB_KEYS)))
            raise InvalidJob(f"unknown key {unknown}: use {', '.join(sorted(JOB_KEYS))}")
        task = job.get("task")
        if task is None:
            raise InvalidJob("task is required")
        queue = job.get("queue")
        priority = job.get("priority")
        if isinstance(task, Task):
            # As enqueue(): a Task object brings its own queue and priority defaults.
            path = task.module_path
            queue = task.queue_name if queue is None else queue
            priority = task.priority if priority is None else priority
        elif isinstance(task, str):
            path = self.task_paths.get(task) or self.task_paths.setdefault(
                task, validation.task_path(task)
            )
        else:
            path = validation.task_path(task)  # raises the enqueue() message
        max_attempts = job.get("max_attempts")
        run_at = validation.run_at(job.get("run_at"))
        args_json, kwargs_json = validation.payload(
            job.get("args", ()), job.get("kwargs"), max_bytes=self.max_bytes
        )
        return (
            _backend(job.get("backend", "default")),
            validation.queue_name("default" if queue is None else queue),
            path,
            args_json,
            kwargs_json,
            validation.priority(0 if priority is None else priority),
            "scheduled" if run_at is not None and run_at > self.now else "pending",
            self.max_attempts if max_attempts is None else validation.max_attempts(max_attempts),
            self.now if run_at is None else run_at,
            self.now,
            _ERRORS_EMPTY,
            validation.idempotency_key(job.get("idempotency_key")),
        )


def _backend(value: Any) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= 64:
        raise InvalidJob(
            f"backend must be a Tasks backend alias (1 to 64 characters), not {value!r}"
        )
    return value


def bulk_enqueue(
    jobs: Iterable[Mapping[str, Any]],
    *,
    using: str,
    batch_size: int = DEFAULT_BATCH_SIZE,
    now: dt.datetime | None = None,
) -> BulkResult:
    """Store every job of ``jobs`` or none; return how many were created.

    Each job is a mapping of ``Job.objects.enqueue()``'s arguments (``task`` required)
    with the same defaults and checks. A bad job raises ``InvalidJob`` naming its
    0-based position ("job #5123: ..."), and nothing from the call is kept. Jobs whose
    idempotency key a live job in their queue already holds (or an earlier job of the
    same call) are skipped: counted in ``result.skipped``, not in the result. Idle
    workers are woken once per queue at commit.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, not {batch_size!r}")
    connection = connections[using]
    created = skipped = 0
    queues: set[str] = set()
    with transaction.atomic(using=using), connection.cursor() as cursor:
        cursor.execute(sql.JOB_BULK_CLOCK, {"now": now})
        make_row = _RowMaker(cursor.fetchone()[0])
        cursor.cursor.adapters.register_dumper(None, _JsonTextDumper)
        for first, rows in _validated_batches(jobs, make_row, batch_size):
            try:
                with connection.wrap_database_errors:
                    if any(row[-1] is not None for row in rows):
                        inserted = _insert_dedupe(cursor, rows, make_row.now)
                    else:
                        inserted = _copy(cursor, rows)
            except DatabaseError as exc:
                exc.add_note(f"while writing jobs #{first}..#{first + len(rows) - 1}")
                raise
            created += inserted
            skipped += len(rows) - inserted
            queues.update(row[1] for row in rows)
        if created:
            # One statement per call, whatever the number of rows or queues.
            cursor.execute(
                sql.JOB_NOTIFY_MANY,
                {"channel": settings.NOTIFY_CHANNEL, "queues": sorted(queues)},
            )
    if skipped:
        logger.info(
            "bulk_enqueue: %s jobs created, %s skipped (idempotency key already live)",
            created,
            skipped,
            extra={"action": "bulk_enqueue"},
        )
    else:
        logger.debug("bulk_enqueue: %s jobs created", created, extra={"action": "bulk_enqueue"})
    return BulkResult(created, skipped)


def _validated_batches(
    jobs: Iterable[Any], make_row: _RowMaker, batch_size: int
) -> Iterator[tuple[int, list[tuple[Any, ...]]]]:
    """Yield ``(position of the first job, rows)`` per batch, pulling jobs lazily."""
    rows: list[tuple[Any, ...]] = []
    first = 0
    for position, job in enumerate(jobs):
        try:
            rows.append(make_row(job))
        except InvalidJob as exc:
            raise InvalidJob(f"job #{position}: {exc}") from exc
        if len(rows) == batch_size:
            yield first, rows
            first, rows = position + 1, []
    if rows:
        yield first, rows


def _copy(cursor: Any, rows: Sequence[tuple[Any, ...]]) -> int:
    """COPY one batch; return the row count the server reports."""
    with cursor.copy(sql.JOB_BULK_COPY) as copy:
        copy.set_types(COPY_TYPES)
        for row in rows:
            copy.write_row(row)
    # Leaving the block sent the end of data and checked the final result; the server's
    # count is compared too, so a short write can never pass silently.
    if cursor.rowcount != len(rows):
        raise DatabaseError(f"COPY stored {cursor.rowcount} of {len(rows)} jobs")
    return len(rows)


def _insert_dedupe(cursor: Any, rows: Sequence[tuple[Any, ...]], now: dt.datetime) -> int:
    """INSERT one batch holding idempotency keys; return how many rows were new."""
    columns = dict(zip(COLUMNS, map(list, zip(*rows, strict=True)), strict=True))
    del columns["created_at"], columns["errors"]
    cursor.execute(sql.JOB_BULK_INSERT_DEDUPE, {**columns, "created_at": now})
    return cursor.rowcount


def enqueue_many(
    task: Task,
    calls: Iterable[tuple[Sequence[Any], Mapping[str, Any] | None]],
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> BulkResult:
    """Enqueue ``task`` once per ``(args, kwargs)`` pair of ``calls``, all or nothing.

    The Tasks-framework face of :func:`bulk_enqueue`: ``task.using(queue_name=...,
    priority=..., run_after=..., backend=...)`` apply to every job, and the backend
    must be a ``PgQueueBackend``. Returns the number of jobs created; no ``TaskResult``
    objects are built and no ``task_enqueued`` signals are sent (COPY returns no ids).
    """
    from django.tasks.exceptions import InvalidTask

    from .backend import PgQueueBackend

    backend = task.get_backend()
    if not isinstance(backend, PgQueueBackend):
        raise InvalidTask(
            f"enqueue_many needs a PgQueueBackend; backend {task.backend!r} is "
            f"{type(backend).__name__}"
        )
    backend.validate_task(task)
    common = {
        "task": task,
        "queue": task.queue_name,
        "priority": task.priority,
        "run_at": task.run_after,
        "max_attempts": backend.options.get("MAX_ATTEMPTS"),
        "backend": backend.alias,
    }

    def jobs() -> Iterator[dict[str, Any]]:
        for position, call in enumerate(calls):
            if not isinstance(call, tuple | list) or len(call) != 2:
                raise InvalidJob(
                    f"job #{position}: expected an (args, kwargs) pair, not {call!r:.80}"
                )
            args, kwargs = call
            yield {**common, "args": args, "kwargs": kwargs}

    return bulk_enqueue(jobs(), using=backend.database, batch_size=batch_size)
