"""Running one claimed job: call its task, then record the outcome, fenced.

Every outcome is written fenced on (owner, attempt), so a worker that lost the lease
changes nothing and says so in the log. A ``transactional`` task (see ``tasks.py``) runs
in one transaction with its fenced completion, so its effects commit exactly once; any
other task runs in autocommit, and one that returns with a transaction still open, or
with session state left on its connection (see ``connections.session_leftovers``),
fails with :class:`~django_pgqueue.exceptions.TransactionLeak` and has its connection
discarded.
"""

from __future__ import annotations

import logging
import time

from django.db import DatabaseError, connections, transaction
from django.dispatch import Signal
from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus
from django.tasks.signals import task_finished, task_started
from django.utils.json import normalize_json

from .. import validation
from ..backend import load_task, to_task_result
from ..exceptions import LeaseLost, TaskNotFound, TransactionLeak
from ..models import Job
from ..tasks import CurrentJob, _current, task_option
from .completer import Completer, Completion
from .connections import (
    backoff_delay,
    close_connection,
    configure_session,
    discard_connection,
    first_line,
    recycle_connections,
    session_leftovers,
    watch_session,
)
from .state import WorkerPart, WorkerState

# One logger for everything a worker does, whichever module holds the code: configuring
# ``django_pgqueue.worker`` covers all of its threads.
logger = logging.getLogger(__name__)


