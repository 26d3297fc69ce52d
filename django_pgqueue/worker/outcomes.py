"""Reporting a recorded outcome: the worker's log line and Django's task signals.

Both the runner threads (failures, transactional completions) and the completer thread
(batched completions) report through one :class:`Reporter`, built before either of
them, so neither needs the other. Reporting is on the path of every job, so it does
nothing it need not: no log record below the logger's level, no ``TaskResult`` and no
signal that would change nothing.

**One line per job.** The worker logs one line per recorded outcome (``job 42
app.tasks.send done in 0.004s (attempt 1)``: id, task, outcome, duration, attempt) on
``django_pgqueue.worker.outcomes``. Django's framework logs two more per job from its
own receivers of ``task_started`` and ``task_finished`` (``Task id=42 path=... state=
RUNNING``, then ``SUCCESSFUL`` or ``FAILED``, on ``django.tasks``), which say nothing
the worker's line does not. With a console handler on the root logger (how most
projects configure logging) each job wrote all three, and with ``DEBUG`` on Django's
two twice (Django's own console handler and the root's); written per job, each line
cost more than the rest of a no-op job (``bench.compare``, stock configuration).

So the worker *folds* Django's per-job lines into its own: it calls the framework's
two log receivers only when their line would reach a destination that the worker's own
line does not reach (:func:`destinations`: a handler's stream or file, else the
handler itself), for example a handler the project put on ``django.tasks`` or on
``django`` (Django's ``mail_admins`` takes a failure's ERROR line). Every other
receiver of the two signals (the project's, a library's) gets every signal, whatever
the logging. ``PGQUEUE_FRAMEWORK_LOG_LINES = True`` writes Django's lines wherever
logging sends them, beside the worker's; ``False`` never. The answer is kept for
``RECHECK_SECONDS`` and asked again sooner whenever the signal's receivers change.

Without its lines and without other receivers, a signal is not sent at all, and its
``TaskResult`` is not built (unless the task takes a context). The worker's own line is
made without the caller lookup that ``Logger.info`` does (:meth:`Reporter.line`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Hashable
from enum import Enum
from typing import Any

from asgiref.sync import async_to_sync
from django.dispatch import Signal

from ..conf import settings
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
from ..tasks import RunningJob, _current

logger = logging.getLogger(__name__)

#: How long an answer of :meth:`Reporter.plan` is kept (seconds) while the signal's
#: receivers stay the same: a logging configuration changed at run time is seen
#: within this long.
RECHECK_SECONDS = 1.0


class Send(Enum):
    """What sending a signal takes (see :meth:`Reporter.plan`)."""

    #: Nothing would change: no ``TaskResult``, no signal.
    NOTHING = 0
    #: Every receiver but the framework's log receivers (their line is folded).
    OTHERS = 1
    #: Every receiver, as ``Signal.send_robust`` sends it.
    ALL = 2


def _handlers(log: logging.Logger, level: int) -> list[logging.Handler] | None:
    """The handlers that would emit a record of ``level`` on ``log``: the logger's
    level and filters, then each handler's level and filters up the hierarchy (as
    ``Logger.handle`` and ``callHandlers`` apply them), and Python's last-resort
    handler when there is no handler at all. None: the logger drops the record. A
    filter that decides by something other than the record (a clock, a counter) is
    asked once, with a probe."""
    if log.disabled or not log.isEnabledFor(level):
        return None
    record = log.makeRecord(log.name, level, __file__, 0, "probe", (), None)
    if not log.filter(record):
        return None
    found = False
    emitting: list[logging.Handler] = []
    current: logging.Logger | None = log
    while current is not None:
        for handler in current.handlers:
            found = True
            if level >= handler.level and handler.filter(record):
                emitting.append(handler)
        current = current.parent if current.propagate else None
    last = logging.lastResort
    if not found and last is not None and level >= last.level:
        emitting.append(last)
    return emitting


def would_log(log: logging.Logger, level: int) -> bool:
    """Whether a record of ``level`` on ``log`` would reach a handler that emits it."""
    return bool(_handlers(log, level))


def destination(handler: logging.Handler) -> Hashable:
    """Where ``handler`` writes: the file it writes to (by device and inode, so that a
    ``StreamHandler`` on a redirected ``stderr`` and a ``FileHandler`` on the same file
    are one place, as are two handlers on one ``stderr``), else its stream, else the
    handler itself (a mail, socket or queue handler)."""
    stream = getattr(handler, "stream", None)
    if stream is None and isinstance(handler, logging.FileHandler):  # opened lazily
        try:
            found = os.stat(handler.baseFilename)
        except OSError:
            return ("path", handler.baseFilename)
        return ("file", found.st_dev, found.st_ino)
    if stream is not None:
        try:
            found = os.fstat(stream.fileno())
        except (AttributeError, OSError, ValueError):  # no file behind it (StringIO)
            return ("stream", id(stream))
        return ("file", found.st_dev, found.st_ino)
    return ("handler", id(handler))


def destinations(log: logging.Logger, level: int) -> set[Hashable]:
    """Where a record of ``level`` on ``log`` would be written (see :func:`destination`);
    empty if nowhere."""
    return {destination(handler) for handler in _handlers(log, level) or ()}


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
        #: (signal, level) -> (a copy of its receivers, answer valid until, answer).
        self._plans: dict[tuple[int, int], tuple[list[Any], float, Send]] = {}

    def wants(self, signal: Signal, level: int = logging.INFO) -> bool:
        """Whether sending ``signal`` could do anything (else its ``TaskResult`` need
        not exist): see :meth:`plan`."""
        return self.plan(signal, level) is not Send.NOTHING

    def plan(self, signal: Signal, level: int = logging.INFO) -> Send:
        """What sending ``signal`` (whose framework line is logged at ``level``) takes:
        its receivers other than the framework's log receivers get it always; those
        get it if their line is wanted (:meth:`framework_lines`). Cached per signal and
        level for ``RECHECK_SECONDS`` while its receivers stay the same."""
        receivers = signal.receivers  # (connect() and disconnect() change this list)
        now = time.monotonic()
        cached = self._plans.get((id(signal), level))
        if cached is not None and now < cached[1] and cached[0] == receivers:
            return cached[2]
        answer = self._decide(signal, level)
        self._plans[(id(signal), level)] = (list(receivers), now + RECHECK_SECONDS, answer)
        return answer

    def _decide(self, signal: Signal, level: int) -> Send:
        try:
            sync, asynchronous = signal._live_receivers(self.sender)
        except (AttributeError, TypeError, ValueError):  # not Django 5.0+: be safe, send
            return Send.ALL if signal.has_listeners(self.sender) else Send.NOTHING
        receivers = [*sync, *asynchronous]
        logs = [receiver for receiver in receivers if receiver in LOG_RECEIVERS]
        if logs and self.framework_lines(level):
            return Send.ALL
        return Send.OTHERS if len(logs) < len(receivers) else Send.NOTHING

    def framework_lines(self, level: int) -> bool:
        """Whether the framework's own log line of a job at ``level`` is to be written
        (see the module docstring): per ``PGQUEUE_FRAMEWORK_LOG_LINES``, or by default
        if it would be written somewhere the worker's own line at that level is not."""
        choice = settings.FRAMEWORK_LOG_LINES
        if choice is not None:
            return bool(choice) and would_log(self._framework_log, level)
        theirs = destinations(self._framework_log, level)
        return bool(theirs - destinations(logger, level))

    def signal(
        self, signal: Signal, task_result: TaskResult | None, level: int = logging.INFO
    ) -> None:
        """Send a Django task signal as :meth:`plan` says; a failing receiver is logged,
        never fatal to the job (it would otherwise lose the job to a lease expiry with
        no error kept). ``task_result`` is None only when the signal had no receivers
        at the start."""
        if task_result is None:
            return
        plan = self.plan(signal, level)
        if plan is Send.NOTHING:
            return
        if plan is Send.ALL:
            responses = signal.send_robust(self.sender, task_result=task_result)
        else:
            responses = self._send_others(signal, task_result)
        for receiver, response in responses:
            if isinstance(response, Exception):
                logger.error(
                    "signal receiver %r raised; the job goes on",
                    receiver,
                    exc_info=response,
                    extra={"action": "signal", "job_id": task_result.id},
                )

    def _send_others(
        self, signal: Signal, task_result: TaskResult
    ) -> list[tuple[Callable[..., Any], Any]]:
        """``signal.send_robust`` to every receiver but the framework's log receivers:
        synchronous ones in order, then the asynchronous ones together (as Django
        sends them)."""
        sync, asynchronous = signal._live_receivers(self.sender)
        named = {"signal": signal, "sender": self.sender, "task_result": task_result}
        responses: list[tuple[Callable[..., Any], Any]] = []
        for receiver in sync:
            if receiver in LOG_RECEIVERS:
                continue
            try:
                responses.append((receiver, receiver(**named)))
            except Exception as err:  # noqa: BLE001 - reported by the caller
                responses.append((receiver, err))
        wanted = [receiver for receiver in asynchronous if receiver not in LOG_RECEIVERS]
        if wanted:

            async def call(receiver: Callable[..., Any]) -> Any:
                try:
                    return await receiver(**named)
                except Exception as err:  # noqa: BLE001 - reported by the caller
                    return err

            async def gather() -> list[Any]:
                return list(await asyncio.gather(*(call(r) for r in wanted)))

            responses.extend(zip(wanted, async_to_sync(gather)(), strict=True))
        return responses

    def line(self, level: int, msg: str, args: tuple[Any, ...], action: str, job_id: int) -> None:
        """Log one of the worker's per-job lines on this module's logger, with the
        ``extra`` fields ``action``, ``job_id`` and ``worker_id``. What ``Logger.info``
        does, less its search of the call stack for the caller (the record names this
        module, and the method of the outcome as ``funcName``): a few microseconds of
        every job's line."""
        if not logger.isEnabledFor(level):
            return
        record = logger.makeRecord(logger.name, level, __file__, 0, msg, args, None, action)
        record.action = action
        record.job_id = job_id
        record.worker_id = self.worker_id
        logger.handle(record)

    def done(
        self,
        job: Job,
        value: object,
        elapsed: float,
        task_result: TaskResult | None,
        *,
        transactional: bool,
        current: RunningJob | None = None,
    ) -> None:
        """Report a success that was recorded: the "done" line, then ``task_finished``
        (with ``current_job()`` set to ``current`` while the receivers run, as it was
        while the task ran, when the report comes from another thread)."""
        if logger.isEnabledFor(logging.INFO):  # (else not even the line's arguments)
            how = ", transactional" if transactional else ""
            self.line(
                logging.INFO,
                "job %s %s done in %.3fs (attempt %d%s)",
                (job.id, job.task, elapsed, job.attempts, how),
                "done",
                job.id,
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
        current: RunningJob | None = None,
    ) -> None:
        """Report a job whose recorded outcome is ``cancelled`` although its task
        returned (its result is kept): the line, then ``task_finished`` FAILED."""
        self.line(
            logging.INFO,
            "job %s %s cancelled after %.3fs (attempt %d; the task returned, its "
            "cancellation was requested while it ran)",
            (job.id, job.task, elapsed, job.attempts),
            "cancel",
            job.id,
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
                "job %s %s cancelled after %.3fs (attempt %d: %s)",
                job.id,
                job.task,
                elapsed,
                job.attempts,
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
        self.signal(task_finished, task_result, logging.ERROR)
