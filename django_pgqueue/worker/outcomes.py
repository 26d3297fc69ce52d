"""Reporting a recorded outcome: the worker's log line and Django's task signals.

Both the runner threads (failures, transactional completions) and the completer thread
(batched completions) report through one :class:`Reporter`, built before either of
them, so neither needs the other. Reporting is on the path of every job, so it does
nothing it need not: no log record below the logger's level, no ``TaskResult`` and no
signal without receivers.
"""

from __future__ import annotations

import logging

from django.dispatch import Signal

from ..models import Job
from ..taskapi import TaskResult, TaskResultStatus, task_finished
from ..tasks import CurrentJob, _current

logger = logging.getLogger(__name__)


class Reporter:
    """Sends Django's ``task_started``/``task_finished`` with ``sender`` (the backend
    class, as Django's own backends send them) and logs the "done" line."""

    def __init__(self, *, sender: type, worker_id: str) -> None:
        self.sender = sender
        self.worker_id = worker_id

    def wants(self, signal: Signal) -> bool:
        """Whether ``signal`` has receivers (else its ``TaskResult`` need not exist)."""
        return signal.has_listeners(self.sender)

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
