"""``Job.objects``: the operations on jobs, each one parameterised statement of sql.py
run through ``db.py``.

Enqueueing (one job here, many in ``bulk.py``, both with the defaults of
``defaults.py``), the worker's fenced state changes (claim, extend, complete, fail,
release) and the operator's (cancel, requeue and discard dead letters). The sweep passes
are the sweeper's (``sweeper.py``); the worker's session set-up is its connections'
(``worker/connections.py``). Methods that write return materialised lists.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
import time
import traceback
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, connections, models, transaction

from . import bulk, db, defaults, flow, keys, lifecycle, sql, tracing, validation, workflows
from .conf import settings
from .databases import default_database
from .exceptions import InvalidJob
from .states import LIVE_STATUSES, Status
from .taskapi import Task

if TYPE_CHECKING:
    from .models import Job

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CancelResult:
    """What ``Job.objects.cancel()`` did: ``cancelled`` pending or scheduled jobs (they
    will never run), and ``requested`` running jobs whose worker is told at once (a
    NOTIFY) or at its next lease extension. Other ids (finished, unknown) are in neither."""

    cancelled: list[int]
    requested: list[int]


@dataclass(frozen=True)
class FlowClaim:
    """What a flow claim did (``Job.objects.claim_flow``): the ``jobs`` leased, each
    queue's ``cursors`` for the next claim (where its walk over keys resumes), and
    whether pending jobs were seen that limits kept back (``blocked``: keys at their
    limits, or whose budget another claim held that instant)."""

    jobs: list[Job]
    cursors: dict[str, str]
    blocked: bool = False
    #: Where the next claim from the head of the line may start (``claim_flow``'s
    #: ``after``): the first job in claim order this one read and did not lease, as
    #: (priority, id), the position included; None: where it started.
    resume: tuple[int, int] | None = None
    #: Whether this claim took jobs by walking the keys (the head of the line did not
    #: fill it): the next may as well start with the walk (``claim_flow``'s ``walk``).
    walked: bool = False


#: The columns a limited claim (``sql.JOB_CLAIM_LIMITED``) returns after the job's: the
#: lap of the walk that took a job (0: the head of the line), and on a row of its own
#: the queue and the key its walk reached.
FLOW_COLUMNS = ("flow_lap", "flow_queue", "flow_key")

#: Rows the head of a flow claim looks at, per job asked for (and at least this many
#: more): enough to fill the claim when a few keys at the head are full.
FLOW_WINDOW_FACTOR = 1
FLOW_WINDOW_EXTRA = 16
#: Groups (keys) a flow claim's walk steps over per queue, per job asked for (and at
#: least this many more), before it returns short.
FLOW_STEPS_FACTOR = 4
FLOW_STEPS_EXTRA = 64


class Owned(set[int]):
    """The ids ``extend_leases`` still owns, and which of them were asked to cancel."""

    cancel_requested: frozenset[int] = frozenset()


def describe_error(exc: BaseException) -> tuple[str, str]:
    """``(exception_class_path, traceback)`` of a failed attempt, as stored in its error
    entry (the entry itself is built by the SQL: ``sql._ENTRY``)."""
    cls = type(exc)
    # A NUL or lone surrogate in a message would make jsonb refuse the whole write.
    text = validation.storable_text("".join(traceback.format_exception(exc)))
    return f"{cls.__module__}.{cls.__qualname__}", text


#: The position of a queue a resumed claim starts at its head: above every priority (the
#: CHECK constraint keeps them within -100 to 100) and every id, so that only its range
#: below the position, the whole line, holds anything (``sql.JOB_CLAIM_QUEUES_AFTER``).
QUEUE_HEAD = (101, 2**63 - 1)

#: How often ``cancel()`` tries again a job locked at that instant (being claimed or
#: completed), and how long it waits in between.
CANCEL_ROUNDS = 5
CANCEL_RETRY_DELAY = 0.05
#: A cancel notification's payload starts with this (a colon: no queue name does), then
#: names up to ``CANCEL_NOTIFY_IDS`` job ids, comma-separated (see ``sql.JOB_NOTIFY_CANCEL``).
CANCEL_NOTIFY_PREFIX = "cancel:"
CANCEL_NOTIFY_IDS = 300
#: A dependant released by its parents' finishing is announced as this and its queue
#: (spelled in ``sql._RESOLVE``): it keeps its older id, so a worker's next claim
#: starts at the head of the claim index (``worker/position.py``).
RELEASE_NOTIFY_PREFIX = sql.RELEASE_NOTIFY_PREFIX


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


def _chunks(ids: list[int], size: int) -> Iterator[list[int]]:
    """Checked ids, ``size`` at a time."""
    for start in range(0, len(ids), size):
        yield ids[start : start + size]


class JobManager(models.Manager["Job"]):
    """Runs the statements of ``sql.py`` against the jobs database."""

    # --- plumbing -------------------------------------------------------------------

    @property
    def db_alias(self) -> str:
        """The database named with ``db_manager()``/``using()``, else the default
        backend's jobs database (``databases.default_database``)."""
        return self._db or default_database()

    def _rows(
        self,
        query: str,
        params: dict[str, Any],
        *,
        prepare: bool = False,
        binary_lists: bool = False,
    ) -> list[tuple[Any, ...]]:
        return db.rows(self.db_alias, query, params, prepare=prepare, binary_lists=binary_lists)

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
        backend: str | None = None,
        now: dt.datetime | None = None,
        unique_for: float | dt.timedelta | None = None,
        debounce: float | dt.timedelta | None = None,
        concurrency_key: str | None = None,
        depends_on: Iterable[Job | int] | None = None,
        on_parent_failure: str | None = None,
    ) -> Job:
        """Store one job and wake idle workers at commit; return it.

        Joins the caller's transaction: if that rolls back there is no job and no
        wake-up. Everything is validated first; a bad value raises ``InvalidJob``
        naming it and writes nothing. With an ``idempotency_key`` that a live job in
        the same queue already holds, that job is returned and nothing is inserted.
        Values not given come from the task and the backend (``defaults.resolve``).
        ``unique_for`` and ``debounce`` give the key a period (see ``keys.py``).
        ``concurrency_key`` puts the job in that budget of ``PGQUEUE_LIMITS`` (and fair
        turns); by default the task's ``@task(concurrency_key=...)``, or none.

        ``depends_on``: jobs (or their ids) of this jobs database that must finish
        first; the job waits (status ``waiting``) and is released by the statement that
        finishes the last of them. If one ends dead or cancelled, the job is cancelled
        with it, unless ``on_parent_failure="run"``: then it runs anyway once they all
        finished, and reads their outcomes through ``current_job().parents()``. See
        ``workflows.py``.
        """
        parents = (
            None if depends_on is None else workflows.parent_ids(depends_on, alias=self.db_alias)
        )
        failure = workflows.on_parent_failure_option(on_parent_failure)
        if parents and (unique_for is not None or debounce is not None):
            raise InvalidJob("depends_on cannot be combined with unique_for or debounce")
        if failure is not None and not parents:
            raise InvalidJob("on_parent_failure needs depends_on: the jobs it applies to")
        resolved = defaults.resolve(
            task,
            backend=backend,
            queue=queue,
            priority=priority,
            run_at=run_at,
            max_attempts=max_attempts,
            concurrency_key=concurrency_key,
        )
        params: dict[str, Any] = {
            "backend": resolved.backend,
            "task": resolved.task,
            "queue": resolved.queue,
            "priority": resolved.priority,
            "run_at": resolved.run_at,
            "max_attempts": resolved.max_attempts,
            "idempotency_key": validation.idempotency_key(idempotency_key),
            "concurrency_key": defaults.concurrency_key(resolved, args, kwargs),
            "channel": settings.NOTIFY_CHANNEL,
            "now": now,
        }
        context = tracing.carrier()
        params["trace_context"] = None if context is None else json.dumps(context)
        params["args"], params["kwargs"] = validation.payload(
            args, kwargs, max_bytes=settings.MAX_PAYLOAD_BYTES
        )
        if parents:
            return workflows.enqueue_dependant(self, params, parents, on_parent_failure=failure)
        if unique_for is not None or debounce is not None:
            return keys.enqueue(
                self,
                params,
                unique_for=unique_for,
                debounce=debounce,
                run_at_given=run_at is not None,
            )
        for _ in range(5):
            row = db.row(self.db_alias, sql.JOB_ENQUEUE, params, prepare=True)
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
            "snoozes": 0,
            "concurrency_key": params["concurrency_key"],
            "has_dependants": False,
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
        """The live job of ``queue`` holding idempotency key ``key``, if any."""
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
        after: tuple[int, int] | Mapping[str, tuple[int, int]] | None = None,
        now: dt.datetime | None = None,
        flow_view: flow.FlowView | None = None,
    ) -> list[Job]:
        """Lease up to ``limit`` pending jobs to ``worker_id``, highest priority first.

        ``queues``: only those (through the per-queue claim index). ``after``: where
        this worker's previous claim ended, the ``(priority, id)`` of its last job (of
        all queues), or by queue name (with ``queues``; a queue not named starts at its
        head); the claim resumes there instead of at the head of the claim index (see
        ``sql.JOB_CLAIM_AFTER``, ``sql.JOB_CLAIM_QUEUES_AFTER``), and may miss jobs of
        that priority behind it.
        ``flow_view``: the flow control in force (default: the settings'; a worker
        passes what it loaded, with the limits and pauses set at run time); while
        anything of it applies to ``queues``, the claim is :meth:`claim_flow`'s."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"claim limit must be an int >= 1, not {limit!r}")
        view = flow.settings_view() if flow_view is None else flow_view
        if view.in_force(queues):
            return self.claim_flow(
                worker_id,
                limit=limit,
                view=view,
                queues=queues,
                lease_seconds=lease_seconds,
                now=now,
            ).jobs
        params: dict[str, Any] = {
            "worker_id": worker_id,
            "limit": limit,
            "lease_seconds": settings.LEASE_SECONDS if lease_seconds is None else lease_seconds,
            "now": now,
        }
        if queues is not None:
            params["queues"] = list(queues)
            if after is None:
                query = sql.JOB_CLAIM_QUEUES
            elif isinstance(after, Mapping):
                query = sql.JOB_CLAIM_QUEUES_AFTER
                ends = [after.get(name, QUEUE_HEAD) for name in params["queues"]]
                params["after_priorities"] = [priority for priority, _ in ends]
                params["after_ids"] = [job_id for _, job_id in ends]
            else:
                raise ValueError("claim(queues=..., after=...) takes a position per queue")
        elif after is not None:
            if isinstance(after, Mapping):
                raise ValueError("claim(after=...) of all queues takes one position")
            query = sql.JOB_CLAIM_AFTER
            params["after_priority"], params["after_id"] = after
        else:
            query = sql.JOB_CLAIM
        jobs = db.jobs(self.model, self.db_alias, query, params)
        jobs.sort(key=lambda job: (-job.priority, job.id))
        return jobs

    def claim_flow(
        self,
        worker_id: str,
        *,
        limit: int,
        view: flow.FlowView,
        queues: Iterable[str] | None = None,
        lease_seconds: float | None = None,
        cursors: Mapping[str, str] | None = None,
        after: tuple[int, int] | None = None,
        walk: bool = False,
        now: dt.datetime | None = None,
    ) -> FlowClaim:
        """Lease up to ``limit`` pending jobs under the flow control of ``view``: never
        from a paused queue, never beyond a limit, fair queues by turns of their keys.

        Without limits, one statement (``sql.JOB_CLAIM_FLOW``). With limits, each
        claim takes its budgets' locks, counts what they use in a snapshot taken after
        the locks (the database function ``pgqueue_flow_usage``), and leases what fits,
        in one statement: ``sql.JOB_CLAIM_LIMITED_HEAD`` (or its ``_KEYS`` form while
        only keys' concurrency bounds apply) from the head of the line, and, only when
        limits kept part of a full head back or a fair queue is among ``queues``,
        ``sql.JOB_CLAIM_LIMITED`` for the rest, which walks the keys from each queue's
        cursor. ``cursors``: per queue, the key the previous claim's walk reached.
        ``after``: for a worker of every queue, where the previous claim's head ended
        (its ``resume``, included); the head is read from there, not from the start of
        the claim index (see ``sql._HEAD_EVERYONE_LOCKED``). ``walk``: start with the
        walk (the previous claim's ``walked``: a key at its limit holds the head of the
        line, which a claim from the head would only read again)."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"claim limit must be an int >= 1, not {limit!r}")
        listed = None if queues is None else sorted(set(queues))
        cursors = dict(cursors or {})
        params: dict[str, Any] = {
            **view.params,
            "worker_id": worker_id,
            "limit": limit,
            "window": FLOW_WINDOW_FACTOR * limit + FLOW_WINDOW_EXTRA,
            "max_steps": FLOW_STEPS_FACTOR * limit + FLOW_STEPS_EXTRA,
            "queues": listed,
            "cursors": json.dumps(cursors),
            "after_priority": (after or QUEUE_HEAD)[0],
            "after_id": (after or QUEUE_HEAD)[1],
            "lease_seconds": settings.LEASE_SECONDS if lease_seconds is None else lease_seconds,
            "now": now,
        }
        alias = self.db_alias
        connection = connections[alias]
        connection.ensure_connection()
        # A claim connection is set up without JIT; any other gets that per transaction.
        set_up = getattr(connection.connection, "_pgqueue_claims_prepared", False)
        if not view.limited(listed):
            if set_up:
                jobs = db.jobs(self.model, alias, sql.JOB_CLAIM_FLOW, params)
            else:
                with transaction.atomic(using=alias, savepoint=False):
                    db.rows(alias, sql.SESSION_FLOW_LOCAL, {})
                    jobs = db.jobs(self.model, alias, sql.JOB_CLAIM_FLOW, params)
            for queue in {job.queue for job in jobs}:
                cursors[queue] = flow.rotation_cursor(
                    cursors.get(queue, ""),
                    [job.concurrency_key for job in jobs if job.queue == queue],
                )
            jobs.sort(key=lambda job: (-job.priority, job.id))
            return FlowClaim(jobs, cursors)
        leased: list[tuple[Any, ...]] = []
        reached: dict[str, list[str]] = {}
        blocked = False
        resume = None
        # Without fair queues, the head of the line first: a small statement, enough
        # unless limits kept part of a full head back (then the walk, for the rest).
        if not (walk or view.fair_among(listed)):
            head_query = (
                sql.JOB_CLAIM_LIMITED_HEAD_KEYS
                if view.keys_only(listed)
                else sql.JOB_CLAIM_LIMITED_HEAD
            )
            columns, rows = self._limited(head_query, params, set_up)
            leased = [row for row in rows if row[0] is not None]
            head, kept, *first_left = next(row[-4:] for row in rows if row[0] is None)
            blocked = head > len(leased)
            resume = self._resume(columns, leased, first_left)
            # The walk can only add keys beyond a full head, and only matters when
            # limits kept part of it back; rows whose budgets another claim held were
            # that claim's to take (claiming again finds what they leave), unless
            # they left this claim with nothing.
            if len(leased) == limit or head < params["window"] or not (kept or not leased):
                return self._flow_claim(columns, leased, cursors, reached, blocked, params, resume)
            rest = limit - len(leased)
            params = {
                **params,
                "limit": rest,
                "window": FLOW_WINDOW_FACTOR * rest + FLOW_WINDOW_EXTRA,
                "max_steps": FLOW_STEPS_FACTOR * rest + FLOW_STEPS_EXTRA,
            }
        columns, rows = self._limited(sql.JOB_CLAIM_LIMITED, params, set_up)
        # The leased jobs, then (id NULL) the group each queue's walk reached if the
        # claim came back short, and a row of NULLs if limits kept every candidate back.
        lap, queue_at, key_at = (columns.index(name) for name in FLOW_COLUMNS)
        walked = [row for row in rows if row[0] is not None]
        for row in rows:
            if row[0] is None and row[queue_at] is not None:  # resume after it
                reached[row[queue_at]] = [row[key_at]]
        for row in walked:
            if row[lap]:  # taken by the walk (not from the head of the line)
                reached.setdefault(row[columns.index("queue")], []).append(
                    row[columns.index("concurrency_key")]
                )
        blocked = blocked or bool(rows)
        return self._flow_claim(
            columns,
            leased + walked,  # the job's columns come first in both: cut once
            cursors,
            reached,
            blocked,
            params,
            resume,
            walked=any(row[lap] for row in walked),
        )

    @staticmethod
    def _resume(
        columns: tuple[str, ...], leased: list[tuple[Any, ...]], first_left: list[Any]
    ) -> tuple[int, int] | None:
        """Where the next claim from the head starts: the first job of the head not
        leased (``first_left``: its priority and id), else just after the last one
        leased; None if the head was empty."""
        if first_left[0] is not None:
            return (first_left[0], first_left[1])
        if not leased:
            return None
        priority, id_ = columns.index("priority"), columns.index("id")
        last = max(leased, key=lambda row: (-row[priority], row[id_]))
        return (last[priority], last[id_] + 1)

    def _limited(
        self, query: str, params: dict[str, Any], set_up: bool
    ) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
        """Run a limited claim statement: without JIT (a claim connection is set up
        so; any other connection for this transaction only)."""
        if set_up:
            return db.returned(self.db_alias, query, params)
        with transaction.atomic(using=self.db_alias, savepoint=False):
            db.rows(self.db_alias, sql.SESSION_FLOW_LOCAL, {})
            return db.returned(self.db_alias, query, params)

    def _flow_claim(
        self,
        columns: tuple[str, ...],
        leased: list[tuple[Any, ...]],
        cursors: dict[str, str],
        reached: dict[str, list[str]],
        blocked: bool,
        params: dict[str, Any],
        resume: tuple[int, int] | None = None,
        walked: bool = False,
    ) -> FlowClaim:
        """The FlowClaim of the ``leased`` rows of a limited claim (their job columns
        first, as ``columns`` name them), each queue's cursor moved past the keys its
        walk ``reached``."""
        width = columns.index(FLOW_COLUMNS[0])
        jobs = db.load_jobs(
            self.model,
            self.db_alias,
            columns[:width],
            [row[:width] for row in leased],
            (sql.JOB_CLAIM_LIMITED, params),
        )
        for queue, keys_ in reached.items():
            cursors[queue] = flow.rotation_cursor(cursors.get(queue, ""), keys_)
        jobs.sort(key=lambda job: (-job.priority, job.id))
        return FlowClaim(jobs, cursors, blocked=blocked and not jobs, resume=resume, walked=walked)

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
        job's cancellation was requested; None if ``worker_id`` lost the lease. What
        waits on the job is resolved with it (see ``_completed``)."""
        releasing = bool(getattr(job, "has_dependants", False))
        rows = self._rows(
            sql.JOB_COMPLETE_RELEASING if releasing else sql.JOB_COMPLETE,
            {
                "id": job.id,
                "worker_id": worker_id,
                "attempt": job.attempts,
                "claimed_at": job.last_attempted_at,
                "result": validation.result_json(result),
                "channel": settings.NOTIFY_CHANNEL,
                "now": now,
            },
        )
        if not rows:
            return None
        if not releasing and rows[0][2]:
            self._completed([job.id], now=now)
        return rows[0][1]

    def _completed(self, ids: list[int], *, now: dt.datetime | None) -> None:
        """Resolve the dependants of jobs a plain completion just finished, which got
        them after they were created (a job created with dependants, a workflow's, has
        them resolved by the completion itself: ``sql.JOB_COMPLETE_RELEASING``). In the
        completion's transaction if there is one (a transactional task's); else right
        after its commit, and if that fails the sweeper resolves them (their edges are
        marked for repair), so the completion stands either way."""
        try:
            workflows.resolve_parents(self.db_alias, ids, now=now)
        except DatabaseError:
            if connections[self.db_alias].in_atomic_block:
                raise
            logger.warning(
                "jobs %s: their dependants could not be released now; the sweeper will",
                ids,
                exc_info=True,
                extra={"action": "release"},
            )

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
        statuses = self.complete_many_status(completions, worker_id, now=now, encoded=encoded)
        return [status is not None for status in statuses]

    def complete_many_status(
        self,
        completions: Sequence[tuple[Job, Any]],
        worker_id: str,
        *,
        now: dt.datetime | None = None,
        encoded: bool = False,
    ) -> list[str | None]:
        """``complete_many()``, returning each job's new status in input order: ``done``,
        or ``cancelled`` if its cancellation was requested; None if that lease was lost."""
        if not completions:
            return []
        # Ascending ids: the lock order of the heartbeat's JOB_EXTEND_LEASES.
        order = sorted(range(len(completions)), key=lambda i: completions[i][0].id)
        jobs = [completions[i][0] for i in order]
        # A workflow's parents' dependants are released by the completion itself; other
        # batches take the lean statement (see _completed).
        releasing = any(getattr(job, "has_dependants", False) for job in jobs)
        rows = self._rows(
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
                self._completed(found, now=now)
        return statuses

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
        error_path, error_traceback = describe_error(exc)
        retry, delay = lifecycle.retry_plan(job, exc, retry)  # Retry(s), @task(backoff=)
        rows = self._rows(
            sql.JOB_FAIL,
            {
                "error_path": error_path,
                "error_traceback": error_traceback,
                "id": job.id,
                "worker_id": worker_id,
                "attempt": job.attempts,
                "claimed_at": job.last_attempted_at,
                "retry": retry,
                "retry_delay": delay,
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
                    "channel": settings.NOTIFY_CHANNEL,
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
        ``SWEEP_BATCH_SIZE`` ids. What a job's death cancelled (its dependants, theirs)
        waits again, unless another of their parents is dead or cancelled too."""
        params: dict[str, Any] = {
            "queue": None if queue is None else validation.queue_name(queue),
            "priority": None if priority is None else validation.priority(priority),
            "channel": settings.NOTIFY_CHANNEL,
            "now": now,
        }
        checked = job_ids(ids)
        requeued: list[int] = []
        for chunk in _chunks(checked, settings.SWEEP_BATCH_SIZE):
            # With what their failure had cancelled down the graph (workflows.py).
            with transaction.atomic(using=self.db_alias):
                rows = self._rows(sql.JOB_REQUEUE_DEAD, {**params, "ids": chunk})
                done = [row[0] for row in rows]
                workflows.restore_dependants(self.db_alias, done)
            requeued.extend(done)
        return sorted(requeued)

    def cancel(self, ids: Iterable[int], *, now: dt.datetime | None = None) -> CancelResult:
        """Cancel jobs by id. Waiting, pending and scheduled ones become ``cancelled`` at
        once, and what waits on them with them (see ``workflows.py``); running ones are
        marked (they end ``cancelled`` whatever their outcome), and
        their worker is told by a NOTIFY at commit, which its listener relays to the
        task at once; a worker without one (polling only) learns it at its next lease
        extension. Finished and unknown ids are left alone. One statement per
        ``SWEEP_BATCH_SIZE`` ids; a job locked at that instant (being claimed or
        completed) is tried again a few times, then left as it is."""
        checked = job_ids(ids)
        cancelled: list[int] = []
        requested: list[int] = []
        for chunk in _chunks(checked, settings.SWEEP_BATCH_SIZE):
            for round_ in range(CANCEL_ROUNDS):
                busy = []
                for job_id, status in self._rows(
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
            self._rows(
                sql.JOB_NOTIFY_CANCEL,
                {
                    "channel": settings.NOTIFY_CHANNEL,
                    "prefix": CANCEL_NOTIFY_PREFIX,
                    "ids": requested,
                    "per_payload": CANCEL_NOTIFY_IDS,
                },
            )
        return CancelResult(cancelled=sorted(cancelled), requested=sorted(requested))

    def discard_dead(self, ids: Iterable[int]) -> list[int]:
        """Delete dead jobs by id; return the ids deleted (never a job that stopped
        being dead meanwhile)."""
        checked = job_ids(ids)
        deleted: list[int] = []
        for chunk in _chunks(checked, settings.SWEEP_BATCH_SIZE):
            deleted.extend(
                row[0]
                for row in self._rows(
                    sql.JOB_DELETE_DEAD,
                    {"ids": chunk, "now": None, "channel": settings.NOTIFY_CHANNEL},
                )
            )
        return sorted(deleted)

    # --- flow control at run time -------------------------------------------------

    def set_limit(
        self,
        key: str,
        *,
        concurrency: int | None = None,
        rate: str | None = None,
        now: dt.datetime | None = None,
    ) -> flow.LimitSpec:
        """Set the limit of ``key`` (as in ``PGQUEUE_LIMITS``: ``"stripe"``,
        ``"tenant:*"``, ``"queue:NAME"``) at run time, in place of the settings' entry
        of that key; neither ``concurrency`` nor ``rate``: no limit on it. Stored in the
        database; workers apply it at their next claim (told by a NOTIFY at commit;
        within about a second without one). Running jobs are never stopped: under a
        lowered limit, no job starts until fewer run than the limit. A bad value
        raises ``ValueError`` naming it, and nothing changes."""
        spec = flow.parse_limit(key, {"concurrency": concurrency, "rate": rate}, allow_empty=True)
        self._rows(
            sql.LIMIT_SET,
            {
                "key": spec.key,
                "concurrency": spec.concurrency,
                "rate": "" if spec.rate is None else flow.format_rate(spec.rate),
                "now": now,
            },
        )
        self._flow_changed()
        return spec

    def reset_limit(self, key: str) -> bool:
        """Remove the run-time limit of ``key``: the settings' entry of that key (if
        any) is in force again. Return whether there was one."""
        found = bool(self._rows(sql.LIMIT_DELETE, {"key": flow.check_key(key)}))
        if found:
            self._flow_changed()
        return found

    def flow_view(self) -> flow.FlowView:
        """The flow control in force now: the settings' limits with the run-time ones on
        top, the paused queues and the fair queues."""
        return flow.load(self.db_alias)

    def pause_queue(self, name: str, *, now: dt.datetime | None = None) -> None:
        """Pause queue ``name``: its pending jobs stay pending, its running ones finish,
        and no worker claims from it once told (a NOTIFY at commit; within about a
        second without one) until :meth:`resume_queue`. Stored in the database, so it
        survives restarts of workers and of the database."""
        self._rows(sql.QUEUE_PAUSE, {"name": validation.queue_name(name), "now": now})
        self._flow_changed()

    def resume_queue(self, name: str, *, now: dt.datetime | None = None) -> bool:
        """Let workers claim from queue ``name`` again; wake them. Return whether it was
        paused."""
        queue = validation.queue_name(name)
        resumed = bool(self._rows(sql.QUEUE_RESUME, {"name": queue, "now": now}))
        if resumed:
            self._flow_changed()
            self.notify(queue)
        return resumed

    def paused_queues(self) -> list[str]:
        """The names of the paused queues, sorted."""
        return sorted(self.flow_view().paused)

    def _flow_changed(self) -> None:
        """Tell workers (at commit) to load limits and paused queues again."""
        self._rows(
            sql.FLOW_NOTIFY, {"channel": settings.NOTIFY_CHANNEL, "payload": flow.NOTIFY_PREFIX}
        )

    def notify(self, queue: str) -> None:
        """Wake workers listening for ``queue`` (at commit of the current transaction)."""
        self._rows(sql.JOB_NOTIFY, {"channel": settings.NOTIFY_CHANNEL, "queue": queue})


@functools.cache
def _field_names(model: type[models.Model]) -> list[str]:
    """The model's concrete field names in column order, read once (enqueue's hot path
    builds every returned Job from them)."""
    return [f.attname for f in model._meta.concrete_fields]
