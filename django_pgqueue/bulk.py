"""Bulk enqueue: many jobs in one call, through COPY, all or nothing.

Writes are chosen in this order of preference, cheapest per row first:

1. **COPY** (psycopg 3 ``cursor.copy()``, binary format) for every batch it can express:
   jobs without an idempotency key.
2. **A bounded multi-row INSERT** (``INSERT ... SELECT FROM unnest(...) ON CONFLICT DO
   NOTHING``) for batches holding idempotency keys, because COPY has no ON CONFLICT.
3. **One explicit transaction** (a savepoint inside the caller's) around the whole call.
4. **Every error checked**: each statement's error, and COPY's final result, surface as
   Django ``DatabaseError``\\ s; nothing is fired and forgotten.

Jobs are read from the iterable lazily, ``batch_size`` at a time: each batch is
validated completely before its first byte is sent, then written, then dropped, so a
generator of a million jobs is never held in memory. A full batch is COPYed by a helper
thread while the caller's thread validates the next one (see ``BackgroundCopy``), so
the server stores while Python checks.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from django.apps import apps
from django.db import DatabaseError, connections, transaction
from psycopg.abc import Buffer
from psycopg.adapt import Dumper
from psycopg.postgres import types as pg_types
from psycopg.pq import Format

from . import db, defaults, enqueue, schema, validation
from .conf import settings
from .databases import QueueBackend
from .exceptions import InvalidJob
from .framework import NewJob, load_task, to_task_result
from .sql import bulk as sql
from .states import Status
from .taskapi import (
    FRAMEWORK,
    InvalidTask,
    InvalidTaskBackend,
    Task,
    task_backends,
    task_enqueued,
)

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
        "unique_for",
        "debounce",
        "concurrency_key",
        "tags",
    }
)

#: Columns of one row and their PostgreSQL types, as JOB_BULK_COPY lists them.
COLUMNS = tuple(name for name, _ in sql.BULK_COLUMNS)
COPY_TYPES = tuple(type_ for _, type_ in sql.BULK_COLUMNS)

_ERRORS_EMPTY = "[]"
#: The two states a new job starts in, as the plain strings COPY sends.
_PENDING, _SCHEDULED = Status.PENDING.value, Status.SCHEDULED.value

#: Keys of a job whose other values are all defaults (see ``_RowMaker._plain``).
PLAIN_KEYS = frozenset({"task", "args", "kwargs"})


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
    checks. Per-call state: the database clock, and the task paths, queue names and
    backend aliases already checked (a million jobs usually share a handful)."""

    def __init__(self, now: dt.datetime) -> None:
        self.now = now
        self.max_bytes = settings.MAX_PAYLOAD_BYTES
        #: defaults.resolve's answers by defaults.cache_key (a call shares a handful).
        self.resolved: dict[Any, defaults.JobDefaults] = {}
        self.queues: set[str] = set()  # every queue seen, to wake once each
        self.keyed = 0  # jobs with an idempotency key so far
        #: Jobs with a key period (unique_for, debounce): one statement each (enqueue.py).
        self.deferred: list[dict[str, Any]] = []

    def _resolve(self, task: Any, given: dict[str, Any]) -> defaults.JobDefaults:
        key = defaults.cache_key(task, **given)
        resolved = self.resolved.get(key) if key is not None else None
        if resolved is None:
            resolved = defaults.resolve(task, **given)
            self.queues.add(resolved.queue)
            if key is not None and len(self.resolved) < 1000:
                self.resolved[key] = resolved
        return resolved

    def __call__(self, job: Any) -> tuple[Any, ...] | None:
        # type() first: isinstance() against an ABC costs more than the rest of a check.
        if type(job) is not dict and not isinstance(job, Mapping):
            raise InvalidJob(
                f"a job must be a mapping of enqueue() arguments, not {type(job).__name__}"
            )
        if not job.keys() <= JOB_KEYS:
            unknown = ", ".join(sorted(map(repr, job.keys() - JOB_KEYS)))
            raise InvalidJob(f"unknown key {unknown}: use {', '.join(sorted(JOB_KEYS))}")
        get = job.get
        task = get("task")
        if type(task) is str and job.keys() <= PLAIN_KEYS:
            return self._plain(task, get("args", ()), get("kwargs"))
        if task is None:
            raise InvalidJob("task is required")
        given = {
            "backend": get("backend"),
            "queue": get("queue"),
            "priority": get("priority"),
            "max_attempts": get("max_attempts"),
            "concurrency_key": get("concurrency_key"),
        }
        resolved = self._resolve(task, given)
        tags = defaults.job_tags(resolved, get("tags"))
        run_at = validation.run_at(get("run_at"))
        if run_at is None:
            run_at = resolved.run_at
        if run_at is None:
            run_at, status = self.now, _PENDING
        else:
            status = _SCHEDULED if run_at > self.now else _PENDING
        key = get("idempotency_key")
        args, kwargs = get("args", ()), get("kwargs")
        args_json, kwargs_json, concurrency_key = defaults.job_payload(
            resolved, args, kwargs, max_bytes=self.max_bytes
        )
        if get("unique_for") is not None or get("debounce") is not None:
            self.deferred.append(
                self._keyed(job, resolved, args_json, kwargs_json, concurrency_key, tags)
            )
            return None
        if key is not None:
            validation.idempotency_key(key)
            self.keyed += 1
        return (
            resolved.backend,
            resolved.queue,
            resolved.task,
            args_json,
            kwargs_json,
            resolved.priority,
            status,
            resolved.max_attempts,
            run_at,
            self.now,
            _ERRORS_EMPTY,
            key,
            concurrency_key,
            tags,
        )

    def _keyed(
        self,
        job: Mapping[str, Any],
        resolved: defaults.JobDefaults,
        args: str,
        kwargs: str,
        concurrency_key: str,
        tags: list[str],
    ) -> dict[str, Any]:
        """The checked parameters of a job with a key period, for ``enqueue.enqueue_keyed``."""
        params = {
            "backend": resolved.backend,
            "task": resolved.task,
            "queue": resolved.queue,
            "priority": resolved.priority,
            "run_at": validation.run_at(job.get("run_at")) or resolved.run_at,
            "max_attempts": resolved.max_attempts,
            "idempotency_key": validation.idempotency_key(job.get("idempotency_key")),
            "concurrency_key": concurrency_key,
            "soft_time_limit": None,
            "time_limit": None,
            "tags": tags,
            "channel": settings.NOTIFY_CHANNEL,
            "now": self.now,
            "trace_context": None,
            "args": args,
            "kwargs": kwargs,
        }
        return enqueue.checked(
            params,
            job.get("unique_for"),
            job.get("debounce"),
            run_at_given=job.get("run_at") is not None,
        )

    def _plain(self, task: str, args: Any, kwargs: Any) -> tuple[Any, ...]:
        """The row of a job that gives only a task path, args and kwargs (the common
        shape): every other value is the task's and backend's default."""
        resolved = self.resolved.get(task)
        if resolved is None:
            resolved = self.resolved[task] = self._resolve(task, {})
        args_json, kwargs_json, concurrency_key = defaults.job_payload(
            resolved, args, kwargs, max_bytes=self.max_bytes
        )
        if resolved.run_at is None or resolved.run_at <= self.now:
            run_at, status = resolved.run_at or self.now, _PENDING
        else:
            run_at, status = resolved.run_at, _SCHEDULED
        return (
            resolved.backend,
            resolved.queue,
            resolved.task,
            args_json,
            kwargs_json,
            resolved.priority,
            status,
            resolved.max_attempts,
            run_at,
            self.now,
            _ERRORS_EMPTY,
            None,
            concurrency_key,
            list(resolved.tags),
        )


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
    0-based position ("job #5123: ..."), and nothing from the call is kept. A job with
    ``unique_for`` or ``debounce`` is written after the others, one statement each (as
    ``enqueue()`` writes it; not announced to ``task_enqueued``); one that found its
    key's job is counted in ``skipped``. Jobs whose
    idempotency key a live job in their queue already holds (or an earlier job of the
    same call) are skipped: counted in ``result.skipped``, not in the result. Idle
    workers are woken once per queue at commit. When Django's ``task_enqueued`` signal
    has receivers, every job created is sent to them with its real id (see
    ``_Announcer``); without receivers this costs nothing. An unmigrated database
    raises ``NotMigrated``, which says to run ``manage.py migrate``.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, not {batch_size!r}")
    try:
        return _store(jobs, using=using, batch_size=batch_size, now=now)
    except DatabaseError as exc:
        missing = schema.not_migrated(exc, using)
        if missing is None:
            raise
        raise missing from exc


