"""The heartbeat thread: keeps the leases of the jobs a worker holds alive.

It extends leases on its own connection, never inside a task's transaction, fenced on
(owner, attempt). It stops extending a job whose task ran past its timeout, so the
sweeper hands that job to another worker and the late return, recorded as a timed-out
attempt (``runner._returned_in_time``), is fenced out; and it
marks jobs whose lease it found taken back, so a prefetched one is never started.
While it fails, the worker claims nothing (see :meth:`Heartbeat.healthy`).
"""

from __future__ import annotations

import logging
import time

from django.db import DatabaseError

from ..conf import settings
from ..exceptions import first_line
from ..models import Job
from ..reconnect import Retry, close_connection
from . import presence
from .connections import bounded
from .state import WorkerPart, WorkerState

logger = logging.getLogger(__name__)


class Heartbeat(WorkerPart):
    """Extends the leases in ``held`` (guarded by ``lock``) every third of a lease,
    until ``done`` is set. It reads each entry's start time and timeout, and sets its
    ``lost`` and ``timed_out`` flags; it never adds or removes entries."""

    def __init__(self, state: WorkerState) -> None:
        super().__init__(state)
        #: When a beat last succeeded (time.monotonic()).
        self.ok_at = time.monotonic()

    def healthy(self) -> bool:
        """Claiming stops when the heartbeat has not succeeded for half a lease: jobs
        claimed now would have leases nobody extends."""
        return time.monotonic() - self.ok_at < self.lease_seconds / 2

    def run(self) -> None:
        """The thread's body: beat, and back off while beats fail."""
        interval = max(0.05, self.lease_seconds / 3)
        retry = Retry(self.alias, stop=self.state.done)
        next_beat = time.monotonic() + interval
        tick = min(interval, presence.FIGURES_SECONDS)
        try:
            while retry.wait() if retry.failures else not self.state.done.wait(tick):
                if not retry.failures and time.monotonic() < next_beat:
                    presence.refresh(self.state)  # between beats: only a row behind
                    continue
                next_beat = time.monotonic() + interval
                try:
                    self.beat()
                except Exception as exc:  # noqa: BLE001 - a database error or a bug
                    retry.failed()
                    logger.warning(
                        "worker %s: heartbeat failed (%s); not claiming until it recovers",
                        self.worker_id,
                        first_line(exc),
                        exc_info=not isinstance(exc, DatabaseError),
                        extra={"action": "heartbeat", "worker_id": self.worker_id},
                    )
                    close_connection(self.alias)
                else:
                    retry.succeeded()
        finally:
            close_connection(self.alias)

    def beat(self) -> None:
        """Extend the leases of held jobs, fenced on (owner, attempt), except those
        whose task ran past its timeout; mark leases found lost."""
        presence.touch(self.state)  # the workers table: last seen now
        now = time.monotonic()
        default_timeout = settings.JOB_TIMEOUT_SECONDS
        held: list[Job] = []
        timed_out: list[tuple[Job, float]] = []
        with self.state.lock:
            for h in self.state.held.values():
                limit = h.timeout if h.timeout is not None else default_timeout
                if h.lost or h.timed_out:
                    continue
                # A job waiting for its batched completion has finished running: its
                # lease is extended until the completer writes it, whatever its timeout.
                if (
                    limit is not None
                    and h.started is not None
                    and not h.completing
                    and now - h.started >= limit
                ):
                    h.timed_out = True
                    timed_out.append((h.job, limit))
                    continue
                held.append(h.job)
        for job, limit in timed_out:
            logger.warning(
                "job %s: still running after its %ss timeout; no longer extending its "
                "lease (the sweeper will hand it to another worker; whatever this run "
                "returns counts as a timed-out attempt, or is fenced out)",
                job.id,
                limit,
                extra={"action": "timeout", "job_id": job.id, "worker_id": self.worker_id},
            )
        if not held:
            self.ok_at = now
            return
        # A lease extension blocked on a lock must fail well before the lease runs out.
        with bounded(self.alias, "heartbeat", self.worker_id, max(0.5, self.lease_seconds / 3)):
            owned = self.state.jobs.extend_leases(
                self.worker_id, held, lease_seconds=self.lease_seconds
            )
        self.ok_at = now
        for job in held:
            if job.id in owned.cancel_requested:
                # Usually told already by the listener (a NOTIFY from cancel()); this
                # is the fallback when that never came (no LISTEN connection).
                self.request_cancel(job.id, job)
            if job.id not in owned:
                with self.state.lock:
                    entry = self.state.entry(job)
                    # Gone, replaced by a newer claim, or being recorded since the
                    # snapshot: the job finished (its row left 'running' for that
                    # reason), and the write that recorded it reports a real loss.
                    if entry is None or entry.finishing:
                        continue
                    entry.lost = True
                logger.warning(
                    "job %s: lease lost (expired and taken back)",
                    job.id,
                    extra={
                        "action": "lease_lost",
                        "job_id": job.id,
                        "worker_id": self.worker_id,
                    },
                )
