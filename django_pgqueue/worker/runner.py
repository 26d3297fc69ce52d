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
from typing import Any

from asgiref.sync import async_to_sync
from django.db import DatabaseError, connections, transaction

from .. import lifecycle, tracing, validation
from ..exceptions import (
    InvalidJob,
    InvalidResult,
    JobCancelled,
    LeaseLost,
    Snooze,
    TaskNotFound,
    TransactionLeak,
    exception_line,
    first_line,
)
from ..framework import TaskGone, to_task_result
from ..models import Job
from ..reconnect import close_connection
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
    configure_session,
    discard_connection,
    recycle_connections,
    session_leftovers,
    thread_connections,
    watch_session,
)
from .outcomes import Reporter
from .state import DataRefused, WorkerPart, WorkerState, refused_data

logger = logging.getLogger(__name__)


CANCELLED_BEFORE_COMMIT = "cancellation requested before commit; the task's effects rolled back"
#: How often a running coroutine task's cancellation flag is checked, in seconds.
ASYNC_CANCEL_POLL = 0.05


async def cancellable(
    func: Callable[..., Coroutine[Any, Any, Any]],
    cancel: CancelFlag,
    /,
    *args: Any,
    **kwargs: Any,
) -> Any:
    """Await ``func(*args, **kwargs)``; cancel it (``asyncio.CancelledError`` raised at
    its current ``await``) once ``cancel`` is set by the heartbeat thread."""
    job = asyncio.ensure_future(func(*args, **kwargs))
    while not job.done():
        await asyncio.wait({job}, timeout=ASYNC_CANCEL_POLL)
        if cancel.is_set() and not job.done():
            job.cancel()
            break
    return await job


