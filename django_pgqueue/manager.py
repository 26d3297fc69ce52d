"""``Job.objects``: the one list of what can happen to a job.

Each method names a state change (or a read the operator needs) and hands it to the
module of its family, which runs that family's statements (``sql/<family>.py``):

========================  ==========================================  =================
family                    methods                                     module
========================  ==========================================  =================
enqueue                   enqueue, bulk_enqueue, live_with_key,       enqueue, bulk,
                          notify                                      workflows
claim                     claim, claim_flow                           claim, flow
finish                    extend_leases, complete(_status),           finish
                          complete_many(_status), fail, release
what a task says          snooze, set_progress                        lifecycle
operate                   cancel, requeue_dead, discard_dead          operate
flow control              set_limit, reset_limit, flow_view,          flow
                          pause_queue, resume_queue, paused_queues
maintain (the sweep)      sweep, rescue_expired, promote_due,         sweeper
                          prune_finished, prune_lost_workers,
                          prune_expired_keys, prune_rate_windows,
                          resolve_missed
========================  ==========================================  =================

The states and the statements that move a job between them are listed in
``states.TRANSITIONS`` (read from the statements' ``moves:`` headers). Methods that
write return materialised lists; methods that take ``now=`` accept a fixed time for
tests, while in production the database's clock decides.
"""

from __future__ import annotations

import datetime as dt
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from django.db import models, transaction

from . import (
    bulk,
    claim,
    defaults,
    enqueue,
    finish,
    flow,
    lifecycle,
    operate,
    steps,
    sweeper,
    workflows,
)
from .claim import KindClaim
from .databases import default_database

# Names that lived here before the core was cut by family; the manager's callers may
# still import them from this module.
from .finish import Owned, describe_error
from .flow import FLOW_COLUMNS, QUEUE_HEAD, FlowClaim
from .operate import CANCEL_NOTIFY_IDS, CANCEL_NOTIFY_PREFIX, CancelResult, job_ids
from .sweeper import SweepResult
from .taskapi import Task
from .workflows import RELEASE_NOTIFY_PREFIX

if TYPE_CHECKING:
    from .models import Job


def error_entry(exc: BaseException, *, worker_id: str, attempt: int) -> dict[str, Any]:
    """Deprecated: the JSON of one failed attempt's error entry. The statements build
    the entry themselves now (``sql.common.ENTRY``, with the database's time);
    ``finish.describe_error`` gives its class path and traceback. Goes in the release
    after the next."""
    warnings.warn(
        "django_pgqueue.manager.error_entry() is deprecated: the error entry is built by "
        "the SQL; use django_pgqueue.finish.describe_error() for its class and traceback",
        DeprecationWarning,
        stacklevel=2,
    )
    path, text = describe_error(exc)
    return {
        "exception_class_path": path,
        "traceback": text,
        "worker_id": worker_id,
        "attempt": attempt,
    }


__all__ = [
    "CANCEL_NOTIFY_IDS",
    "CANCEL_NOTIFY_PREFIX",
    "FLOW_COLUMNS",
    "QUEUE_HEAD",
    "RELEASE_NOTIFY_PREFIX",
    "CancelResult",
    "FlowClaim",
    "JobManager",
    "Owned",
    "SweepResult",
    "describe_error",
    "error_entry",
    "job_ids",
]


