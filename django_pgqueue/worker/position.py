"""Where a worker's next claim starts in the claim index.

A claim of all queues normally starts at the head of ``pgqueue_job_claim_idx``. Every
job claimed leaves a dead entry there, which is normally skipped at once (an index scan
marks it dead once no transaction can see the old row). But while a long transaction
elsewhere pins the xmin horizon (a forgotten ``BEGIN`` in a shell, a long report, a
replica's ``hot_standby_feedback``), nothing can be cleaned up: each claim from the head
steps over every job claimed since, and the drain slows down without bound (see
``bench.scale``'s pinned-horizon scenario in bench/README.md).

So a worker resumes each claim after its previous one (``sql.JOB_CLAIM_AFTER``), and
claims from the head only every ``PGQUEUE_CLAIM_RESCAN_SECONDS`` (and, with
``--burst``, before it exits for lack of work). Not after every claim that comes back
short: a queue drained in bursts would then pay a walk over all those entries per
burst. What the head claim catches that a resumed one misses: jobs of the same
priority behind the position (a retry or a released job keeps its id; a job committed
late by a long transaction has an older id). They wait at most one rescan interval
longer than they would have; except a workflow's dependant released by its parents'
finishing, whose notification makes the next claim start at the head (listener.py).

A worker of some queues only (``--queue``) keeps a position per queue and resumes each
queue's part of its claim there in the same way (``sql.JOB_CLAIM_QUEUES_AFTER``); a
queue it has claimed nothing from yet starts at its head.

Under limits, a worker of every queue keeps another position for its claims from the
head of the line (``sql._HEAD_EVERYONE_LOCKED``): the first job its last one read and
did not lease (a key at its limit, say), so it never moves past a job limits kept back,
and never steps over the jobs claimed before it; rescanned on the same schedule.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from ..models import Job

#: Where a claim resumes: the ``(priority, id)`` of the last job of the previous claim
#: of all queues, or by queue name for a worker of some queues.
Position = tuple[int, int] | dict[str, tuple[int, int]]


class ClaimPosition:
    """Where the next claim resumes (None: the head); ``by_queue`` for a worker of some
    queues, which keeps one position per queue."""

    def __init__(self, rescan_seconds: float, *, by_queue: bool = False) -> None:
        self.rescan_seconds = rescan_seconds
        self.by_queue = by_queue
        self._after: tuple[int, int] | None = None
        self._queues: dict[str, tuple[int, int]] = {}
        self._head_at = float("-inf")  # time.monotonic() of the last claim from the head

    def start(self) -> Position | None:
        """Where the next claim starts: None (the head) when a rescan is due."""
        if time.monotonic() - self._head_at >= self.rescan_seconds:
            return None
        if self.by_queue:
            return dict(self._queues) if self._queues else None
        return self._after

    def claimed(self, after: Position | None, jobs: Sequence[Job]) -> None:
        """Record a claim that started at ``after`` and returned ``jobs`` (in claim
        order): the next one resumes after the last of them (of each queue). A claim
        that found nothing leaves the position where it was: jobs enqueued later come
        after it anyway."""
        if after is None:
            self._head_at = time.monotonic()
        if not jobs:
            return
        if self.by_queue:
            for job in jobs:  # in claim order: each queue's last one stays
                self._queues[job.queue] = (job.priority, job.id)
        else:
            last = jobs[-1]
            self._after = (last.priority, last.id)

    def resumed(self, after: Position | None, start: tuple[int, int] | None) -> None:
        """Record a claim from the head of the line under flow control that started at
        ``after`` and says its successor may start at ``start`` (``FlowClaim.resume``:
        the first job it read and did not lease, included; None: where it started)."""
        if after is None:
            self._head_at = time.monotonic()
        if start is not None:
            self._after = start

    def rescan(self) -> None:
        """Make the next claim start at the head (a worker about to exit for lack of
        work looks there first)."""
        self._head_at = float("-inf")