def _store(
    jobs: Iterable[Mapping[str, Any]], *, using: str, batch_size: int, now: dt.datetime | None
) -> BulkResult:
    """``bulk_enqueue`` once its arguments are checked."""
    connection = connections[using]
    created = skipped = 0
    # Receivers of task_enqueued get every job with its id; without any, nothing of
    # this costs anything (the ids come from the table's default, as ever).
    announcer = _Announcer() if wants_announcements() else None
    with transaction.atomic(using=using), connection.cursor() as cursor:
        make_row = _RowMaker(db.clock(using, now))
        cursor.cursor.adapters.register_dumper(None, _JsonTextDumper)
        with BackgroundCopy(connection) as background:
            for first, rows, keyed in _validated_batches(jobs, make_row, batch_size):
                if announcer is not None:
                    # Written one batch after another (no overlap), then announced.
                    with _writing(connection, first, len(rows)):
                        written = announcer.write(cursor, rows, keyed=keyed, now=make_row.now)
                    created += len(written)
                    skipped += len(rows) - len(written)
                    announcer.send(written, make_row.now)
                elif keyed:
                    created += background.wait()
                    with _writing(connection, first, len(rows)):
                        inserted = _insert_dedupe(cursor, rows, make_row.now)
                    created += inserted
                    skipped += len(rows) - inserted
                elif len(rows) == batch_size:  # more may follow: overlap with them
                    created += background.submit(first, rows)
                else:  # the last, short batch: nothing left to overlap with
                    created += background.wait()
                    with _writing(connection, first, len(rows)):
                        created += _copy(cursor, rows)
            created += background.wait()
            if make_row.deferred:
                # Jobs with a key period, one statement each (enqueue.py), in order.
                model = apps.get_model("django_pgqueue", "Job")
                for params in make_row.deferred:
                    made = enqueue.enqueue_keyed(model, using, params)[1]
                    created, skipped = created + made, skipped + (not made)
        if created:
            # One statement per call, whatever the number of rows or queues.
            enqueue.notify_queues(using, make_row.queues)
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
) -> Iterator[tuple[int, list[tuple[Any, ...]], bool]]:
    """Yield ``(position of the first job, rows, whether any has a key)`` per batch,
    pulling jobs lazily."""
    rows: list[tuple[Any, ...]] = []
    first = keyed_before = 0
    for position, job in enumerate(jobs):
        try:
            row = make_row(job)
        except InvalidJob as exc:
            raise InvalidJob(f"job #{position}: {exc}") from exc
        if row is not None:  # None: a job with a key period, written later
            rows.append(row)
        if len(rows) == batch_size:
            yield first, rows, make_row.keyed > keyed_before
            first, rows, keyed_before = position + 1, [], make_row.keyed
    if rows:
        yield first, rows, make_row.keyed > keyed_before


