"""Running one claimed job: call its task, then record the outcome, fenced.

Every outcome is written fenced on (owner, attempt), so a worker that lost the lease
changes nothing and says so in the log. A ``transactional`` task (see ``tasks.py``) runs
in one transaction with its fenced completion, so its effects commit exactly once; any
other task runs in autocommit, and one that returns with a transaction still open, or
with session state left, on any connection it used (the jobs database's or another's;
see ``connections.session_leftovers``), fails with
:class:`~django_pgqueue.exceptions.TransactionLeak` and has that connection discarded.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, ClassVar

from asgiref.sync import async_to_sync
from django.db import DatabaseError, connections, transaction

from .. import lifecycle, tracing, validation
from ..conf import settings
from ..exceptions import (
    InvalidJob,
    InvalidResult,
    JobCancelled,
    JobTimeout,
    LeaseLost,
    Snooze,
    SoftTimeLimitExceeded,
    TaskNotFound,
    TransactionLeak,
    exception_line,
    first_line,
)
from ..framework import TaskGone, to_task_result
from ..models import Job
from ..states import Status
from ..taskapi import (
    Task,
    TaskContext,
    TaskResult,
    TaskResultStatus,
    task_finished,
    task_started,
)
from ..tasks import CancelFlag, RunningJob, _current
from .catalog import Catalog, Known
from .completer import Completer, Completion
from .connections import (
    atomic_left,
    configure_session,
    discard_connection,
    drop_connection,
    recycle_connections,
    session_leftovers,
    thread_connections,
    watch_session,
)
from .limits import SoftLimit, hard_limit, soft_limit
from .outcomes import Reporter
from .state import DataRefused, Held, WorkerPart, WorkerState, refusal, refused_data

logger = logging.getLogger(__name__)


CANCELLED_BEFORE_COMMIT = "cancellation requested before commit; the task's effects rolled back"
#: How often a running coroutine task's cancellation flag is checked, in seconds.
ASYNC_CANCEL_POLL = 0.05


class Exited:
    """What :func:`contained` returns for a coroutine that raised ``SystemExit`` or
    ``KeyboardInterrupt``: the exception, to be raised again as the job's failure."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


async def contained(coroutine: Any) -> Any:
    """Await a job's coroutine as its asyncio task's body, turning ``SystemExit`` and
    ``KeyboardInterrupt`` into a value: asyncio re-raises those two out of the event
    loop (not into whoever awaits the task), which would end the loop thread, and the
    worker with it, for what is one job's failure (as it is in a plain task)."""
    try:
        return await coroutine
    except (SystemExit, KeyboardInterrupt) as exc:
        return Exited(exc)


async def cancellable(
    func: Callable[..., Coroutine[Any, Any, Any]],
    cancel: CancelFlag,
    soft: float | None,
    /,
    *args: Any,
    **kwargs: Any,
) -> Any:
    """Await ``func(*args, **kwargs)``; cancel it (``asyncio.CancelledError`` raised at
    its current ``await``) once ``cancel`` is set by the heartbeat thread, or once it
    ran ``soft`` seconds (its soft time limit, None: none): then, as on the event loop,
    it may clean up, and if the cancellation ends it the attempt fails with
    ``SoftTimeLimitExceeded`` (a coroutine run on a thread slot: a transactional one,
    ``--async-concurrency 0``, ``testing.run_jobs``)."""
    loop = asyncio.get_running_loop()
    deadline = None if soft is None else loop.time() + soft
    job = asyncio.ensure_future(contained(func(*args, **kwargs)))
    while not job.done():
        wait = ASYNC_CANCEL_POLL
        if deadline is not None:
            wait = min(wait, max(0.0, deadline - loop.time()))
        await asyncio.wait({job}, timeout=wait)
        if job.done():
            break
        if cancel.is_set():
            job.cancel()
            break
        if deadline is not None and loop.time() >= deadline:
            assert soft is not None
            job.cancel(f"soft time limit of {soft:g}s")
            await asyncio.wait({job})
            if job.cancelled():
                raise SoftTimeLimitExceeded(
                    f"the coroutine ran past its soft time limit of {soft:g}s and was cancelled"
                )
            break
    value = await job
    if isinstance(value, Exited):
        raise value.exc  # the job's failure, as a plain task's
    return value


