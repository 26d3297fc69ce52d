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

When the worker is otherwise idle (nothing else running, waiting to run or pending
here), the runner thread writes its job's completion itself, with the same statement
and fence, rather than hand it over: the hand-over's wake-up and GIL switch were a
large part of an idle worker's pickup-to-done latency.

Transactional tasks and failures are still recorded inline by the runner thread. Each
recorded job is reported (log line, ``task_finished``) through the worker's
:class:`~django_pgqueue.worker.outcomes.Reporter`, by the status the write returned: a
job whose cancellation was requested after its last lease extension ends
``cancelled``, and is reported and counted so.

A batch the database refuses for its data (a result jsonb cannot hold, which the
runner's validation should have caught) is not retried: it is split in halves, each
written on its own, down to the one row refused, whose attempt fails for good with the
database's reason, while the others are done.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError

from .. import validation
from ..exceptions import InvalidResult
from ..models import Job
from ..reconnect import close_connection
from ..states import Status
from ..taskapi import Task, TaskResult
from ..tasks import RunningJob
from .connections import configure_session, drop_connection
from .outcomes import Reporter
from .state import DataRefused, WorkerPart, WorkerState, refusal

logger = logging.getLogger(__name__)

#: Flush intervals up to this (seconds) only batch bursts: with nothing else in flight,
#: a completion is written at once. A longer interval is a request to hold completions
#: (fewest commits, whatever the latency), and holds each one that long.
IDLE_FLUSH_MAX_INTERVAL = 1.0


@dataclass
class Completion:
    """A successful run waiting to be recorded: what the "done" log line and Django's
    ``task_finished`` signal need once the write succeeded."""

    job: Job
    value: Any
    elapsed: float
    task_result: TaskResult | None  # None: no receiver of task_finished wanted one
    current: RunningJob | None
    #: ``value``'s JSON text, made when the runner validated it (None: encode here).
    text: str | None = None
    #: The job's task, to build a ``TaskResult`` if a failure's signal needs one.
    task: Task | None = None


class Completer(WorkerPart):
    """Batches the completions of one worker's runner threads; one thread runs ``run``.

    Entries of submitted jobs are removed from the held table here, once written or
    given up (which wakes the claim loop: room freed). Outcomes are counted in
    ``stats`` and reported through ``reporter``."""

    def __init__(
        self, state: WorkerState, *, reporter: Reporter, interval: float, max_batch: int
    ) -> None:
        super().__init__(state)
        self.reporter = reporter
        self.interval = interval
        self.max_batch = max_batch
        self._pending: list[Completion] = []
        self._cond = threading.Condition()
        self._stopping = False
        #: Write what arrives at once, no batching (the process is about to be replaced).
        self._hurry = False
        #: Statements written (flushes that reached the database), for tests and stats.
        self.flushes = 0

    def submit(self, completion: Completion, *, last: bool, inline: bool = True) -> None:
        """Queue a successful run for the next flush (its held entry stays). ``last``:
        no other job of this worker runs or waits to run, so nothing more is coming
        soon and the batch is written at once: by the calling (runner) thread itself
        when nothing else is pending and ``inline`` allows it (not on the event loop,
        which must not wait for the database), which saves the hand-over to this
        thread (a wake-up and a GIL switch) on the path of an idle worker's job."""
        with self._cond:
            inline = (
                inline
                and last
                and not self._pending
                and not self._stopping
                and self.interval <= IDLE_FLUSH_MAX_INTERVAL
            )
            if not inline:
                self._pending.append(completion)
                # Wake the thread to start a batch, to write a full one, or to write now.
                if last or len(self._pending) in (1, self.max_batch):
                    self._cond.notify()
        if inline:
            self._flush_guarded([completion], role="runner")

    def hurry(self) -> None:
        """Write what is pending now, and each completion as it arrives from now on
        (the process is about to be replaced for a hard time limit)."""
        with self._cond:
            self._hurry = True
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
                self._flush_guarded(batch)
        finally:
            close_connection(self.alias)

    def _flush_guarded(self, batch: list[Completion], *, role: str = "completer") -> None:
        """``flush``, on whichever thread: a bug of ours must not stop completions for
        good, so these jobs' leases expire instead (their entries are dropped) and the
        sweeper recovers them."""
        try:
            self.flush(batch, role=role)
        except BaseException:
            logger.exception(
                "worker %s: internal error while recording completions; their leases will expire",
                self.worker_id,
                extra={"action": "error", "worker_id": self.worker_id},
            )
            drop_connection(self.alias)
            self.state.forget(c.job for c in batch)

    def _next_batch(self) -> list[Completion] | None:
        """Wait for work; then up to ``interval`` for more of it (or ``max_batch``) while
        other jobs of this worker are still running or waiting to run (a burst). With
        nothing else in flight the batch is written at once, so an idle worker records
        a job about a millisecond after its task returned; unless ``interval`` is above
        ``IDLE_FLUSH_MAX_INTERVAL``, which holds every completion that long."""
        with self._cond:
            while not self._pending:
                if self._stopping:
                    return None
                self._cond.wait()
            deadline = time.monotonic() + self.interval
            while (
                len(self._pending) < self.max_batch
                and not self._stopping
                and not self._hurry
                and (self.interval > IDLE_FLUSH_MAX_INTERVAL or self.state.in_flight())
            ):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            batch = self._pending[: self.max_batch]
            del self._pending[: self.max_batch]
            return batch

    def flush(self, batch: list[Completion], *, role: str = "completer") -> None:
        """Write ``batch`` with one fenced statement and report each job's outcome;
        through database errors retry for about one lease, then give up (the leases
        expire and the sweeper recovers the jobs: never done without the fenced write).
        A batch refused for its data is split (see ``_split``)."""
        results = [
            (c.job, validation.result_json(c.value) if c.text is None else c.text) for c in batch
        ]

        def write() -> list[str | None]:
            configure_session(self.alias, role, self.worker_id)  # the thread's label
            return self.state.jobs.complete_many_status(results, self.worker_id, encoded=True)

        try:
            _, statuses = self.write_retrying(
                write, jobs=[c.job for c in batch], outcome="complete"
            )
        except DataRefused as exc:
            self._split(batch, exc, role=role)
            return
        # Free the slots first: the claim loop may go on while the receivers run.
        self.state.forget(c.job for c in batch)
        if statuses is None:
            return  # given up
        self.flushes += 1
        self.state.stats.count("done", statuses.count(Status.DONE))
        for c, status in zip(batch, statuses, strict=True):
            if status == Status.DONE:
                self.reporter.done(
                    c.job,
                    c.value,
                    c.elapsed,
                    c.task_result,
                    transactional=False,
                    current=c.current,
                )
            elif status == Status.CANCELLED:  # requested after the last lease extension
                self.state.stats.count("cancelled")
                self.reporter.cancelled(c.job, c.task, c.task_result, c.elapsed, current=c.current)
            else:
                self.report_lost(c.job, "complete")

    def _split(self, batch: list[Completion], refused: DataRefused, *, role: str) -> None:
        """A batch the database refused for its data: write each half on its own, down
        to the refused row, whose attempt fails for good (dead, or cancelled if that
        was requested) with the database's reason: its value can never be stored."""
        if len(batch) > 1:
            half = len(batch) // 2
            self.flush(batch[:half], role=role)
            self.flush(batch[half:], role=role)
            return
        (c,) = batch
        error = InvalidResult(refusal(str(refused)))
        try:
            status = self.record_failure(c.job, error, retry=False)
        finally:
            self.state.forget([c.job])
        if status is not None:
            self.reporter.failed(c.job, c.task, c.task_result, error, status, c.elapsed)
