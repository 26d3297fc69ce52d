"""``Job.objects``: the queue's operations, each one parameterised statement from sql.py.

The manager holds no SQL text. Methods that write return materialised lists (a lazy
``RawQuerySet`` would run its UPDATE again each time it is iterated).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import operator
import time
import traceback
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, connections, models, transaction
from django.db.models import signals
from django.db.models.base import ModelState

from . import bulk, prepared, schema, sql, tracing, validation
from .conf import settings
from .taskapi import Task
from .tasks import task_option

if TYPE_CHECKING:
    from .models import Job

#: Upper bound on batches in one sweep pass, so a pass always ends even under churn.
MAX_SWEEP_BATCHES = 100


@dataclass(frozen=True)
class SweepResult:
    """What one sweep pass changed."""

    recovered: int = 0  # expired leases returned to pending
    dead: int = 0  # expired leases on their last attempt, dead-lettered
    promoted: int = 0  # due scheduled jobs made pending
    pruned: int = 0  # done jobs past retention deleted
    periodic: int = 0  # ticks of periodic entries enqueued (see periodic.py)
    cancelled: int = 0  # expired leases of jobs whose cancellation was requested
    lost_workers: int = 0  # rows of workers lost for longer than LOST_WORKER_SECONDS

    def __bool__(self) -> bool:
        return any(
            (
                self.recovered,
                self.dead,
                self.promoted,
                self.pruned,
                self.periodic,
                self.cancelled,
                self.lost_workers,
            )
        )


@dataclass(frozen=True)
class CancelResult:
    """What ``Job.objects.cancel()`` did: ``cancelled`` pending or scheduled jobs (they
    will never run), and ``requested`` running jobs whose worker will stop them at its
    next lease extension. Other ids (finished, unknown) are in neither."""

    cancelled: list[int]
    requested: list[int]


class Owned(set[int]):
    """The ids ``extend_leases`` still owns, and which of them were asked to cancel."""

    cancel_requested: frozenset[int] = frozenset()


def error_entry(exc: BaseException, *, worker_id: str, attempt: int) -> dict[str, Any]:
    """The JSON stored for one failed attempt (Django's ``TaskError`` fields + context)."""
    cls = type(exc)
    return {
        "exception_class_path": f"{cls.__module__}.{cls.__qualname__}",
        # A NUL or lone surrogate in a message would make jsonb refuse the whole write.
        "traceback": validation.storable_text("".join(traceback.format_exception(exc))),
        "worker_id": worker_id,
        "attempt": attempt,
    }


#: How often ``cancel()`` tries again a job locked at that instant (being claimed or
#: completed), and how long it waits in between.
CANCEL_ROUNDS = 5
CANCEL_RETRY_DELAY = 0.05


def _chunks(ids: Iterable[int], size: int) -> Iterator[list[int]]:
    """Distinct ids in ascending order, ``size`` at a time (a stable lock order)."""
    ordered = sorted({int(i) for i in ids})
    for start in range(0, len(ordered), size):
        yield ordered[start : start + size]


class JobManager(models.Manager["Job"]):
    """Runs the statements of ``sql.py`` against the jobs database."""

    # --- plumbing -------------------------------------------------------------------

    @property
    def db_alias(self) -> str:
        """The database named with ``db_manager()``/``using()``, else the default
        backend's jobs database (``databases.default_database``)."""
        from .databases import default_database

        return self._db or default_database()

    def _jobs(self, query: str, params: dict[str, Any]) -> list[Job]:
        """Run a claim statement; materialise the rows it returns as ``Job``s.

        What ``RawQuerySet`` would give (fields matched by column name, the fields' own
        database converters, extra columns set as attributes) at a fraction of its cost,
        since a worker runs this for every batch it claims and every row costs:

        * the statement is bound on the server (``prepared.py``), so no parameter is
          quoted in Python. On a worker's claim connection (``configure_claim_session``)
          it is prepared as well, planned once with the generic plan that session's
          settings leave (the ordered index scan); anywhere else it is planned for its
          parameters every time, since a generic plan made with the default settings
          sorts the whole backlog (42 ms a claim at 200,000 pending, 0.34 ms planned);
        * timestamps are read by psycopg's own (C) loader instead of Django's wrapper
          of it, where both give the same value (``prepared.cursor``);
        * JSON columns are decoded with ``json.loads``, as ``JSONField`` does;
        * each ``Job`` is built from its values as ``Model.from_db`` builds it, minus
          the ``pre_init``/``post_init`` signals, unless something receives them."""
        alias = self.db_alias
        connection = connections[alias]
        try:
            connection.ensure_connection()
            generic = getattr(connection.connection, "_pgqueue_claims_prepared", False)
            with prepared.cursor(alias, prepare=generic) as cursor:
                cursor.execute(query, params)
                columns = tuple(column.name for column in cursor.description)
                rows = cursor.fetchall()
        except DatabaseError as exc:
            self._raise_if_not_migrated(exc)
            raise
        if not rows:
            return []
        model = self.model
        position = {name: i for i, name in enumerate(columns)}
        fields = model._meta.concrete_fields
        if any(f.column not in position for f in fields):
            # Not every column (never the case for the statements of sql.py).
            return list(model.objects.db_manager(alias).raw(query, params))
        json_columns = []
        converters = []
        for f in fields:
            if isinstance(f, models.JSONField) and f.decoder is None:
                json_columns.append(position[f.column])
            elif f.get_db_converters(connection):
                converters.append((position[f.column], f.get_db_converters(connection)))
        known = {f.column for f in fields}
        extra = [(name, i) for i, name in enumerate(columns) if name not in known]
        names = [f.attname for f in fields]
        pick = operator.itemgetter(*(position[f.column] for f in fields))
        watched = signals.pre_init.has_listeners(model) or signals.post_init.has_listeners(model)
        loads = json.loads
        jobs = []
        for row in rows:
            values = list(row)
            for i in json_columns:
                if values[i] is not None:
                    values[i] = loads(values[i])
            for i, funcs in converters:
                for func in funcs:
                    values[i] = func(values[i], None, connection)
            if not watched:
                job = model.__new__(model)
                job.__dict__.update(zip(names, pick(values), strict=True))
                state = job._state = ModelState()
                state.adding = False
                state.db = alias
            else:
                job = model.from_db(alias, names, pick(values))
            for name, i in extra:
                setattr(job, name, values[i])
            jobs.append(job)
        return jobs

    def _rows(
        self, query: str, params: dict[str, Any], *, prepare: bool = False
    ) -> list[tuple[Any, ...]]:
        """Run ``query``; its rows (none if it returns none). ``prepare``: through a
        cursor of ``prepared.py`` (bound on the server, prepared where allowed), for
        the statements a worker runs for every batch."""
        try:
            alias = self.db_alias
            opened = prepared.cursor(alias) if prepare else connections[alias].cursor()
            with opened as cursor:
                cursor.execute(query, params)
                return cursor.fetchall() if cursor.description else []
        except DatabaseError as exc:
            self._raise_if_not_migrated(exc)
            raise

    def _rowcount(self, query: str, params: dict[str, Any]) -> int:
        try:
            with connections[self.db_alias].cursor() as cursor:
                cursor.execute(query, params)
                return cursor.rowcount
        except DatabaseError as exc:
            self._raise_if_not_migrated(exc)
            raise

    def _raise_if_not_migrated(self, exc: DatabaseError) -> None:
        """Raise ``NotMigrated`` ("run manage.py migrate") instead of ``exc`` if ``exc``
        says the jobs table or one of its columns is missing; else return."""
        missing = schema.not_migrated(exc, self.db_alias)
        if missing is not None:
            raise missing from exc

    # --- enqueue --------------------------------------------------------------------

    def enqueue(
        self,
        task: Task | str,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        queue: str | None = None,
        priority: int | None = None,
        run_at: dt.datetime | None = None,
        max_attempts: int | None = None,
        idempotency_key: str | None = None,
        backend: str = "default",
        now: dt.datetime | None = None,
    ) -> Job:
        """Store one job and wake idle workers at commit; return it.

        Joins the caller's transaction: if that rolls back there is no job and no
        wake-up. Everything is validated first; a bad value raises ``InvalidJob``
        naming it and writes nothing. With an ``idempotency_key`` that a live job in
        the same queue already holds, that job is returned and nothing is inserted.
        ``queue``, ``priority`` and ``run_at`` default to the Task's own (its
        ``queue_name``, ``priority`` and ``run_after``; else "default", 0 and now).
        """
        path = validation.task_path(task)
        if isinstance(task, Task):
            queue = task.queue_name if queue is None else queue
            priority = task.priority if priority is None else priority
            run_at = task.run_after if run_at is None else run_at
            if max_attempts is None:  # @task(max_attempts=...) of PgQueueTask
                max_attempts = task_option(task, "max_attempts")
        params: dict[str, Any] = {
            "backend": validation.backend_alias(backend),
            "task": path,
            "queue": validation.queue_name("default" if queue is None else queue),
            "priority": validation.priority(0 if priority is None else priority),
            "run_at": validation.run_at(run_at),
            "max_attempts": validation.max_attempts(
                settings.MAX_ATTEMPTS if max_attempts is None else max_attempts
            ),
            "idempotency_key": validation.idempotency_key(idempotency_key),
            "channel": settings.NOTIFY_CHANNEL,
            "now": now,
        }
        context = tracing.carrier()
        params["trace_context"] = None if context is None else json.dumps(context)
        params["args"], params["kwargs"] = validation.payload(
            args, kwargs, max_bytes=settings.MAX_PAYLOAD_BYTES
        )
        for _ in range(5):
            try:
                with prepared.cursor(self.db_alias) as cursor:
                    cursor.execute(sql.JOB_ENQUEUE, params)
                    row = cursor.fetchone()
            except DatabaseError as exc:
                self._raise_if_not_migrated(exc)
                raise
            if row is not None:
                return self._enqueued(params, row)
            # ON CONFLICT: a live job holds the key. It may finish between the insert
            # and this read, in which case the insert is tried again.
            existing = self.live_with_key(params["queue"], params["idempotency_key"])
            if existing is not None:
                return existing
        raise RuntimeError("idempotency key kept changing hands; giving up")

    def _enqueued(self, params: dict[str, Any], row: tuple[Any, ...]) -> Job:
        """The ``Job`` ``JOB_ENQUEUE`` stored: the database's id, status and times, the
        rest from what was sent (args and kwargs as jsonb gives them back)."""
        job_id, status, run_at, created_at, _ = row
        trace_context = params.get("trace_context")
        known: dict[str, Any] = {
            "id": job_id,
            "backend": params["backend"],
            "queue": params["queue"],
            "task": params["task"],
            "args": json.loads(params["args"]),
            "kwargs": json.loads(params["kwargs"]),
            "priority": params["priority"],
            "status": status,
            "attempts": 0,
            "max_attempts": params["max_attempts"],
            "run_at": run_at,
            "idempotency_key": params["idempotency_key"],
            "errors": [],
            "created_at": created_at,
            "trace_context": None if trace_context is None else json.loads(trace_context),
        }
        # Every other column of a new job is NULL (lease, result, timestamps, flags).
        names = _field_names(self.model)
        return self.model.from_db(self.db_alias, names, [known.get(name) for name in names])

    def bulk_enqueue(
        self,
        jobs: Iterable[Mapping[str, Any]],
        *,
        batch_size: int = bulk.DEFAULT_BATCH_SIZE,
        now: dt.datetime | None = None,
    ) -> int:
        """Store many jobs (mappings of ``enqueue()``'s arguments) all or nothing,
        through COPY in bounded batches; return how many were created.

        The result is a ``bulk.BulkResult``: an ``int`` whose ``skipped`` attribute
        counts jobs left out because their idempotency key was already live. See
        ``django_pgqueue.bulk.bulk_enqueue``.
        """
        return bulk.bulk_enqueue(jobs, using=self.db_alias, batch_size=batch_size, now=now)

    def live_with_key(self, queue: str, key: str | None) -> Job | None:
        from .models import LIVE_STATUSES

        return (
            self.db_manager(self.db_alias)
            .filter(queue=queue, idempotency_key=key, status__in=LIVE_STATUSES)
            .first()
        )

    # --- the worker's statements ----------------------------------------------------

    def claim(
        self,
        worker_id: str,
        *,
        limit: int,
        queues: Iterable[str] | None = None,
        lease_seconds: float | None = None,
        after: tuple[int, int] | None = None,
        now: dt.datetime | None = None,
    ) -> list[Job]:
        """Lease up to ``limit`` pending jobs to ``worker_id``, highest priority first.

        ``queues``: only those (through the per-queue claim index). ``after``: the
        ``(priority, id)`` of the last job of this worker's previous claim of all
        queues; the claim resumes there instead of at the head of the claim index
        (see ``sql.JOB_CLAIM_AFTER``), and may miss jobs of that priority behind it."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"claim limit must be an int >= 1, not {limit!r}")
        params: dict[str, Any] = {
            "worker_id": worker_id,
            "limit": limit,
            "lease_seconds": settings.LEASE_SECONDS if lease_seconds is None else lease_seconds,
            "now": now,
        }
        if queues is not None:
            if after is not None:
                raise ValueError("claim(after=...) is for claims of all queues")
            query = sql.JOB_CLAIM_QUEUES
            params["queues"] = list(queues)
        elif after is not None:
            query = sql.JOB_CLAIM_AFTER
            params["after_priority"], params["after_id"] = after
        else:
            query = sql.JOB_CLAIM
        jobs = self._jobs(query, params)
        jobs.sort(key=lambda job: (-job.priority, job.id))
        return jobs

    def extend_leases(
        self,
        worker_id: str,
        jobs: Iterable[Job | int],
        *,
        lease_seconds: float | None = None,
        now: dt.datetime | None = None,
    ) -> Owned:
        """Extend the leases ``worker_id`` still holds; return the ids it still owns
        (``Owned``, a set whose ``cancel_requested`` holds those to stop).

        Give ``Job`` objects (as ``claim`` returned them) to fence on the attempt and its
        claim time as well as the owner; plain ids fence on the owner only. An id missing
        from the result is a lost lease.
        """
        owned = sorted(
            (
                (j, None, None) if isinstance(j, int) else (j.id, j.attempts, j.last_attempted_at)
                for j in jobs
            ),
            key=lambda o: o[0],  # ascending ids: a stable lock order
        )
        if not owned:
            return Owned()
        rows = self._rows(
            sql.JOB_EXTEND_LEASES,
            {
                "worker_id": worker_id,
                "ids": [o[0] for o in owned],
                "attempts": [o[1] for o in owned],
                "claimed_at": [o[2] for o in owned],
                "lease_seconds": settings.LEASE_SECONDS
                if lease_seconds is None
                else lease_seconds,
                "now": now,
            },
        )
        result = Owned(row[0] for row in rows)
        result.cancel_requested = frozenset(row[0] for row in rows if row[1])
        return result

    def complete(
        self,
        job: Job,
        worker_id: str,
        *,
        result: Any = None,
        now: dt.datetime | None = None,
    ) -> bool:
        """Mark ``job`` done. False (and no change) if ``worker_id`` lost the lease."""
        return self.complete_status(job, worker_id, result=result, now=now) is not None

    def complete_status(
        self,
        job: Job,
        worker_id: str,
        *,
        result: Any = None,
        now: dt.datetime | None = None,
    ) -> str | None:
        """``complete()``, returning the new status: ``done``, or ``cancelled`` if the
        job's cancellation was requested; None if ``worker_id`` lost the lease."""
        rows = self._rows(
            sql.JOB_COMPLETE,
            {
                "id": job.id,
                "worker_id": worker_id,
                "attempt": job.attempts,
                "claimed_at": job.last_attempted_at,
                "result": validation.result_json(result),
                "now": now,
            },
        )
        return rows[0][1] if rows else None

    def complete_many(
        self,
        completions: Sequence[tuple[Job, Any]],
        worker_id: str,
        *,
        now: dt.datetime | None = None,
        encoded: bool = False,
    ) -> list[bool]:
        """Mark many ``(job, result)`` done in one statement, each fenced like
        ``complete()``; return, in input order, whether each was recorded (False: that
        lease was lost, and the job is unchanged). Results must be JSON-safe
        (``validation.result_json`` is applied to each), or, with ``encoded``, already
        the JSON text ``validation.result_json`` made of them (the worker's runner made
        it when the task returned: encoding it again here would double that work)."""
        if not completions:
            return []
        # Ascending ids: the lock order of the heartbeat's JOB_EXTEND_LEASES.
        order = sorted(range(len(completions)), key=lambda i: completions[i][0].id)
        jobs = [completions[i][0] for i in order]
        rows = self._rows(
            sql.JOB_COMPLETE_MANY,
            {
                "worker_id": worker_id,
                "ids": [job.id for job in jobs],
                "attempts": [job.attempts for job in jobs],
                "claimed_at": [job.last_attempted_at for job in jobs],
                "results": [
                    completions[i][1] if encoded else validation.result_json(completions[i][1])
                    for i in order
                ],
                "now": now,
            },
            prepare=True,
        )
        recorded = [False] * len(completions)
        for (ord_,) in rows:
            recorded[order[ord_ - 1]] = True
        return recorded

    def fail(
        self,
        job: Job,
        worker_id: str,
        exc: BaseException,
        *,
        retry: bool = True,
        now: dt.datetime | None = None,
    ) -> str | None:
        """Record a failed attempt; return the new status (``scheduled`` for a retry
        with backoff, ``dead`` when attempts are used up or ``retry`` is False), or
        None if ``worker_id`` lost the lease (nothing changes)."""
        rows = self._rows(
            sql.JOB_FAIL,
            {
                "id": job.id,
                "worker_id": worker_id,
                "attempt": job.attempts,
                "claimed_at": job.last_attempted_at,
                "retry": retry,
                "backoff_base": float(settings.RETRY_BACKOFF_BASE),
                "backoff_max": float(settings.RETRY_BACKOFF_MAX),
                "keep_errors": settings.KEEP_ERRORS,
                "error": json.dumps(error_entry(exc, worker_id=worker_id, attempt=job.attempts)),
                "now": now,
            },
        )
        return rows[0][0] if rows else None

    def release(self, job: Job, worker_id: str) -> bool:
        """Give an unstarted claimed job back to pending without charging the attempt."""
        return bool(
            self._rows(
                sql.JOB_RELEASE,
                {
                    "id": job.id,
                    "worker_id": worker_id,
                    "attempt": job.attempts,
                    "claimed_at": job.last_attempted_at,
                    "now": None,
                },
            )
        )

    # --- dead letters and the admin ------------------------------------------------

    def requeue_dead(
        self,
        ids: Iterable[int],
        *,
        queue: str | None = None,
        priority: int | None = None,
        now: dt.datetime | None = None,
    ) -> list[int]:
        """Put dead jobs back to pending (attempts reset, due now, errors kept), in
        ``queue``/with ``priority`` if given; wake workers at commit. Return the ids
        that changed: ids no longer dead (requeued or discarded meanwhile) and ids whose
        idempotency key a live job holds are left alone. One guarded statement per
        ``SWEEP_BATCH_SIZE`` ids."""
        params: dict[str, Any] = {
            "queue": None if queue is None else validation.queue_name(queue),
            "priority": None if priority is None else validation.priority(priority),
            "channel": settings.NOTIFY_CHANNEL,
            "now": now,
        }
        requeued: list[int] = []
        for chunk in _chunks(ids, settings.SWEEP_BATCH_SIZE):
            rows = self._rows(sql.JOB_REQUEUE_DEAD, {**params, "ids": chunk})
            requeued.extend(row[0] for row in rows)
        return sorted(requeued)

    def cancel(self, ids: Iterable[int], *, now: dt.datetime | None = None) -> CancelResult:
        """Cancel jobs by id. Pending and scheduled ones become ``cancelled`` at once;
        running ones are marked, and their worker stops them at its next lease extension
        (they end ``cancelled`` whatever their outcome). Finished and unknown ids are left
        alone. One statement per ``SWEEP_BATCH_SIZE`` ids; a job locked at that instant
        (being claimed or completed) is tried again a few times, then left as it is."""
        cancelled: list[int] = []
        requested: list[int] = []
        for chunk in _chunks(ids, settings.SWEEP_BATCH_SIZE):
            for round_ in range(CANCEL_ROUNDS):
                busy = []
                for job_id, status in self._rows(sql.JOB_CANCEL, {"ids": chunk, "now": now}):
                    if status == "cancelled":
                        cancelled.append(job_id)
                    elif status == "running":
                        requested.append(job_id)
                    else:
                        busy.append(job_id)
                if not busy:
                    break
                chunk = busy
                if round_ < CANCEL_ROUNDS - 1:
                    time.sleep(CANCEL_RETRY_DELAY)
        return CancelResult(cancelled=sorted(cancelled), requested=sorted(requested))

    def discard_dead(self, ids: Iterable[int]) -> list[int]:
        """Delete dead jobs by id; return the ids deleted (never a job that stopped
        being dead meanwhile)."""
        deleted: list[int] = []
        for chunk in _chunks(ids, settings.SWEEP_BATCH_SIZE):
            deleted.extend(row[0] for row in self._rows(sql.JOB_DELETE_DEAD, {"ids": chunk}))
        return sorted(deleted)

    # --- maintenance ----------------------------------------------------------------

    def rescue_expired(self, *, now: dt.datetime | None = None) -> tuple[int, int, int]:
        """Return expired leases to pending (or dead on the last attempt, or cancelled if
        their cancellation was requested), in bounded batches. Returns (recovered, dead,
        cancelled)."""
        recovered = dead = cancelled = 0
        params: dict[str, Any] = {
            "now": now,
            "batch_size": settings.SWEEP_BATCH_SIZE,
            "keep_errors": settings.KEEP_ERRORS,
        }
        for _ in range(MAX_SWEEP_BATCHES):
            rows = self._rows(sql.JOB_RESCUE_EXPIRED, params)
            dead += sum(1 for _, status in rows if status == "dead")
            recovered += sum(1 for _, status in rows if status == "pending")
            cancelled += sum(1 for _, status in rows if status == "cancelled")
            if len(rows) < params["batch_size"]:
                break
        return recovered, dead, cancelled

    def promote_due(self, *, now: dt.datetime | None = None, batch_size: int | None = None) -> int:
        """Make due scheduled jobs pending and wake workers for their queues."""
        size = batch_size or settings.SWEEP_BATCH_SIZE
        promoted = 0
        for _ in range(MAX_SWEEP_BATCHES):
            with transaction.atomic(using=self.db_alias):
                rows = self._rows(sql.JOB_PROMOTE_DUE, {"now": now, "batch_size": size})
                for queue in sorted({row[0] for row in rows}):
                    self.notify(queue)
            promoted += len(rows)
            if len(rows) < size or batch_size:
                break
        return promoted

    def prune_finished(self, *, now: dt.datetime | None = None) -> int:
        """Delete done jobs older than ``PGQUEUE_RETENTION_SECONDS``, in batches."""
        pruned = 0
        params: dict[str, Any] = {
            "now": now,
            "batch_size": settings.SWEEP_BATCH_SIZE,
            "retention_seconds": float(settings.RETENTION_SECONDS),
        }
        for _ in range(MAX_SWEEP_BATCHES):
            count = self._rowcount(sql.JOB_DELETE_FINISHED_BEFORE, params)
            pruned += count
            if count < params["batch_size"]:
                break
        return pruned

    def sweep(self, *, now: dt.datetime | None = None) -> SweepResult:
        """One bounded maintenance pass; safe to run from several processes at once."""
        recovered, dead, cancelled = self.rescue_expired(now=now)
        return SweepResult(
            recovered=recovered,
            dead=dead,
            cancelled=cancelled,
            promoted=self.promote_due(now=now),
            pruned=self.prune_finished(now=now),
            lost_workers=self.prune_lost_workers(now=now),
        )

    def prune_lost_workers(self, *, now: dt.datetime | None = None) -> int:
        """Delete the rows of workers not seen for longer than their lease plus
        ``PGQUEUE_LOST_WORKER_SECONDS``, in bounded batches."""
        batch_size = int(settings.SWEEP_BATCH_SIZE)
        params: dict[str, Any] = {
            "now": now,
            "batch_size": batch_size,
            "keep_seconds": float(settings.LOST_WORKER_SECONDS),
        }
        pruned = 0
        for _ in range(MAX_SWEEP_BATCHES):
            count = len(self._rows(sql.WORKER_DELETE_LOST, params))
            pruned += count
            if count < batch_size:
                break
        return pruned

    def notify(self, queue: str) -> None:
        """Wake workers listening for ``queue`` (at commit of the current transaction)."""
        self._rows(sql.JOB_NOTIFY, {"channel": settings.NOTIFY_CHANNEL, "queue": queue})

    def configure_claim_session(self) -> None:
        """Set up a worker's claim connection: claims keep to the claim index whatever
        the statistics say, and commit without waiting for the disk (see
        ``sql.SESSION_CONFIGURE_CLAIM`` for why that loses nothing)."""
        self._rows(sql.SESSION_CONFIGURE_CLAIM, {})
        # Claims on this very connection may be prepared (generic plans: see the
        # statement); a new connection starts without the mark, as without the set-up.
        connections[self.db_alias].connection._pgqueue_claims_prepared = True

    def configure_claim_transaction(self, statement_timeout_ms: int) -> None:
        """``configure_claim_session`` and a statement bound for the current transaction
        only (``SET LOCAL``): the claim's set-up behind a transaction pooler."""
        self._rows(
            sql.SESSION_CONFIGURE_CLAIM_LOCAL,
            {"statement_timeout": f"{int(statement_timeout_ms)}ms"},
        )

    def session_state(self) -> dict[str, Any]:
        """What this thread's connection carries beyond its transaction: roles, the
        settings that change later statements, and session-level objects held (see
        ``sql.SESSION_GET_STATE``), by name."""
        with connections[self.db_alias].cursor() as cursor:
            cursor.execute(sql.SESSION_GET_STATE, {})
            names = [column.name for column in cursor.description or ()]
            return dict(zip(names, cursor.fetchone() or (), strict=True))

    def configure_session(
        self, application_name: str, *, statement_timeout_ms: int | None = None
    ) -> None:
        """Label this thread's connection (``pg_stat_activity.application_name``, cut
        to 63 bytes by PostgreSQL) and optionally bound its statements."""
        self._rows(
            sql.SESSION_CONFIGURE,
            {
                "application_name": application_name[:63],
                "statement_timeout": None
                if statement_timeout_ms is None
                else f"{int(statement_timeout_ms)}ms",
            },
        )

    def bound_transaction(self, statement_timeout_ms: int) -> None:
        """Bound the statements of the current transaction (``SET LOCAL``): the form
        of ``configure_session``'s bound that a transaction pooler cannot leak."""
        self._rows(
            sql.SESSION_BOUND_TRANSACTION,
            {"statement_timeout": f"{int(statement_timeout_ms)}ms"},
        )


@functools.cache
def _field_names(model: type[models.Model]) -> list[str]:
    """The model's concrete field names in column order, read once (enqueue's hot path
    builds every returned Job from them)."""
    return [f.attname for f in model._meta.concrete_fields]