class JobRunner(WorkerPart):
    """Runs claimed jobs for one worker; its runner threads share one instance.

    ``held`` (guarded by ``lock``) is the worker's table of held jobs: a job's entry
    gets its start time and its task's timeout here, and a job the heartbeat already
    found lost is not started. Outcomes are counted in ``stats``; ``done`` cuts short
    the retries of an outcome that cannot be written; ``sender`` is the sender of
    Django's ``task_started`` and ``task_finished`` signals (the backend class, as
    Django's own backends send them). With a ``completer``, successful ordinary jobs
    are handed to it to be recorded in batches; without one, each is recorded here."""

    def __init__(
        self, state: WorkerState, *, sender: type, completer: Completer | None = None
    ) -> None:
        super().__init__(state)
        self.sender = sender
        self.completer = completer

    def release(self, job: Job) -> None:
        """Give back a job claimed but not started (shutdown): pending again, with its
        attempt not charged. If that fails, its lease expires instead."""
        self._mark_recording(job)
        try:
            if Job.objects.db_manager(self.alias).release(job, self.worker_id):
                self.stats.count("released")
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
        recycle_connections()
        with self.lock:
            held = self.held.get(job.id)
            # Another entry: this worker claimed the job again (a newer attempt) after
            # this copy's lease was taken back; this copy is stale.
            lost = held is None or held.job is not job or held.lost
            if held is not None and not lost:
                held.started = time.monotonic()
        if lost or held is None:
            # A prefetched job whose lease the heartbeat already found taken back (the
            # process was paused), or that was claimed again: another run owns it;
            # running it here too would only duplicate its effects.
            self.stats.count("lost")
            logger.warning(
                "job %s: lease lost before the task started; not running it",
                job.id,
                extra={"action": "lease_lost", "job_id": job.id, "worker_id": self.worker_id},
            )
            return False
        try:
            task = load_task(job.task)
        except ValueError as exc:
            # Never retried: the code is gone or the path is not a Task.
            self._record(job, "fail", error=TaskNotFound(str(exc)), retry=False)
            return False
        except BaseException as exc:  # noqa: BLE001 - the task's module raised on import
            # Recorded like a task error (and retried: it may be a deploy in progress),
            # rather than lost to a lease expiry with no reason kept.
            self._record(job, "fail", error=exc)
            return False
        timeout = task_option(task, "timeout")
        transactional = bool(task_option(task, "transactional"))
        with self.lock:
            held.timeout = float(timeout) if isinstance(timeout, int | float) else None
        token = _current.set(
            CurrentJob(
                id=job.id,
                attempt=job.attempts,
                max_attempts=job.max_attempts,
                idempotency_key=job.idempotency_key,
                queue=job.queue,
                worker_id=self.worker_id,
                transactional=transactional,
            )
        )
        try:
            return self._run(job, task, transactional=transactional)
        finally:
            _current.reset(token)

    def _signal(self, signal: Signal, task_result: TaskResult) -> None:
        """Send a Django task signal; a failing receiver is logged, never fatal to the
        job (it would otherwise lose the job to a lease expiry with no error kept)."""
        for receiver, response in signal.send_robust(self.sender, task_result=task_result):
            if isinstance(response, Exception):
                logger.error(
                    "signal receiver %r raised; the job goes on",
                    receiver,
                    exc_info=response,
                    extra={"action": "signal", "job_id": task_result.id},
                )

    def _call(self, job: Job, task: Task, task_result: object) -> object:
        """Call the task; return its JSON-safe value (a bad value raises here)."""
        if task.takes_context:
            value = task.call(TaskContext(task_result=task_result), *job.args, **job.kwargs)
        else:
            value = task.call(*job.args, **job.kwargs)
        value = normalize_json(value)
        validation.result_json(value)  # a bad return value fails the job here
        return value

    def _run(self, job: Job, task: Task, *, transactional: bool) -> bool:
        log_extra = {"job_id": job.id, "worker_id": self.worker_id}
        task_result = to_task_result(job, task)
        object.__setattr__(task_result, "status", TaskResultStatus.RUNNING)
        self._signal(task_started, task_result)
        started = time.perf_counter()
        completed_in_tx = False
        raw = None
        try:
            configure_session(self.alias, "runner", self.worker_id)
            raw = watch_session(self.alias)
            if transactional:
                # The task's effects and the fenced completion commit together or not
                # at all: a lost lease raises inside the block and rolls them back.
                with transaction.atomic(using=self.alias):
                    value = self._call(job, task, task_result)
                    self._mark_recording(job)
                    if not Job.objects.db_manager(self.alias).complete(
                        job, self.worker_id, result=value
                    ):
                        raise LeaseLost(
                            f"job {job.id}: lease lost before completion; "
                            "the task's effects were rolled back"
                        )
                    completed_in_tx = True
                # Committed; what the task left beyond its transaction (a session
                # SET, an advisory lock) must still not reach the next job.
                self._discard_leftovers(job, raw, "done (transactional, committed)")
            else:
                value = self._call(job, task, task_result)
                leftovers = session_leftovers(self.alias, raw)
                if leftovers:
                    # Before anything is recorded: the completion must not join a
                    # leaked transaction, and later jobs must get a clean session.
                    discard_connection(self.alias)
                    raise TransactionLeak(
                        f"the task left {', '.join(leftovers)} on its database "
                        "connection; the worker discarded the connection (rolling back "
                        "any open transaction) and failed the attempt"
                    )
        except LeaseLost:
            self._discard_leftovers(job, raw, "lease lost")
            self.stats.count("lost")
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
            if raw is not None and not isinstance(exc, TransactionLeak):
                # A task that leaked a transaction and then raised: its failure must
                # not be written into that transaction (nor wait behind its locks).
                self._discard_leftovers(job, raw, "done" if committed else "failed")
            if committed:
                # Committed: only an on_commit callback raised after the commit.
                self.stats.count("done")
                logger.error(
                    "job %s %s done (transactional), but an on_commit callback raised",
                    job.id,
                    job.task,
                    exc_info=exc,
                    extra={"action": "done", **log_extra},
                )
                return False
            status = self._record(job, "fail", error=exc)
            if status is not None:
                logger.error(
                    "job %s %s failed after %.3fs (attempt %d/%d) -> %s",
                    job.id,
                    job.task,
                    elapsed,
                    job.attempts,
                    job.max_attempts,
                    status,
                    exc_info=exc,
                    extra={"action": "fail", **log_extra},
                )
                object.__setattr__(task_result, "status", TaskResultStatus.FAILED)
                self._signal(task_finished, task_result)
            return False
        elapsed = time.perf_counter() - started
        if transactional:
            self.stats.count("done")
            recorded = True
        elif self.completer is not None:
            # Recorded in a batch by the completer thread, which logs it and sends
            # task_finished once the fenced write succeeded; the job stays held (its
            # lease extended) until then.
            with self.lock:
                held = self.held.get(job.id)
                if held is not None and held.job is job:
                    held.completing = True
            self.completer.submit(Completion(job, value, elapsed, task_result, _current.get()))
            return True
        else:
            recorded = bool(self._record(job, "complete", result=value))
        if recorded:
            self._report_done(job, value, elapsed, task_result, transactional=transactional)
        return False

    def _mark_recording(self, job: Job) -> None:
        """Before writing ``job``'s outcome: tell the heartbeat that the row may leave
        ``running`` now for that reason (a missed extension is not a lost lease)."""
        with self.lock:
            entry = self.held.get(job.id)
            if entry is not None and entry.job is job:
                entry.recording = True

    def _discard_leftovers(self, job: Job, raw: object, outcome: str) -> None:
        """Discard this thread's connection if the task left anything on it (see
        ``session_leftovers``), saying so: the job's own outcome stands."""
        leftovers = session_leftovers(self.alias, raw)
        if not leftovers:
            return
        discard_connection(self.alias)
        logger.warning(
            "job %s %s: %s, but the task left %s on its database connection; the "
            "connection was discarded",
            job.id,
            job.task,
            outcome,
            ", ".join(leftovers),
            extra={"action": "leak", "job_id": job.id, "worker_id": self.worker_id},
        )

    def finished(self, completion: Completion) -> None:
        """Report a completion the completer recorded: the "done" line and Django's
        ``task_finished``, with ``current_job()`` set as it was while the task ran."""
        token = _current.set(completion.current)
        try:
            self._report_done(
                completion.job,
                completion.value,
                completion.elapsed,
                completion.task_result,
                transactional=False,
            )
        finally:
            _current.reset(token)

    def _report_done(
        self,
        job: Job,
        value: object,
        elapsed: float,
        task_result: TaskResult,
        *,
        transactional: bool,
    ) -> None:
        logger.info(
            "job %s %s done in %.3fs (attempt %d%s)",
            job.id,
            job.task,
            elapsed,
            job.attempts,
            ", transactional" if transactional else "",
            extra={"action": "done", "job_id": job.id, "worker_id": self.worker_id},
        )
        object.__setattr__(task_result, "status", TaskResultStatus.SUCCESSFUL)
        object.__setattr__(task_result, "_return_value", value)
        self._signal(task_finished, task_result)

    def _record(
        self,
        job: Job,
        outcome: str,
        *,
        result: object = None,
        error: BaseException | None = None,
        retry: bool = True,
    ) -> str | bool | None:
        """Write a job's outcome, fenced; retry through database errors for about one
        lease, then give up and let the lease expire (the sweeper recovers the job)."""
        self._mark_recording(job)
        manager = Job.objects.db_manager(self.alias)
        deadline = time.monotonic() + self.lease_seconds
        failures = 0
        while True:
            try:
                if outcome == "complete":
                    written: str | bool | None = manager.complete(
                        job, self.worker_id, result=result
                    )
                else:
                    assert error is not None
                    written = manager.fail(job, self.worker_id, error, retry=retry)
                break
            except DatabaseError as exc:
                failures += 1
                close_connection(self.alias)
                if time.monotonic() > deadline or self.done.is_set():
                    logger.error(
                        "job %s: could not record %s (%s); its lease will expire",
                        job.id,
                        outcome,
                        exc,
                        extra={
                            "action": outcome,
                            "job_id": job.id,
                            "worker_id": self.worker_id,
                        },
                    )
                    return None
                delay = backoff_delay(failures)
                logger.warning(
                    "job %s: could not record %s (%s); retrying in %.1fs",
                    job.id,
                    outcome,
                    first_line(exc),
                    delay,
                    extra={"action": outcome, "job_id": job.id, "worker_id": self.worker_id},
                )
                time.sleep(delay)
        if written in (None, False):
            self.stats.count("lost")
            logger.warning(
                "job %s: lease lost before %s was recorded; another worker owns it now",
                job.id,
                outcome,
                extra={
                    "action": "lease_lost",
                    "job_id": job.id,
                    "worker_id": self.worker_id,
                },
            )
        elif outcome == "complete":
            self.stats.count("done")
        else:
            self.stats.count("failed")
        return written