def _copy(
    cursor: Any, rows: Sequence[tuple[Any, ...]], started: threading.Event | None = None
) -> int:
    """COPY one batch; return the row count the server reports. ``started`` is set
    once the COPY holds the connection's lock (or has failed to start)."""
    return copy_rows(cursor, sql.JOB_BULK_COPY, COPY_TYPES, rows, started)


def accept_json_text(cursor: Any) -> None:
    """Let ``cursor`` (a psycopg cursor) COPY jsonb columns from JSON text as made by
    ``validation.payload`` (binary COPY applies no casts)."""
    cursor.adapters.register_dumper(None, _JsonTextDumper)


def copy_rows(
    cursor: Any,
    query: str,
    types: Sequence[str],
    rows: Sequence[tuple[Any, ...]],
    started: threading.Event | None = None,
) -> int:
    """COPY ``rows`` (one bounded batch, in binary, ``types`` per column) with
    ``query`` (a COPY statement of sql/bulk.py or sql/workflow.py), on a psycopg cursor that
    :func:`accept_json_text`; return the row count the server reports. ``started`` is
    set once the COPY holds the connection's lock (or has failed to start)."""
    try:
        with cursor.copy(query) as copy:
            if started is not None:
                started.set()
            copy.set_types(types)
            for row in rows:
                copy.write_row(row)
    finally:
        if started is not None:
            started.set()
    # Leaving the block sent the end of data and checked the final result; the server's
    # count is compared too, so a short write can never pass silently.
    if cursor.rowcount != len(rows):
        raise DatabaseError(f"COPY stored {cursor.rowcount} of {len(rows)} rows")
    return len(rows)


