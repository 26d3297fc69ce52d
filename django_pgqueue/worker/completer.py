"""The completer thread: records successful ordinary jobs in batches, fenced.

A runner thread that finished an ordinary (non-transactional) task hands the job and its
return value here and takes the next job at once. This thread writes up to
``max_batch`` completions with one statement (``sql.JOB_COMPLETE_MANY``), fenced on
(owner, attempt, claim time) row by row, at most ``interval`` seconds after the first
of them arrived (``PGQUEUE_COMPLETION_BATCH_SIZE`` and
``PGQUEUE_COMPLETION_FLUSH_INTERVAL``), and on shutdown. A job stays in the worker's
held table (so the heartbeat keeps extending its lease) until its completion is
written or given up; a job whose completion was never written is recovered by the
sweeper when its lease expires, like any job of a worker that died, so delivery stays
at-least-once and a job is never marked done without the fenced write.

Transactional tasks and failures are still recorded inline by the runner thread.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError

from ..models import Job
from ..taskapi import TaskResult
from ..tasks import CurrentJob
from .connections import backoff_delay, close_connection, configure_session, first_line
from .state import WorkerPart, WorkerState

if TYPE_CHECKING:
    from .runner import JobRunner

# One logger for everything a worker does, whichever module holds the code: configuring
# ``django_pgqueue.worker`` covers all of its threads.
logger = logging.getLogger(__name__)


@dataclass
class Completion:
    """A successful run waiting to be recorded: what the "done" log line and Django's
    ``task_finished`` signal need once the write succeeded."""

    job: Job
    value: Any
    elapsed: float
    task_result: TaskResult
    current: CurrentJob | None


class Completer(WorkerPart):
    """Batches the completions of one worker's runner threads; one thread runs ``run``.

    ``held`` (guarded by ``lock``) is the worker's table of held jobs: entries of
    submitted jobs are removed here, once written or given up; ``wakeup`` is set then,
    so the claim loop sees the freed room. Outcomes are counted in ``stats`` and
    reported through ``runner.finished``."""

    def __init__(
        self, state: WorkerState, *, runner: JobRunner, interval: float, max_batch: int
    ) -> None:
        super().__init__(state)
        self.runner = runner
        self.interval = interval
        self.max_batch = max_batch
        self._pending: list[Completion] = []
        self._cond = threading.Condition()
        self._stopping = False
        #: Statements written (flushes that reached the database), for tests and stats.
        self.flushes = 0

    def submit(self, completion: Completion) -> None:
        """Queue a successful run for the next flush (its held entry stays)."""
        with self._cond:
            self._pending.append(completion)
            # Wake the thread to start a batch's interval, or to write a full batch.
            if len(self._pending) in (1, self.max_batch):
                self._cond.notify()

    def stop(self) -> None:
        """Flush what is pending now, then let ``run`` return."""
        with self._cond:
            self._stopping = True
            self._cond.notify()

    def run(self) -> None:
        """The thread's body: flush batches until stopped and nothing is pending."""
        try:
            try:
                # Connect and label the connection now, not at the first flush.
                configure_session(self.alias, "completer", self.worker_id)
            except DatabaseError:
                close_connection(self.alias)  # the first flush retries
            while True:
                batch = self._next_batch()
                if batch is None:
                    return
                try:
                    self.flush(batch)
                except BaseException:
                    # A bug of ours must not stop completions for good: these jobs'
                    # leases expire (their entries are dropped) and are recovered.
                    logger.exception(
                        "worker %s: internal error while recording completions; their "
                        "leases will expire",
                        self.worker_id,
                        extra={"action": "error", "worker_id": self.worker_id},
                    )
                    close_connection(self.alias)
                    self._forget(batch)
        finally:
            close_connection(self.alias)

    def _next_batch(self) -> list[Completion] | None:
        """Wait for work, then up to ``interval`` for more (or ``max_batch`` of it)."""
        with self._cond:
            while not self._pending:
                if self._stopping:
                    return None
                self._cond.wait()
            deadline = time.monotonic() + self.interval
            while len(self._pending) < self.max_batch and not self._stopping:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            batch = self._pending[: self.max_batch]
            del self._pending[: self.max_batch]
            return batch

    def flush(self, batch: list[Completion]) -> None:
        """Write ``batch`` with one fenced statement and report each job's outcome;
        retry through database errors for about one lease, then give up (the leases
        expire and the sweeper recovers the jobs: never done without the fenced write)."""
        manager = Job.objects.db_manager(self.alias)
        deadline = time.monotonic() + self.lease_seconds
        failures = 0
        while True:
            try:
                configure_session(self.alias, "completer", self.worker_id)
                recorded = manager.complete_many([(c.job, c.value) for c in batch], self.worker_id)
                break
            except DatabaseError as exc:
                failures += 1
                close_connection(self.alias)
                if time.monotonic() > deadline:
                    for c in batch:
                        logger.error(
                            "job %s: could not record complete (%s); its lease will expire",
                            c.job.id,
                            exc,
                            extra={
                                "action": "complete",
                                "job_id": c.job.id,
                                "worker_id": self.worker_id,
                            },
                        )
                    self._forget(batch)
                    return
                delay = backoff_delay(failures)
                for c in batch:
                    logger.warning(
                        "job %s: could not record complete (%s); retrying in %.1fs",
                        c.job.id,
                        first_line(exc),
                        delay,
                        extra={
                            "action": "complete",
                            "job_id": c.job.id,
                            "worker_id": self.worker_id,
                        },
                    )
                time.sleep(delay)
        self.flushes += 1
        # Free the slots first: the claim loop may go on while the receivers run.
        self._forget(batch)
        for c, ok in zip(batch, recorded, strict=True):
            if ok:
                self.stats.count("done")
                self.runner.finished(c)
            else:
                self.stats.count("lost")
                logger.warning(
                    "job %s: lease lost before %s was recorded; another worker owns it now",
                    c.job.id,
                    "complete",
                    extra={
                        "action": "lease_lost",
                        "job_id": c.job.id,
                        "worker_id": self.worker_id,
                    },
                )

    def _forget(self, batch: list[Completion]) -> None:
        """Drop the held entries of ``batch`` (not a newer claim of the same job)."""
        with self.lock:
            for c in batch:
                entry = self.held.get(c.job.id)
                if entry is not None and entry.job is c.job:
                    del self.held[c.job.id]
        self.wakeup.set()