def arguments(job: Job, task: Task, task_result: TaskResult | None) -> list[Any]:
    """The positional arguments of ``job``'s task: its args, after a ``TaskContext`` if
    the task takes one (``task_result`` is built then)."""
    args: list[Any] = list(job.args)
    if task.takes_context:
        assert task_result is not None
        args.insert(0, TaskContext(task_result=task_result))
    return args


@dataclass(slots=True)
class Begun:
    """A job that may run (see :meth:`JobRunner.begin`)."""

    known: Known
    held: Held
    #: Django's TaskResult of the run, RUNNING (None: nothing reads it).
    task_result: TaskResult | None
    #: ``task_started`` would do something: the caller sends it before the task runs.
    started_wanted: bool
    #: What ``current_job()`` says while the task runs.
    running: RunningJob


@dataclass(slots=True)
class Refusal:
    """A job that must not run (see :meth:`JobRunner.begin`), and why."""

    LOST: ClassVar[str] = "lost"  # its lease was taken back before it started
    CANCELLED: ClassVar[str] = "cancelled"  # cancelled before it started: released
    IMPORT: ClassVar[str] = "import"  # its task's module raised on import: retried
    FAILED: ClassVar[str] = "failed"  # ``error`` fails the attempt

    kind: str
    error: BaseException | None = None
    retry: bool = True
    #: Report the failure (log line, ``task_finished``) once recorded.
    report: bool = False


def describe_leftovers(leftovers: dict[str, list[str]]) -> str:
    """``"SET work_mem on its connection to database 'default'"``, one part per database."""
    return "; ".join(
        f"{', '.join(left)} on its connection to database {alias!r}"
        for alias, left in leftovers.items()
    )


def _returned_in_time(known: Known, started: float) -> None:
    """Raise ``JobTimeout`` if the task returned after its timeout (``@task(timeout=...)``,
    else ``PGQUEUE_JOB_TIMEOUT_SECONDS``; ``started``: ``time.perf_counter()`` at its
    start). A thread cannot be stopped, so a late return is all there is to catch: the
    attempt is recorded as timed out (retried with backoff), its value discarded, as a
    coroutine's is, never ``done`` because the lease happened to outlast the timeout."""
    limit = known.timeout if known.timeout is not None else settings.JOB_TIMEOUT_SECONDS
    if limit is None:
        return
    elapsed = time.perf_counter() - started
    if elapsed >= limit:
        raise JobTimeout(
            f"the task returned after {elapsed:.3f}s, past its timeout of {limit:g}s; "
            "the attempt counts as timed out and its return value is discarded"
        )