def describe_leftovers(leftovers: dict[str, list[str]]) -> str:
    """``"SET work_mem on its connection to database 'default'"``, one part per database."""
    return "; ".join(
        f"{', '.join(left)} on its connection to database {alias!r}"
        for alias, left in leftovers.items()
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
            close_connection(self.alias)

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
        with self.state.lock:
            held = self.state.entry(job)
            if held is not None and not held.lost:
                held.started = time.monotonic()
                held.timeout = None if known is None else known.timeout
        if held is None or held.lost:
            # A prefetched job whose lease the heartbeat already found taken back (the
            # process was paused), or that was claimed again: another run owns it;
            # running it here too would only duplicate its effects.
            self.state.stats.count("lost")
            logger.warning(
                "job %s: lease lost before the task started; not running it",
                job.id,
                extra={"action": "lease_lost", "job_id": job.id, "worker_id": self.worker_id},
            )
            return False
        if held.cancel.is_set():
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
            return False
        if isinstance(error, TaskGone):
            # Never retried: the code is gone or the path is not a Task.
            self._record_failure(job, TaskNotFound(str(error)), retry=False)
            return False
        if known is None:
            # The task's module raised on import (a dependency missing after a bad
            # deploy, say): recorded like a task error and retried with backoff (it may
            # be a deploy in progress), and logged with its traceback.
            assert error is not None
            logger.error(
                "job %s: task %s failed to import: %s",
                job.id,
                job.task,
                exception_line(error),
                exc_info=error,
                extra={"action": "import_error", "job_id": job.id, "worker_id": self.worker_id},
            )
            self._record_failure(job, error)
            return False
        transactional = known.transactional
        token = _current.set(
            RunningJob(job, self.worker_id, transactional, held.cancel, self.alias)
        )
        try:
            with tracing.job_span(job):
                return self._run(job, known, cancel=held.cancel)
        finally:
            _current.reset(token)

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
        args: list[Any] = list(job.args)
        if task.takes_context:
            assert task_result is not None
            args.insert(0, TaskContext(task_result=task_result))
        if known.coroutine:
            value = async_to_sync(cancellable)(task.func, cancel, *args, **job.kwargs)
        else:
            value = task.func(*args, **job.kwargs)  # Task.call, minus its coroutine check
        return validation.returned(value)  # a bad value fails the job here

    def _run(self, job: Job, known: Known, *, cancel: CancelFlag) -> bool:
        task, transactional = known.task, known.transactional
        log_extra = {"job_id": job.id, "worker_id": self.worker_id}
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
                status = self._record_failure(job, error, retry=False)
                if status is not None:  # (no TaskResult: building one is what overflowed)
                    self.reporter.failed(job, None, None, error, status, 0.0)
                return False
            object.__setattr__(task_result, "status", TaskResultStatus.RUNNING)
            if started_wanted:
                self.reporter.signal(task_started, task_result)
        started = time.perf_counter()
        completed_in_tx = False
        failure: tuple[BaseException, str, float] | None = None
        raw = None
        try:
            raw = self._prepare_session()
            if transactional:
                # The task's effects and the fenced completion commit together or not
                # at all: a lost lease raises inside the block and rolls them back.
                with transaction.atomic(using=self.alias):
                    value, _ = self._call(job, known, task_result, cancel)
                    # A leak on another database fails the job before its commit.
                    self._fail_on_leftovers(skip=self.alias)
                    if cancel.is_set():
                        raise JobCancelled(CANCELLED_BEFORE_COMMIT)
                    self._mark_recording(job)
                    try:
                        status = self.state.jobs.complete_status(job, self.worker_id, result=value)
                    except DatabaseError as exc:
                        if refused_data(exc):  # never storable: fail for good, below
                            raise InvalidResult(
                                f"PostgreSQL refused the task's return value: {first_line(exc)}"
                            ) from exc
                        raise
                    if status is None:
                        raise LeaseLost(
                            f"job {job.id}: lease lost before completion; "
                            "the task's effects were rolled back"
                        )
                    if status == Status.CANCELLED:  # requested since the last lease extension
                        raise JobCancelled(CANCELLED_BEFORE_COMMIT)
                    completed_in_tx = True
                # Committed; what the task left beyond its transaction (a session
                # SET, an advisory lock) must still not reach the next job.
                self._discard_leftovers(job, raw, "done (transactional, committed)")
            else:
                value, text = self._call(job, known, task_result, cancel)
                # Before anything is recorded: the completion must not join a leaked
                # transaction, and later jobs must get a clean session.
                self._fail_on_leftovers()
        except LeaseLost:
            tracing.outcome(tracing.LOST)
            self._discard_leftovers(job, raw, "lease lost")
            self.state.stats.count("lost")
            logger.warning(
                "job %s: lease lost while running (transactional: effects rolled back, "
                "nothing recorded); another worker owns it now",
                job.id,
                extra={"action": "lease_lost", **log_extra},
            )
            return False
        except BaseException as exc:
            # BaseException too: a task's SystemExit or KeyboardInterrupt (or an
            # asyncio.CancelledError) is its own failure; signals reach the main thread
            # only. Swallowing nothing here would wedge the slot with the job held.
            elapsed = time.perf_counter() - started
            committed = (
                completed_in_tx
                and not isinstance(exc, DatabaseError)
                and not connections[self.alias].in_atomic_block
            )
            if raw is not None:
                # A task that leaked a transaction and then raised: its failure must
                # not be written into that transaction (nor wait behind its locks).
                # (After a TransactionLeak, what is left unchecked: the jobs database
                # skipped inside a transactional task's own transaction.)
                self._discard_leftovers(job, raw, "done" if committed else "failed")
            if committed:
                # Committed: only an on_commit callback raised after the commit.
                tracing.outcome(tracing.SUCCEEDED)
                self.state.stats.count("done")
                logger.error(
                    "job %s %s done (transactional), but an on_commit callback raised",
                    job.id,
                    job.task,
                    exc_info=exc,
                    extra={"action": "done", **log_extra},
                )
                return False
            for wrapper in connections.all(initialized_only=True):
                if wrapper.in_atomic_block:  # a task that leaked atomic() and raised
                    discard_connection(wrapper.alias)
            if isinstance(exc, Snooze):
                # Not a failure (lifecycle.py), unless the job snoozed too often.
                exc = lifecycle.snooze(self, job, exc) or exc
                if isinstance(exc, Snooze):
                    return False
            tracing.outcome(tracing.FAILED, exc)
            # A return value that cannot be stored would be the same on every attempt.
            status = self._record_failure(job, exc, retry=not isinstance(exc, InvalidResult))
            if status is None:
                return False
            failure = (exc, status, elapsed)
        if failure is not None:
            # Reported here, outside the except block: Django's own task_finished
            # receiver logs the traceback of the exception being handled, if any, and
            # ours already holds it (once, for the final failure only).
            self.reporter.failed(job, task, task_result, *failure)
            return False
        elapsed = time.perf_counter() - started
        tracing.outcome(tracing.SUCCEEDED)
        if transactional:
            self.state.stats.count("done")
            self.reporter.done(job, value, elapsed, task_result, transactional=True)
            return False
        if cancel.is_set():
            # Cancelled, and the task returned (a cooperative stop): written now rather
            # than in a batch, so the log and the signal say "cancelled", not "done".
            self._record_cancelled(job, task, value, elapsed, task_result)
            return False
        # Recorded in a batch by the completer thread, which logs it and sends
        # task_finished once the fenced write succeeded; the job stays held (its lease
        # extended) until then.
        last = not self.state.mark_completing(job)
        self.completer.submit(
            Completion(job, value, elapsed, task_result, _current.get(), text, task), last=last
        )
        return True

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
    ) -> None:
        """Write the outcome of a task that returned after its job's cancellation was
        requested: the fenced completion ends it ``cancelled`` (result kept)."""
        self._mark_recording(job)
        try:
            written, status = self.write_retrying(
                lambda: self.state.jobs.complete_status(job, self.worker_id, result=value),
                jobs=[job],
                outcome="cancel",
            )
        except DataRefused as exc:
            error = InvalidResult(f"PostgreSQL refused the task's return value: {exc}")
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
            "job %s %s %s after %.3fs (the task stopped)",
            job.id,
            job.task,
            status,
            elapsed,
            extra={"action": "cancel", "job_id": job.id, "worker_id": self.worker_id},
        )
        self.reporter.finished_failed(job, task, task_result)

    def _prepare_session(self) -> Any:
        """Label this thread's connection and read its clean-session baseline before the
        task runs (see ``watch_session``). A connection that died since its last use (a
        terminated backend, a restarted server) is replaced once: the worker's own set-up
        failing is no failure of the task, and must not charge it an attempt."""
        try:
            configure_session(self.alias, "runner", self.worker_id)
            return watch_session(self.alias)
        except DatabaseError:
            close_connection(self.alias)
            configure_session(self.alias, "runner", self.worker_id)
            return watch_session(self.alias)

    def _record_failure(self, job: Job, error: BaseException, *, retry: bool = True) -> str | None:
        return self.record_failure(job, error, retry=retry)  # see WorkerPart.record_failure