@contextmanager
def _writing(connection: Any, first: int, count: int) -> Iterator[None]:
    """Raise database errors as Django's, noting which jobs were being written."""
    try:
        with connection.wrap_database_errors:
            yield
    except DatabaseError as exc:
        exc.add_note(f"while writing jobs #{first}..#{first + count - 1}")
        raise


class BackgroundCopy:
    """COPYs full batches on a helper thread while the caller's thread validates the
    next one, so the server stores batch k while Python checks batch k+1.

    At most one batch is in flight, so memory stays at two batches. A job iterable that
    queries the same database (``queryset.iterator()``) stays safe: psycopg holds the
    connection's lock from the start of a COPY to its end, so such a query waits for
    the COPY instead of interleaving with it; and ``submit`` returns only once the COPY
    holds that lock, so later queries see the batch. Django's connection object is not
    touched from the helper thread, only the psycopg connection under it.
    """

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.pool: ThreadPoolExecutor | None = None
        self.cursor: Any = None
        self.pending: tuple[int, int, Future[int]] | None = None

    def submit(
        self,
        first: int,
        rows: list[tuple[Any, ...]],
        *,
        statement: str = sql.JOB_BULK_COPY,
        types: Sequence[str] = COPY_TYPES,
    ) -> int:
        """Start writing ``rows`` (with ``statement``, of ``types``: the jobs of
        ``sql.BULK_COLUMNS`` unless told); return what the previous batch stored."""
        created = self.wait()
        if self.pool is None:
            self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pgqueue-bulk")
            self.cursor = self.connection.connection.cursor()
            self.cursor.adapters.register_dumper(None, _JsonTextDumper)
        started = threading.Event()
        future = self.pool.submit(copy_rows, self.cursor, statement, types, rows, started)
        self.pending = (first, len(rows), future)
        started.wait()
        return created

    def wait(self) -> int:
        """Rows the batch in flight stored (0 if none); raise its error, noted."""
        if self.pending is None:
            return 0
        first, count, future = self.pending
        self.pending = None
        with _writing(self.connection, first, count):
            return future.result()

    def __enter__(self) -> BackgroundCopy:
        return self

    def __exit__(self, kind: Any, error: BaseException | None, traceback: Any) -> None:
        """Close; while an error is raised, the error of the batch still in flight (if
        any) goes into a note of it rather than being lost."""
        also = self.close()
        if error is not None and also is not None:
            error.add_note(f"writing an earlier batch failed too: {also!r}")

    def close(self) -> BaseException | None:
        """Wait for the batch in flight and stop the thread; return (not raise) the
        error of that batch, for a caller that is already raising another one."""
        error = None
        if self.pending is not None:
            error = self.pending[2].exception()
            self.pending = None
        if self.pool is not None:
            self.pool.shutdown()
            self.cursor.close()
            self.pool = None
        return error


