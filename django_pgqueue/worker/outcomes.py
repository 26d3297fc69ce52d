"""Reporting a recorded outcome: the worker's log line and Django's task signals.

Both the runner threads (failures, transactional completions) and the completer thread
(batched completions) report through one :class:`Reporter`, built before either of
them, so neither needs the other. Reporting is on the path of every job, so it does
nothing it need not: no log record below the logger's level, no ``TaskResult`` and no
signal that would change nothing.

"Would change nothing" includes Django's own receivers: the framework connects
``log_task_started`` and ``log_task_finished`` itself, and Django's default logging
sends the ``django`` loggers' INFO records to a console handler that drops them unless
``DEBUG`` is on. Building a ``TaskResult`` and a log record per job only to have them
dropped was about a sixth of a no-op job's cost in the worker, so a signal whose only
receivers are those two is not sent while the line they would log reaches no handler
(:func:`would_log`, asked again every ``RECHECK_SECONDS`` and whenever the signal's
receivers change).
"""

from __future__ import annotations

import logging
import time

from django.dispatch import Signal

from ..exceptions import exception_line
from ..framework import to_task_result
from ..models import Job
from ..states import Status
from ..taskapi import (
    FRAMEWORK,
    LOG_RECEIVERS,
    Task,
    TaskResult,
    TaskResultStatus,
    task_finished,
)
from ..tasks import CurrentJob, _current

logger = logging.getLogger(__name__)

#: How long an answer of :meth:`Reporter.wants` is kept (seconds) while the signal's
#: receivers stay the same: a logging configuration changed at run time is seen
#: within this long.
RECHECK_SECONDS = 1.0


def would_log(log: logging.Logger, level: int) -> bool:
    """Whether a record of ``level`` on ``log`` would reach a handler that emits it:
    the logger's level and filters, then each handler's level and filters up the
    hierarchy (as ``Logger.handle`` and ``callHandlers`` apply them), and Python's
    last-resort handler when there is no handler at all. A filter that decides by
    something other than the record (a clock, a counter) is asked once, with a probe."""
    if log.disabled or not log.isEnabledFor(level):
        return False
    record = log.makeRecord(log.name, level, __file__, 0, "probe", (), None)
    if not log.filter(record):
        return False
    found = False
    current: logging.Logger | None = log
    while current is not None:
        for handler in current.handlers:
            found = True
            if level >= handler.level and handler.filter(record):
                return True
        current = current.parent if current.propagate else None
    last = logging.lastResort
    return not found and last is not None and level >= last.level