class JobManager(models.Manager["Job"]):
    """The operations on jobs, each delegated to its family's module."""

    @property
    def db_alias(self) -> str:
        """The database named with ``db_manager()``/``using()``, else the default
        backend's jobs database (``databases.default_database``)."""
        return self._db or default_database()

    # --- enqueue: new -> pending | scheduled | waiting | cancelled -------------------

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
        soft_time_limit: float | None = None,
        time_limit: float | None = None,
        tags: Sequence[str] | None = None,
    ) -> Job:
        """Store one job and wake idle workers at commit; return it.

        Joins the caller's transaction: if that rolls back there is no job and no
        wake-up. Everything is validated first; a bad value raises ``InvalidJob``
        naming it and writes nothing. With an ``idempotency_key`` that a live job in
        the same queue already holds, that job is returned and nothing is inserted.
        Values not given come from the task and the backend (``defaults.resolve``).
        ``unique_for`` and ``debounce`` give the key a period (see ``enqueue.py``).
        ``concurrency_key`` puts the job in that budget of ``PGQUEUE_LIMITS`` (and fair
        turns); by default the task's ``@task(concurrency_key=...)``, or none.
        ``soft_time_limit``: seconds this job may run before ``SoftTimeLimitExceeded``
        is raised inside its task (default: the task's option, else the setting).
        ``time_limit``: seconds after which it is failed with ``TimeLimitExceeded`` if
        still running, and its worker process replaced (the same defaults).
        ``tags``: labels to find the job by (``["customer:42", "import"]``), added to
        the task's ``@task(tags=...)``; at most ``validation.MAX_TAGS``, each at most
        ``validation.MAX_TAG_LENGTH`` characters of letters, digits and ``_.:/@=+-``.

        ``depends_on``: jobs (or their ids) of this jobs database that must finish
        first; the job waits (status ``waiting``) and is released by the statement that
        finishes the last of them. If one ends dead or cancelled, the job is cancelled
        with it, unless ``on_parent_failure="run"``: then it runs anyway once they all
        finished, and reads their outcomes through ``current_job().parents()``. See
        ``workflows.py``.
        """
        alias = self.db_alias
        parents = None if depends_on is None else workflows.parent_ids(depends_on, alias=alias)
        failure = workflows.on_parent_failure_option(on_parent_failure)
        enqueue.check_combination(
            parents=bool(parents),
            on_parent_failure=failure,
            keyed=unique_for is not None or debounce is not None,
            time_limited=soft_time_limit is not None or time_limit is not None,
        )
        params = defaults.prepare(
            task,
            args,
            kwargs,
            backend=backend,
            queue=queue,
            priority=priority,
            run_at=run_at,
            max_attempts=max_attempts,
            idempotency_key=idempotency_key,
            concurrency_key=concurrency_key,
            now=now,
            soft_time_limit=soft_time_limit,
            time_limit=time_limit,
            tags=tags,
        )
        if parents:
            return workflows.enqueue_dependant(
                self.model, alias, params, parents, on_parent_failure=failure
            )
        if unique_for is not None or debounce is not None:
            keyed = enqueue.checked(params, unique_for, debounce, run_at_given=run_at is not None)
            return enqueue.enqueue_keyed(self.model, alias, keyed)[0]
        return enqueue.enqueue_one(self.model, alias, params)

    def bulk_enqueue(
        self,
        jobs: Iterable[Mapping[str, Any]],
        *,
        batch_size: int = bulk.DEFAULT_BATCH_SIZE,
        now: dt.datetime | None = None,
    ) -> bulk.BulkResult:
        """Store many jobs (mappings of ``enqueue()``'s arguments) all or nothing,
        through COPY in bounded batches; return how many were created.

        The result is a ``bulk.BulkResult``: an ``int`` whose ``skipped`` attribute
        counts jobs left out because their idempotency key was already live. See
        ``django_pgqueue.bulk.bulk_enqueue``.
        """
        return bulk.bulk_enqueue(jobs, using=self.db_alias, batch_size=batch_size, now=now)

    def live_with_key(self, queue: str, key: str | None) -> Job | None:
        """The live job of ``queue`` holding idempotency key ``key``, if any."""
        return enqueue.live_with_key(self.model, self.db_alias, queue, key)

    def notify(self, queue: str) -> None:
        """Wake workers listening for ``queue`` (at commit of the current transaction)."""
        enqueue.notify(self.db_alias, queue)

    # --- claim: pending -> running ------------------------------------------------

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
        return claim.claim(
            self.model,
            self.db_alias,
            worker_id,
            limit=limit,
            queues=queues,
            lease_seconds=lease_seconds,
            after=after,
            now=now,
            flow_view=flow_view,
        )

    def claim_kinds(
        self,
        worker_id: str,
        *,
        loop_tasks: Iterable[str],
        thread_tasks: Iterable[str] = (),
        loop_limit: int,
        thread_limit: int,
        queues: Iterable[str] | None = None,
        lease_seconds: float | None = None,
        after: tuple[int, int] | Mapping[str, tuple[int, int]] | None = None,
        now: dt.datetime | None = None,
    ) -> KindClaim:
        """:meth:`claim` for a worker with an event loop, by kind, whatever flow control
        says (the caller checks that none applies): of its next ``loop_limit +
        thread_limit`` candidates, at most ``loop_limit`` jobs of ``loop_tasks`` and
        ``thread_limit`` of ``thread_tasks``, a job of any other task counted against
        both; the jobs, how many candidates were scanned, and whether one passed over
        comes before a job leased (see ``claim.claim_kinds``)."""
        return claim.claim_kinds(
            self.model,
            self.db_alias,
            worker_id,
            loop_tasks=loop_tasks,
            thread_tasks=thread_tasks,
            loop_limit=loop_limit,
            thread_limit=thread_limit,
            queues=queues,
            lease_seconds=lease_seconds,
            after=after,
            now=now,
        )

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

        Each claim is one statement: without limits ``sql.JOB_CLAIM_FLOW``; with them,
        each claim takes its budgets' locks, counts what they use in a snapshot taken
        after the locks (the database function ``pgqueue_flow_usage``), and leases what
        fits: from the head of the line (``sql.JOB_CLAIM_LIMITED_HEAD``), and, only when
        limits kept part of a full head back or a fair queue is among ``queues``, with
        a second statement that walks the keys from each queue's cursor
        (``sql.JOB_CLAIM_LIMITED``). ``cursors``: per queue, the key the previous
        claim's walk reached. ``after``: for a worker of every queue, where the previous
        claim's head ended (its ``resume``, included). ``walk``: start with the walk
        (the previous claim's ``walked``)."""
        return flow.claim_flow(
            self.model,
            self.db_alias,
            worker_id,
            limit=limit,
            view=view,
            queues=queues,
            lease_seconds=lease_seconds,
            cursors=cursors,
            after=after,
            walk=walk,
            now=now,
        )

    # --- finish: running -> done | scheduled | dead | pending | cancelled ---------

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
        return finish.extend_leases(
            self.db_alias, worker_id, jobs, lease_seconds=lease_seconds, now=now
        )

    def complete(
        self, job: Job, worker_id: str, *, result: Any = None, now: dt.datetime | None = None
    ) -> bool:
        """Mark ``job`` done. False (and no change) if ``worker_id`` lost the lease."""
        return finish.complete(self.db_alias, job, worker_id, result=result, now=now) is not None

    def complete_status(
        self, job: Job, worker_id: str, *, result: Any = None, now: dt.datetime | None = None
    ) -> str | None:
        """``complete()``, returning the new status: ``done``, or ``cancelled`` if the
        job's cancellation was requested; None if ``worker_id`` lost the lease. What
        waits on the job is resolved with it."""
        return finish.complete(self.db_alias, job, worker_id, result=result, now=now)

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
        the JSON text ``validation.result_json`` made of them."""
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
        return finish.complete_many(
            self.db_alias, completions, worker_id, now=now, encoded=encoded
        )

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
        return finish.fail(self.db_alias, job, worker_id, exc, retry=retry, now=now)

    def release(self, job: Job, worker_id: str) -> bool:
        """Give an unstarted claimed job back to pending without charging the attempt."""
        return finish.release(self.db_alias, job, worker_id)

    # --- what a running task says: running -> scheduled | pending -----------------

    def snooze(
        self, job: Job, worker_id: str, seconds: float, *, now: dt.datetime | None = None
    ) -> str | None:
        """Put a running job back to ``scheduled`` for ``seconds`` (``pending`` for 0),
        its attempt given back and the snooze counted, fenced (what ``raise
        Snooze(seconds)`` does); the new status, or None if the lease was lost."""
        return lifecycle.snooze_job(self.db_alias, job, worker_id, seconds, now=now)

    def set_progress(self, job: Job, worker_id: str, value: Any) -> None:
        """Store ``value`` as a running job's progress, fenced on its attempt (what
        ``current_job().set_progress`` does); ``LeaseLost`` if the lease was lost."""
        lifecycle.set_progress(
            self.db_alias, job.id, worker_id, job.attempts, job.last_attempted_at, value
        )

    # --- operate: -> cancelled, dead -> pending, dead -> gone --------------------

    def cancel(self, ids: Iterable[int], *, now: dt.datetime | None = None) -> CancelResult:
        """Cancel jobs by id. Waiting, pending and scheduled ones become ``cancelled`` at
        once, and what waits on them with them (see ``workflows.py``); running ones are
        marked (they end ``cancelled`` whatever their outcome), and their worker is told
        by a NOTIFY at commit, which its listener relays to the task at once; a worker
        without one (polling only) learns it at its next lease extension. Finished and
        unknown ids are left alone. One statement per ``SWEEP_BATCH_SIZE`` ids; a job
        locked at that instant (being claimed or completed) is tried again a few times,
        then left as it is."""
        return operate.cancel(self.db_alias, ids, now=now)

    def requeue_dead(
        self,
        ids: Iterable[int],
        *,
        queue: str | None = None,
        priority: int | None = None,
        now: dt.datetime | None = None,
        from_start: bool = False,
    ) -> list[int]:
        """Put dead jobs back to pending (attempts reset, due now, errors kept), in
        ``queue``/with ``priority`` if given; wake workers at commit. Return the ids
        that changed: ids no longer dead (requeued or discarded meanwhile) and ids whose
        idempotency key a live job holds are left alone. One guarded statement per
        ``SWEEP_BATCH_SIZE`` ids. What a job's death cancelled (its dependants, theirs)
        waits again, unless another of their parents is dead or cancelled too.

        A requeued job keeps its durable steps and resumes after the last one it
        recorded; ``from_start=True`` deletes them in the same transaction, so every
        step runs again."""
        if not from_start:
            return operate.requeue_dead(
                self.db_alias, ids, queue=queue, priority=priority, now=now
            )
        with transaction.atomic(using=self.db_alias):
            requeued = operate.requeue_dead(
                self.db_alias, ids, queue=queue, priority=priority, now=now
            )
            steps.clear(self.db_alias, requeued)
        return requeued

    def discard_dead(self, ids: Iterable[int]) -> list[int]:
        """Delete dead jobs by id; return the ids deleted (never a job that stopped
        being dead meanwhile)."""
        return operate.discard_dead(self.db_alias, ids)

    def run_now(self, ids: Iterable[int], *, now: dt.datetime | None = None) -> list[int]:
        """Scheduled jobs (a failed attempt waiting for its retry, a job for later) to
        pending, due now, attempts and errors kept; wake workers at commit. Return the
        ids that changed (not ids no longer scheduled). One guarded statement per
        ``SWEEP_BATCH_SIZE`` ids."""
        return operate.run_now(self.db_alias, ids, now=now)

    def delete_finished(self, ids: Iterable[int]) -> list[int]:
        """Delete finished jobs (done, dead, cancelled) by id, with their own edges;
        return the ids deleted. A live job is never deleted, nor a parent whose
        dependant still needs its row (the sweeper resolves that edge first). One
        guarded statement per ``SWEEP_BATCH_SIZE`` ids."""
        return operate.delete_finished(self.db_alias, ids)

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
        return flow.set_limit(self.db_alias, key, concurrency=concurrency, rate=rate, now=now)

    def reset_limit(self, key: str) -> bool:
        """Remove the run-time limit of ``key``: the settings' entry of that key (if
        any) is in force again. Return whether there was one."""
        return flow.reset_limit(self.db_alias, key)

    def flow_view(self) -> flow.FlowView:
        """The flow control in force now: the settings' limits with the run-time ones on
        top, the paused queues and the fair queues."""
        return flow.load(self.db_alias)

    def pause_queue(self, name: str, *, now: dt.datetime | None = None) -> None:
        """Pause queue ``name``: its pending jobs stay pending, its running ones finish,
        and no worker claims from it once told (a NOTIFY at commit; within about a
        second without one) until :meth:`resume_queue`. Stored in the database, so it
        survives restarts of workers and of the database."""
        flow.pause_queue(self.db_alias, name, now=now)

    def resume_queue(self, name: str, *, now: dt.datetime | None = None) -> bool:
        """Let workers claim from queue ``name`` again; wake them. Return whether it was
        paused."""
        return flow.resume_queue(self.db_alias, name, now=now)

    def paused_queues(self) -> list[str]:
        """The names of the paused queues, sorted."""
        return sorted(self.flow_view().paused)

    # --- maintain: the sweeper's passes ------------------------------------------

    def sweep(self, *, now: dt.datetime | None = None) -> SweepResult:
        """One bounded maintenance pass over this jobs database (every pass below, in
        the sweeper's order; periodic entries are ``pgqueue_sweep``'s); safe to run from
        several processes at once."""
        return sweeper.sweep(using=self.db_alias, now=now)

    def rescue_expired(self, *, now: dt.datetime | None = None) -> tuple[int, int, int]:
        """Take back expired leases: running -> pending, or dead on the last attempt, or
        cancelled if a cancel was asked; return (recovered, dead, cancelled)."""
        return sweeper.rescue_expired(self.db_alias, now=now)

    def promote_due(self, *, now: dt.datetime | None = None, batch_size: int | None = None) -> int:
        """Make due scheduled jobs pending and wake workers for their queues; return how
        many. ``batch_size``: one batch of that size only."""
        return sweeper.promote_due(self.db_alias, now=now, batch_size=batch_size)

    def prune_finished(self, *, now: dt.datetime | None = None) -> int:
        """Delete finished jobs past their state's retention; return how many."""
        return sweeper.prune_finished(self.db_alias, now=now)

    def prune_lost_workers(self, *, now: dt.datetime | None = None) -> int:
        """Delete the rows of workers lost for longer than their lease plus
        ``PGQUEUE_LOST_WORKER_SECONDS``; return how many."""
        return sweeper.prune_lost_workers(self.db_alias, now=now)

    def prune_expired_keys(self, *, now: dt.datetime | None = None) -> int:
        """Delete the keys of closed ``unique_for`` windows and of started debounced
        jobs; return how many."""
        return sweeper.prune_expired_keys(self.db_alias, now=now)

    def prune_rate_windows(self, *, now: dt.datetime | None = None) -> int:
        """Delete the rate windows of flow control with no start left in them."""
        return sweeper.prune_rate_windows(self.db_alias, now=now)

    def resolve_missed(self, *, now: dt.datetime | None = None) -> int:
        """Resolve the workflow edges their parent's finishing did not see (waiting ->
        pending, scheduled or cancelled); return how many edges."""
        return sweeper.resolve_missed(self.db_alias, now=now)