def wants_announcements() -> bool:
    """True if ``task_enqueued`` has a receiver for a pgqueue backend's jobs, other than
    the framework's own debug-log receiver while its logger ignores debug."""
    senders: set[type] = {type(b) for b in task_backends.all() if isinstance(b, QueueBackend)}
    for sender in senders:
        sync, async_ = task_enqueued._live_receivers(sender)
        if async_ or any(not _quiet_log_receiver(r) for r in sync):
            return True
    return False


def _quiet_log_receiver(receiver: Any) -> bool:
    """The framework's ``log_task_enqueued`` (Django's, or the backport's), while the
    logger it writes to would drop its debug line anyway."""
    if getattr(receiver, "__name__", "") != "log_task_enqueued":
        return False
    module = sys.modules.get(getattr(receiver, "__module__", ""))
    log = getattr(module, "logger", None)
    return isinstance(log, logging.Logger) and not log.isEnabledFor(logging.DEBUG)


class _Announcer:
    """Sends ``task_enqueued`` for bulk-enqueued jobs, as ``PgQueueBackend.enqueue()``
    does for one: with the backend's class as sender and a ``TaskResult`` carrying the
    job's real id. Ids are taken from the sequence first, one round trip per batch
    (``sql.JOB_BULK_IDS``), and written explicitly, since COPY returns nothing.

    Like ``enqueue()``'s, the signal is sent once the batch is written, inside the
    call's transaction: receivers that must see only committed jobs should use
    ``transaction.on_commit``. A receiver that raises aborts the whole call."""

    def __init__(self) -> None:
        self.tasks: dict[str, Task] = {}
        self.senders: dict[str, type] = {}

    def write(
        self, cursor: Any, rows: Sequence[tuple[Any, ...]], *, keyed: bool, now: dt.datetime
    ) -> list[tuple[int, tuple[Any, ...]]]:
        """Write ``rows`` with ids from the sequence; return ``(id, row)`` of each job
        created (a job skipped for its idempotency key is not)."""
        ids = take_ids(cursor, len(rows))
        if keyed:
            columns = array_columns(rows)
            cursor.execute(
                sql.JOB_BULK_INSERT_DEDUPE_WITH_IDS, {**columns, "id": ids, "created_at": now}
            )
            inserted = {row[0] for row in cursor.fetchall()}
            return [(id_, row) for id_, row in zip(ids, rows, strict=True) if id_ in inserted]
        with cursor.copy(sql.JOB_BULK_COPY_WITH_IDS) as copy:
            copy.set_types(("int8", *COPY_TYPES))
            for id_, row in zip(ids, rows, strict=True):
                copy.write_row((id_, *row))
        if cursor.rowcount != len(rows):
            raise DatabaseError(f"COPY stored {cursor.rowcount} of {len(rows)} jobs")
        return list(zip(ids, rows, strict=True))

    def send(self, written: Sequence[tuple[int, tuple[Any, ...]]], now: dt.datetime) -> None:
        for id_, row in written:
            backend, _queue, path, args, kwargs = row[:5]
            task = self.tasks.get(path)
            if task is None:
                task = self.tasks[path] = load_task(path)
            sender = self.senders.get(backend)
            if sender is None:
                sender = self.senders[backend] = _backend_class(backend)
            job = NewJob(
                id=id_,
                backend=backend,
                args=json.loads(args),
                kwargs=json.loads(kwargs),
                created_at=now,
            )
            task_enqueued.send(sender, task_result=to_task_result(job, task))


def take_ids(cursor: Any, count: int) -> list[int]:
    """``count`` new job ids from the jobs' sequence, ascending (``sql.JOB_BULK_IDS``),
    for rows written with explicit ids (announced bulk jobs, a workflow's graph)."""
    cursor.execute(sql.JOB_BULK_IDS, {"count": count})
    return sorted(row[0] for row in cursor.fetchall())