class JobRunner(WorkerPart):
    """Runs claimed jobs for one worker; its runner threads share one instance.

    A job's held entry gets its start time and its task's timeout here, and a job the
    heartbeat already found lost is not started. Successful ordinary jobs go to the
    ``completer``, which records them in batches; failures and transactional
    completions are recorded here. Outcomes are counted in ``stats`` and reported
    through ``reporter``."""

    def __init__(
        self,
        state: WorkerState,
        *,
        reporter: Reporter,
        completer: Completer,
        catalog: Catalog | None = None,
    ) -> None:
        super().__init__(state)
        self.reporter = reporter
        self.completer = completer
        #: Tasks already imported, by path (a worker runs few distinct tasks, many times).
        self.catalog = Catalog() if catalog is None else catalog

    def release(self, job: Job) -> None:
        """Give back a job claimed but not started (shutdown): pending again, with its
        attempt not charged. If that fails, its lease expires instead."""
        self._mark_recording(job)
        try:
            if self.state.jobs.release(job, self.worker_id):
                self.state.stats.count("released")
                logger.info(
                    "job %s released (shutdown before start)",
                    job.id,
                    extra={
                        "action": "release",
                        "job_id": job.id,
                        "worker_id": self.worker_id,
                    },
                )
        except DatabaseError:
            logger.warning(
                "job %s: could not release; its lease will expire",
                job.id,
                extra={
                    "action": "release",
                    "job_id": job.id,
                    "worker_id": self.worker_id,
                },
            )
            drop_connection(self.alias)

    def execute(self, job: Job) -> bool:
        """Run one held job on this thread's connection and record its outcome. Return
        True if the job went to the completer, which removes it from ``held`` once its
        completion is written; otherwise the caller removes it afterwards."""
        recycle_connections(thread_connections())
        try:
            known: Known | None = self.catalog.get(job.task)
            error: BaseException | None = None
        except BaseException as exc:  # noqa: BLE001 - recorded below, once started
            known, error = None, exc
        begun = self.begin(job, known, error)
        if isinstance(begun, Refusal):
            self.refuse(job, begun)
            return False
        if begun.started_wanted:
            self.reporter.signal(task_started, begun.task_result)
        token = _current.set(begun.running)
        try:
            with tracing.job_span(job):
                return self._run(job, begun)
        finally:
            _current.reset(token)

    def begin(self, job: Job, known: Known | None, error: BaseException | None) -> Begun | Refusal:
        """Start a held job whose task is ``known`` (None: importing it raised
        ``error``): mark its entry started (with the task's timeout), and build its
        ``TaskResult`` if anything reads it. No I/O: a job that must not run is
        returned as a :class:`Refusal`, for :meth:`refuse` to record (on a thread that
        may write), and ``task_started`` is left to the caller (``started_wanted``)."""
        with self.state.lock:
            held = self.state.entry(job)
            if held is not None and not held.lost:
                held.started = time.monotonic()
                held.timeout = None if known is None else known.timeout
                held.time_limit = hard_limit(job, None if known is None else known.time_limit)
        if held is None or held.lost:
            return Refusal(Refusal.LOST)
        if held.cancel.is_set():
            return Refusal(Refusal.CANCELLED)
        if isinstance(error, TaskGone):
            # Never retried: the code is gone or the path is not a Task.
            return Refusal(Refusal.FAILED, TaskNotFound(str(error)), retry=False)
        if known is None:
            assert error is not None
            return Refusal(Refusal.IMPORT, error)
        task = known.task
        # Django's TaskResult only when something reads it: the task's context, or a
        # receiver of task_started or of a successful task_finished that would do
        # something (see Reporter.wants). A failure builds one then if it must.
        task_result = None
        started_wanted = self.reporter.wants(task_started)
        if task.takes_context or started_wanted or self.reporter.wants(task_finished):
            try:
                task_result = to_task_result(job, task)
            except RecursionError:  # args stored before the depth was enforced
                error = InvalidJob(
                    f"job {job.id}'s args or kwargs are nested more than "
                    f"{validation.MAX_DEPTH} levels deep"
                )
                return Refusal(Refusal.FAILED, error, retry=False, report=True)
            object.__setattr__(task_result, "status", TaskResultStatus.RUNNING)
        running = RunningJob(job, self.worker_id, known.transactional, held.cancel, self.alias)
        return Begun(known, held, task_result, started_wanted, running)

    def refuse(self, job: Job, refusal: Refusal) -> None:
        """Record what :meth:`begin` refused, on this thread's connection."""
        if refusal.kind == Refusal.LOST:
            # A prefetched job whose lease the heartbeat already found taken back (the
            # process was paused), or that was claimed again: another run owns it;
            # running it here too would only duplicate its effects.
            self.state.stats.count("lost")
            logger.warning(
                "job %s: lease lost before the task started; not running it",
                job.id,
                extra={"action": "lease_lost", "job_id": job.id, "worker_id": self.worker_id},
            )
        elif refusal.kind == Refusal.CANCELLED:
            # Prefetched, and cancelled before it started: never run it. The release
            # statement ends a cancel-requested job 'cancelled' (attempt not charged).
            written, _ = self.write_retrying(
                lambda: self.state.jobs.release(job, self.worker_id),
                jobs=[job],
                outcome="cancel",
            )
            if written:
                self.state.stats.count("cancelled")
                logger.info(
                    "job %s cancelled before it started; not running it",
                    job.id,
                    extra={"action": "cancel", "job_id": job.id, "worker_id": self.worker_id},
                )
        else:
            error = refusal.error
            assert error is not None
            if refusal.kind == Refusal.IMPORT:
                # The task's module raised on import (a dependency missing after a bad
                # deploy, say): recorded like a task error and retried with backoff (it
                # may be a deploy in progress), and logged with its traceback.
                logger.error(
                    "job %s: task %s failed to import: %s",
                    job.id,
                    job.task,
                    exception_line(error),
                    exc_info=error,
                    extra={
                        "action": "import_error",
                        "job_id": job.id,
                        "worker_id": self.worker_id,
                    },
                )
            status = self._record_failure(job, error, retry=refusal.retry)
            if status is not None and refusal.report:
                # (No TaskResult: building one is what failed.)
                self.reporter.failed(job, None, None, error, status, 0.0)

    def _call(
        self, job: Job, known: Known, task_result: TaskResult | None, cancel: CancelFlag
    ) -> tuple[object, str]:
        """Call the task; return its JSON-safe value and that value's JSON text (a bad
        value raises ``InvalidResult`` here, which fails the job for good; the text is
        what the batched completion stores, so it is not encoded twice). A coroutine
        task run here (a transactional one, or one of a worker without an event loop)
        is cancelled (``asyncio.CancelledError`` inside it) once ``cancel`` is set.
        ``task_result`` is built whenever the task takes a context."""
        task = known.task
        args = arguments(job, task, task_result)
        limit = soft_limit(job, known.soft_time_limit)
        if known.coroutine:
            value = async_to_sync(cancellable)(task.func, cancel, limit, *args, **job.kwargs)
        else:
            if limit is None:
                value = task.func(*args, **job.kwargs)  # Task.call, minus its coroutine check
            else:
                with SoftLimit(limit):
                    value = task.func(*args, **job.kwargs)
        return validation.returned(value)  # a bad value fails the job here

    def _run(self, job: Job, begun: Begun) -> bool:
        known, task_result, cancel = begun.known, begun.task_result, begun.held.cancel
        transactional = known.transactional
        started = time.perf_counter()
        completed_in_tx = False
        failure: BaseException | None = None
        raw = None
        try:
            raw = self._prepare_session()
            # (Its session is ended if the job passes its hard time limit.) Read off the
            # connection _prepare_session returns: looking it up again
            # in Django's per-thread connection handler costs a few µs on every job.
            # One attribute written, which a reader (the time limits' thread, under the
            # lock) sees whole or not at all: no lock taken for it.
            begun.held.backend_pid = None if raw is None else int(raw.pgconn.backend_pid)
            if transactional:
                # The task's effects and the fenced completion commit together or not
                # at all: a lost lease raises inside the block and rolls them back.
                with transaction.atomic(using=self.alias):
                    value = self._complete_in_transaction(job, begun, started)
                    completed_in_tx = True  # (an on_commit callback may still raise)
                # Committed; what the task left beyond its transaction (a session
                # SET, an advisory lock) must still not reach the next job.
                self._discard_leftovers(job, raw, "done (transactional, committed)")
            else:
                value, text = self._call(job, known, task_result, cancel)
                _returned_in_time(known, started)
                # Before anything is recorded: the completion must not join a leaked
                # transaction, and later jobs must get a clean session.
                self._fail_on_leftovers()
        except LeaseLost:
            self._lost(job, raw)
            return False
        except BaseException as exc:
            # BaseException too: a task's SystemExit or KeyboardInterrupt (or an
            # asyncio.CancelledError) is its own failure; signals reach the main thread
            # only. Swallowing nothing here would wedge the slot with the job held.
            if self._raised(job, raw, exc, committed=completed_in_tx):
                return False
            failure = exc
        if failure is not None:
            # Recorded outside the except block: Django's own task_finished receiver
            # logs the traceback of the exception being handled, if any, and ours
            # already holds it (once, for the final failure only).
            self.failed(job, begun, failure, time.perf_counter() - started)
            return False
        elapsed = time.perf_counter() - started
        if transactional:
            tracing.outcome(tracing.SUCCEEDED)
            self.state.stats.count("done")
            self.reporter.done(job, value, elapsed, task_result, transactional=True)
            return False
        return self.succeeded(job, begun, value, text, elapsed, inline=True)

    def _complete_in_transaction(self, job: Job, begun: Begun, started: float) -> Any:
        """Inside a transactional task's transaction: run it, then write its fenced
        completion; its return value. Raises to roll both back."""
        known, cancel = begun.known, begun.held.cancel
        value, _ = self._call(job, known, begun.task_result, cancel)
        _returned_in_time(known, started)  # late: its effects roll back
        # A leak on another database fails the job before its commit.
        self._fail_on_leftovers(skip=self.alias)
        if cancel.is_set():
            raise JobCancelled(CANCELLED_BEFORE_COMMIT)
        self._mark_recording(job)
        try:
            status = self.state.jobs.complete_status(job, self.worker_id, result=value)
        except DatabaseError as exc:
            if refused_data(exc):  # never storable: fail for good, below
                raise InvalidResult(refusal(first_line(exc))) from exc
            raise
        if status is None:
            raise LeaseLost(
                f"job {job.id}: lease lost before completion; the task's effects were rolled back"
            )
        if status == Status.CANCELLED:  # requested since the last lease extension
            raise JobCancelled(CANCELLED_BEFORE_COMMIT)
        return value

    def _lost(self, job: Job, raw: Any) -> None:
        """A run whose lease was taken back: nothing recorded, the session cleaned."""
        tracing.outcome(tracing.LOST)
        self._discard_leftovers(job, raw, "lease lost")
        self.state.stats.count("lost")
        logger.warning(
            "job %s: lease lost while running (transactional: effects rolled back, "
            "nothing recorded); another worker owns it now",
            job.id,
            extra={"action": "lease_lost", "job_id": job.id, "worker_id": self.worker_id},
        )

    def _raised(self, job: Job, raw: Any, exc: BaseException, *, committed: bool) -> bool:
        """Clean up after a run that raised ``exc``. True when it is over already: a
        transactional task committed, and only an on_commit callback raised after."""
        committed = (
            committed
            and not isinstance(exc, DatabaseError)
            and not atomic_left(connections[self.alias])
        )
        if raw is not None:
            # A task that leaked a transaction and then raised: its failure must not be
            # written into that transaction (nor wait behind its locks). (After a
            # TransactionLeak, what is left unchecked: the jobs database skipped inside
            # a transactional task's own transaction.)
            self._discard_leftovers(job, raw, "done" if committed else "failed")
        if committed:
            tracing.outcome(tracing.SUCCEEDED)
            self.state.stats.count("done")
            logger.error(
                "job %s %s done (transactional), but an on_commit callback raised",
                job.id,
                job.task,
                exc_info=exc,
                extra={"action": "done", "job_id": job.id, "worker_id": self.worker_id},
            )
            return True
        for wrapper in connections.all(initialized_only=True):
            if atomic_left(wrapper):  # a task that leaked atomic() and raised
                discard_connection(wrapper.alias)
        return False

    def failed(self, job: Job, begun: Begun, exc: BaseException, elapsed: float) -> None:
        """Record and report a run of ``job`` that raised ``exc`` (on this thread's
        connection): a ``Snooze`` (lifecycle.py), or a failed attempt, retried unless
        its return value could never be stored."""
        if isinstance(exc, Snooze):
            # Not a failure (lifecycle.py), unless the job snoozed too often.
            exc = lifecycle.snooze(self, job, exc) or exc
            if isinstance(exc, Snooze):
                return
        tracing.outcome(tracing.FAILED, exc)
        # A return value that cannot be stored would be the same on every attempt.
        status = self._record_failure(job, exc, retry=not isinstance(exc, InvalidResult))
        if status is not None:
            self.reporter.failed(job, begun.known.task, begun.task_result, exc, status, elapsed)

    def succeeded(
        self,
        job: Job,
        begun: Begun,
        value: object,
        text: str,
        elapsed: float,
        *,
        inline: bool,
    ) -> bool:
        """Hand a successful (non-transactional) run to the completer; True. A job whose
        cancellation was requested while it ran is written here instead (False), so
        its line and signal say "cancelled": call on a thread that may write when the
        job's cancel flag is set. ``inline``: this thread may write the completion
        itself when nothing else is in flight (see ``Completer.submit``)."""
        tracing.outcome(tracing.SUCCEEDED)
        task, task_result = begun.known.task, begun.task_result
        if begun.held.cancel.is_set():
            # Cancelled, and the task returned (a cooperative stop): written now rather
            # than in a batch, so the log and the signal say "cancelled", not "done".
            self._record_cancelled(
                job, task, value, elapsed, task_result, heeded=begun.held.cancel.heeded
            )
            return False
        # Recorded in a batch by the completer thread, which logs it and sends
        # task_finished once the fenced write succeeded; the job stays held (its lease
        # extended) until then.
        last = not self.state.mark_completing(job)
        self.completer.submit(
            Completion(job, value, elapsed, task_result, begun.running, text, task),
            last=last,
            inline=inline,
        )
        return True

    def lane_leftovers(self) -> TransactionLeak | None:
        """On a coroutine lane: what its jobs left on this thread's connections, as the
        ``TransactionLeak`` to fail the job that just ended with (those connections
        discarded), or None."""
        try:
            self._fail_on_leftovers()
        except TransactionLeak as exc:
            return exc
        return None

    def _mark_recording(self, job: Job) -> None:
        self.mark_recording(job)  # see WorkerPart.mark_recording

    def _fail_on_leftovers(self, *, skip: str | None = None) -> None:
        """Raise :class:`TransactionLeak` naming what the task left on which database
        (see ``session_leftovers``), once those connections are discarded."""
        leftovers = session_leftovers(skip=skip)
        if not leftovers:
            return
        for alias in leftovers:
            discard_connection(alias)
        raise TransactionLeak(
            f"the task left {describe_leftovers(leftovers)}; the worker discarded the "
            "connection (rolling back any open transaction) and failed the attempt"
        )

    def _discard_leftovers(self, job: Job, raw: object, outcome: str) -> None:
        """Discard this thread's connections on which the task left anything (see
        ``session_leftovers``), saying so: the job's own outcome stands."""
        leftovers = session_leftovers()
        if not leftovers:
            return
        for alias in leftovers:
            discard_connection(alias)
        logger.warning(
            "job %s %s: %s, but the task left %s; the connection was discarded",
            job.id,
            job.task,
            outcome,
            describe_leftovers(leftovers),
            extra={"action": "leak", "job_id": job.id, "worker_id": self.worker_id},
        )

    def _record_cancelled(
        self,
        job: Job,
        task: Task,
        value: object,
        elapsed: float,
        task_result: TaskResult | None,
        *,
        heeded: bool,
    ) -> None:
        """Write the outcome of a task that returned after its job's cancellation was
        requested: the fenced completion ends it ``cancelled`` (result kept). The line
        says whether the task stopped (``heeded``: it read the request, or its
        coroutine was cancelled) or ran to its end regardless."""
        self._mark_recording(job)
        try:
            written, status = self.write_retrying(
                lambda: self.state.jobs.complete_status(job, self.worker_id, result=value),
                jobs=[job],
                outcome="cancel",
            )
        except DataRefused as exc:
            error = InvalidResult(refusal(str(exc)))
            failed = self._record_failure(job, error, retry=False)
            if failed is not None:
                self.reporter.failed(job, task, task_result, error, failed, elapsed)
            return
        if not written:
            return
        if status is None:
            self.report_lost(job, "cancel")
            return
        self.state.stats.count("cancelled" if status == Status.CANCELLED else "done")
        logger.info(
            "job %s %s %s after %.3fs (%s)",
            job.id,
            job.task,
            status,
            elapsed,
            "the task stopped"
            if heeded
            else "its cancellation was requested while it ran; the task ran to its end "
            "without reading it, and its result is kept",
            extra={"action": "cancel", "job_id": job.id, "worker_id": self.worker_id},
        )
        self.reporter.finished_failed(job, task, task_result)

    def _prepare_session(self) -> Any:
        """Label this thread's connection and read its clean-session baseline before the
        task runs (see ``watch_session``). A connection that died since its last use (a
        terminated backend, a restarted server) is replaced once: the worker's own set-up
        failing is no failure of the task, and must not charge it an attempt."""
        try:
            wrapper = configure_session(self.alias, "runner", self.worker_id)
            return watch_session(self.alias, wrapper)
        except DatabaseError:
            drop_connection(self.alias)
            wrapper = configure_session(self.alias, "runner", self.worker_id)
            return watch_session(self.alias, wrapper)

    def _record_failure(self, job: Job, error: BaseException, *, retry: bool = True) -> str | None:
        return self.record_failure(job, error, retry=retry)  # see WorkerPart.record_failure