class Reporter:
    """Sends Django's ``task_started``/``task_finished`` with ``sender`` (the backend
    class, as Django's own backends send them) and logs each recorded outcome: done,
    cancelled, failed. The line and the signal follow the status the write returned,
    so a job whose cancellation landed after its task returned is reported cancelled
    (``task_finished`` FAILED, as ``TaskResult`` maps cancelled), not done."""

    def __init__(self, *, sender: type, worker_id: str) -> None:
        self.sender = sender
        self.worker_id = worker_id
        self._framework_log = logging.getLogger(FRAMEWORK)
        #: (signal, level) -> (its receivers' keys, answer valid until, answer).
        self._wants: dict[tuple[int, int], tuple[tuple[object, ...], float, bool]] = {}

    def wants(self, signal: Signal, level: int = logging.INFO) -> bool:
        """Whether sending ``signal`` could do anything (else its ``TaskResult`` need not
        exist): it has a receiver other than the framework's own log receivers, or
        their line, logged at ``level``, would be emitted. Cached per signal and level
        for ``RECHECK_SECONDS`` while its receivers stay the same."""
        try:
            keys = tuple(entry[0] for entry in signal.receivers)
        except (TypeError, IndexError):  # another Django's layout: ask every time
            return self._decide(signal, level)
        now = time.monotonic()
        cached = self._wants.get((id(signal), level))
        if cached is not None and cached[0] == keys and now < cached[1]:
            return cached[2]
        answer = self._decide(signal, level)
        self._wants[(id(signal), level)] = (keys, now + RECHECK_SECONDS, answer)
        return answer

    def _decide(self, signal: Signal, level: int) -> bool:
        try:
            sync, asynchronous = signal._live_receivers(self.sender)
        except (AttributeError, TypeError, ValueError):  # not Django 5.0+: be safe, send
            return signal.has_listeners(self.sender)
        receivers = [*sync, *asynchronous]
        if not receivers:
            return False
        if any(receiver not in LOG_RECEIVERS for receiver in receivers):
            return True
        return would_log(self._framework_log, level)

    def signal(self, signal: Signal, task_result: TaskResult | None) -> None:
        """Send a Django task signal; a failing receiver is logged, never fatal to the
        job (it would otherwise lose the job to a lease expiry with no error kept).
        ``task_result`` is None only when the signal had no receivers at the start."""
        if task_result is None:
            return
        for receiver, response in signal.send_robust(self.sender, task_result=task_result):
            if isinstance(response, Exception):
                logger.error(
                    "signal receiver %r raised; the job goes on",
                    receiver,
                    exc_info=response,
                    extra={"action": "signal", "job_id": task_result.id},
                )

    def done(
        self,
        job: Job,
        value: object,
        elapsed: float,
        task_result: TaskResult | None,
        *,
        transactional: bool,
        current: CurrentJob | None = None,
    ) -> None:
        """Report a success that was recorded: the "done" line, then ``task_finished``
        (with ``current_job()`` set to ``current`` while the receivers run, as it was
        while the task ran, when the report comes from another thread)."""
        if logger.isEnabledFor(logging.INFO):
            logger.info(
                "job %s %s done in %.3fs (attempt %d%s)",
                job.id,
                job.task,
                elapsed,
                job.attempts,
                ", transactional" if transactional else "",
                extra={"action": "done", "job_id": job.id, "worker_id": self.worker_id},
            )
        if task_result is None:
            return
        object.__setattr__(task_result, "status", TaskResultStatus.SUCCESSFUL)
        object.__setattr__(task_result, "_return_value", value)
        token = None if current is None else _current.set(current)
        try:
            self.signal(task_finished, task_result)
        finally:
            if token is not None:
                _current.reset(token)

    def cancelled(
        self,
        job: Job,
        task: Task | None,
        task_result: TaskResult | None,
        elapsed: float,
        *,
        current: CurrentJob | None = None,
    ) -> None:
        """Report a job whose recorded outcome is ``cancelled`` although its task
        returned (its result is kept): the line, then ``task_finished`` FAILED."""
        logger.info(
            "job %s %s cancelled after %.3fs (the task returned; its cancellation was "
            "requested while it ran)",
            job.id,
            job.task,
            elapsed,
            extra={"action": "cancel", "job_id": job.id, "worker_id": self.worker_id},
        )
        token = None if current is None else _current.set(current)
        try:
            self.finished_failed(job, task, task_result)
        finally:
            if token is not None:
                _current.reset(token)

    def failed(
        self,
        job: Job,
        task: Task | None,
        task_result: TaskResult | None,
        exc: BaseException,
        status: str,
        elapsed: float,
    ) -> None:
        """Log a recorded failure and, if it ended the job, send ``task_finished``.

        An attempt that will be retried (``scheduled``) is one warning line with the
        exception's first line (its traceback is in the job's errors) and no signal:
        the job is not finished, as Django's ``TaskResult`` of it still says (READY).
        The final failure (``dead``) is logged at error level with its traceback, a
        cancellation at info level; then ``task_finished`` is sent with status FAILED,
        once per job."""
        log_extra = {"job_id": job.id, "worker_id": self.worker_id}
        if status == Status.SCHEDULED:
            logger.warning(
                "job %s %s failed after %.3fs (attempt %d/%d), will retry: %s",
                job.id,
                job.task,
                elapsed,
                job.attempts,
                job.max_attempts,
                exception_line(exc),
                extra={"action": "retry", **log_extra},
            )
            return
        if status == Status.CANCELLED:
            logger.info(
                "job %s %s cancelled after %.3fs (%s)",
                job.id,
                job.task,
                elapsed,
                exception_line(exc),
                extra={"action": "cancel", **log_extra},
            )
        else:
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
        self.finished_failed(job, task, task_result)

    def finished_failed(self, job: Job, task: Task | None, task_result: TaskResult | None) -> None:
        """Send ``task_finished`` with status FAILED, if it would do anything (asked at
        error level: Django's own receiver logs a failure at that level). Without a
        ``TaskResult`` or the ``task`` to build one, nothing is sent."""
        if task_result is None:
            if task is None or not self.wants(task_finished, logging.ERROR):
                return
            task_result = to_task_result(job, task)
        object.__setattr__(task_result, "status", TaskResultStatus.FAILED)
        self.signal(task_finished, task_result)