def _backend_class(alias: str) -> type:
    """The sender ``PgQueueBackend.enqueue()`` uses for jobs of backend ``alias``: the
    class of that backend (validated at enqueue, so it exists)."""
    try:
        return type(task_backends[alias])
    except InvalidTaskBackend:
        return QueueBackend


def array_text(tags: Sequence[str]) -> str:
    """A job's tags as PostgreSQL array text (``{"a","b"}``), for a statement that takes
    one array per column: an array of arrays would be one two-dimensional array. Tags
    hold no quote, backslash or brace (``validation.TAG_RE``); each is quoted so that a
    tag spelled NULL stays a tag."""
    return "{" + ",".join(f'"{tag}"' for tag in tags) + "}"


def array_columns(rows: Sequence[tuple[Any, ...]]) -> dict[str, list[Any]]:
    """A batch's rows as one list per column, as the multi-row INSERTs take them (less
    the columns they fill themselves)."""
    columns = dict(zip(COLUMNS, map(list, zip(*rows, strict=True)), strict=True))
    del columns["created_at"], columns["errors"]
    columns["tags"] = [array_text(tags) for tags in columns["tags"]]
    return columns


def _insert_dedupe(cursor: Any, rows: Sequence[tuple[Any, ...]], now: dt.datetime) -> int:
    """INSERT one batch holding idempotency keys; return how many rows were new."""
    columns = array_columns(rows)
    cursor.execute(sql.JOB_BULK_INSERT_DEDUPE, {**columns, "created_at": now})
    return cursor.rowcount


#: What a call of ``enqueue_many`` may give beyond its args and kwargs.
CALL_OPTIONS = frozenset({"idempotency_key", "unique_for", "debounce", "concurrency_key", "tags"})


def enqueue_many(
    task: Task,
    calls: Iterable[tuple[Sequence[Any], Mapping[str, Any] | None]],
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> BulkResult:
    """Enqueue ``task`` once per ``(args, kwargs)`` pair of ``calls``, all or nothing. A
    call may be ``(args, kwargs, options)``: ``idempotency_key`` and ``unique_for`` or
    ``debounce``, ``concurrency_key`` and ``tags``, as ``Job.objects.enqueue()`` takes them.

    The Tasks-framework face of :func:`bulk_enqueue`: ``task.using(queue_name=...,
    priority=..., run_after=..., backend=...)`` apply to every job, and the backend
    must be a ``PgQueueBackend``. Returns the number of jobs created. No ``TaskResult``
    objects are returned; when ``task_enqueued`` has receivers, each job is announced
    to them with its id (see :func:`bulk_enqueue`).
    """
    if not isinstance(task, Task):
        raise InvalidTask(f"enqueue_many needs a {FRAMEWORK}.Task, not {type(task).__name__}")
    backend = task.get_backend()
    if not isinstance(backend, QueueBackend):
        raise InvalidTask(
            f"enqueue_many needs a PgQueueBackend; backend {task.backend!r} is "
            f"{type(backend).__name__}"
        )
    backend.validate_task(task)
    # The task brings its queue, priority, run time and backend (defaults.resolve).
    common = {"task": task}

    def jobs() -> Iterator[dict[str, Any]]:
        for position, call in enumerate(calls):
            if not isinstance(call, tuple | list) or len(call) not in (2, 3):
                raise InvalidJob(
                    f"job #{position}: expected an (args, kwargs) pair or an (args, "
                    f"kwargs, options) triple, not {call!r:.80}"
                )
            options: Any = call[2] if len(call) == 3 else {}
            if not isinstance(options, Mapping):
                raise InvalidJob(
                    f"job #{position}: expected an (args, kwargs) pair or an (args, "
                    f"kwargs, options) triple, not {call!r:.80}"
                )
            if not options.keys() <= CALL_OPTIONS:
                raise InvalidJob(
                    f"job #{position}: options must be a mapping of "
                    f"{', '.join(sorted(CALL_OPTIONS))}, not {options!r:.80}"
                )
            yield {**common, **options, "args": call[0], "kwargs": call[1]}

    return bulk_enqueue(jobs(), using=backend.database, batch_size=batch_size)
