"""The sweeper: its maintenance passes, and the loop that runs them.

Each pass rescues expired leases (to pending, dead on the last attempt, or cancelled),
resolves workflow edges their parent's finishing missed (see ``workflows.py``),
promotes due scheduled jobs, prunes old finished jobs and lost workers' rows, then
enqueues the due ticks of periodic entries (see ``periodic.py``). Every pass works in
bounded batches; several sweepers may run at once: every statement uses SKIP LOCKED,
and each tick is enqueued once.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import threading
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError, close_old_connections, transaction

from . import db, enqueue, periodic, workflows
from .conf import settings
from .databases import backend_database, default_database
from .exceptions import NotMigrated, first_line
from .reconnect import Retry, close_connection
from .sql import sweep as sql
from .states import Status

logger = logging.getLogger(__name__)

#: Upper bound on batches in one sweep pass, so a pass always ends even under churn.
MAX_SWEEP_BATCHES = 100


@dataclasses.dataclass(frozen=True)
class SweepResult:
    """What one sweep pass changed."""

    recovered: int = 0  # expired leases returned to pending
    dead: int = 0  # expired leases on their last attempt, dead-lettered
    promoted: int = 0  # due scheduled jobs made pending
    pruned: int = 0  # finished jobs past retention deleted
    periodic: int = 0  # ticks of periodic entries enqueued (see periodic.py)
    cancelled: int = 0  # expired leases of jobs whose cancellation was requested
    lost_workers: int = 0  # rows of workers lost for longer than LOST_WORKER_SECONDS
    keys: int = 0  # keys of closed unique_for windows and started debounced jobs
    rate_windows: int = 0  # rate windows with no start left in them (flow control)
    repaired: int = 0  # workflow edges their parent's finishing did not see (workflows.py)

    def __bool__(self) -> bool:
        return any(dataclasses.astuple(self))


def in_batches(run: Callable[[], int], batch_size: int) -> int:
    """Run ``run`` (one bounded statement, returning how many rows it took) again while
    it fills its batch of ``batch_size``, at most ``MAX_SWEEP_BATCHES`` times, so a pass
    always ends even under churn; the total. The one loop of every bounded pass."""
    total = 0
    for _ in range(MAX_SWEEP_BATCHES):
        count = run()
        total += count
        if count < batch_size:
            break
    return total


def rescue_expired(using: str, *, now: dt.datetime | None = None) -> tuple[int, int, int]:
    """Return expired leases to pending (or dead on the last attempt, or cancelled if
    their cancellation was requested). Returns (recovered, dead, cancelled)."""
    counts = {Status.PENDING: 0, Status.DEAD: 0, Status.CANCELLED: 0}
    params: dict[str, Any] = {
        "now": now,
        "batch_size": int(settings.SWEEP_BATCH_SIZE),
        "keep_errors": settings.KEEP_ERRORS,
        "channel": settings.NOTIFY_CHANNEL,
    }

    def batch() -> int:
        rows = db.rows(using, sql.JOB_RESCUE_EXPIRED, params)
        for _, status in rows:
            counts[status] += 1
        return len(rows)

    in_batches(batch, params["batch_size"])
    return counts[Status.PENDING], counts[Status.DEAD], counts[Status.CANCELLED]


def promote_due(
    using: str, *, now: dt.datetime | None = None, batch_size: int | None = None
) -> int:
    """Make due scheduled jobs pending and wake workers for their queues (at commit).
    ``batch_size``: one batch of that size only (an idle worker's share)."""
    size = batch_size or int(settings.SWEEP_BATCH_SIZE)

    def batch() -> int:
        with transaction.atomic(using=using):
            rows = db.rows(using, sql.JOB_PROMOTE_DUE, {"now": now, "batch_size": size})
            if rows:
                enqueue.notify_queues(using, {row[0] for row in rows})
        return len(rows)

    if batch_size is not None:
        return batch()
    return in_batches(batch, size)


def retention() -> dict[str, float]:
    """Each final state's retention in seconds, as the settings say; a state kept until
    an operator acts (dead letters by default) is absent."""
    kept = {
        Status.DONE: settings.RETENTION_SECONDS,
        Status.CANCELLED: settings.CANCELLED_RETENTION_SECONDS,
        Status.DEAD: settings.DEAD_RETENTION_SECONDS,
    }
    return {str(status): float(seconds) for status, seconds in kept.items() if seconds is not None}


def prune_finished(using: str, *, now: dt.datetime | None = None) -> int:
    """Delete finished jobs past their state's retention (``PGQUEUE_RETENTION_SECONDS``
    for done, ``PGQUEUE_CANCELLED_RETENTION_SECONDS``, ``PGQUEUE_DEAD_RETENTION_SECONDS``)."""
    batch_size = int(settings.SWEEP_BATCH_SIZE)
    pruned = 0
    for status, seconds in retention().items():
        params: dict[str, Any] = {
            "now": now,
            "status": status,
            "batch_size": batch_size,
            "retention_seconds": seconds,
        }

        deleted: list[int] = []

        def batch(p: dict[str, Any] = params, deleted: list[int] = deleted) -> int:
            locked, count = _prune_batch(using, p)
            deleted.append(count)
            return locked

        in_batches(batch, batch_size)
        pruned += sum(deleted)
    return pruned


def _prune_batch(using: str, params: dict[str, Any]) -> tuple[int, int]:
    """Lock one batch of finished jobs past retention, then delete them in a second
    statement whose later snapshot sees every edge committed before the locks (a
    dependant enqueued as its parent finished): such a parent is kept for the repair.
    (How many were locked, how many deleted.)"""
    with transaction.atomic(using=using):
        ids = [row[0] for row in db.rows(using, sql.JOB_LOCK_FINISHED_BEFORE, params)]
        if not ids:
            return 0, 0
        deleted = db.row(using, sql.JOB_DELETE_FINISHED_LOCKED, {"ids": ids})[0]
    return len(ids), int(deleted)


def prune_lost_workers(using: str, *, now: dt.datetime | None = None) -> int:
    """Delete the rows of workers not seen for longer than their lease plus
    ``PGQUEUE_LOST_WORKER_SECONDS``."""
    batch_size = int(settings.SWEEP_BATCH_SIZE)
    params: dict[str, Any] = {
        "now": now,
        "batch_size": batch_size,
        "keep_seconds": float(settings.LOST_WORKER_SECONDS),
    }
    return in_batches(lambda: len(db.rows(using, sql.WORKER_DELETE_LOST, params)), batch_size)


def prune_rate_windows(using: str, *, now: dt.datetime | None = None) -> int:
    """Delete the rate windows of flow control whose every start has left the window
    (a budget that starts again gets a new one)."""
    batch_size = int(settings.SWEEP_BATCH_SIZE)
    params: dict[str, Any] = {"now": now, "batch_size": batch_size}
    return in_batches(lambda: len(db.rows(using, sql.RATE_DELETE_CLOSED, params)), batch_size)


def prune_expired_keys(using: str, *, now: dt.datetime | None = None) -> int:
    """Delete keys whose ``unique_for`` window closed, and ``debounce`` keys whose job
    started (see ``enqueue.py``)."""
    batch_size = int(settings.SWEEP_BATCH_SIZE)
    params: dict[str, Any] = {"now": now, "batch_size": batch_size}
    return in_batches(lambda: db.rowcount(using, sql.JOB_DELETE_EXPIRED_KEYS, params), batch_size)


def resolve_missed(using: str, *, now: dt.datetime | None = None) -> int:
    """The workflows' repair: edges whose parent's finishing did not see them
    (``workflows.resolve_missed``); how many edges were resolved."""
    return workflows.resolve_missed(using, now=now, max_batches=MAX_SWEEP_BATCHES)


def sweep(*, using: str | None = None, now: dt.datetime | None = None) -> SweepResult:
    """One bounded maintenance pass over the jobs database ``using`` (None: the default
    backend's), periodic entries aside; safe to run from several processes at once."""
    alias = using or default_database()
    recovered, dead, cancelled = rescue_expired(alias, now=now)
    # Before pruning: the parent of a missed edge is kept until it is resolved.
    repaired = resolve_missed(alias, now=now)
    return SweepResult(
        repaired=repaired,
        recovered=recovered,
        dead=dead,
        cancelled=cancelled,
        promoted=promote_due(alias, now=now),
        pruned=prune_finished(alias, now=now),
        lost_workers=prune_lost_workers(alias, now=now),
        keys=prune_expired_keys(alias, now=now),
        rate_windows=prune_rate_windows(alias, now=now),
    )


class Sweeper:
    """Sweeps every ``interval`` seconds the jobs database of ``TASKS[backend]`` (None:
    the default alias). ``now`` pins the clock of the periodic part of each pass (for
    testing schedules, like ``%(now)s`` in the SQL); with ``now_step`` each pass after
    the first moves the pinned clock that many seconds forward.

    The maintenance passes (recovery, promotion, pruning, lost workers) always use the
    database's clock: at a pinned time in the future they would delete finished jobs
    and live workers' rows, run scheduled jobs early and take back leases that are
    running (the job then runs twice) on a database where real workers run (issue 28).
    ``sweep(now=...)`` pins them too, for tests that need it."""

    def __init__(
        self,
        *,
        interval: float = 5.0,
        now: dt.datetime | None = None,
        now_step: float | None = None,
        backend: str | None = None,
    ) -> None:
        self.interval = interval
        self.alias = backend_database(backend)
        self.now = now
        self.now_step = now_step
        self._stop = threading.Event()
        # Invalid periodic entries already logged (name -> message): logged once each.
        self._reported: dict[str, str] = {}
        # A changed entry's tick this recent is still due: wider than two passes apart.
        self._grace = max(periodic.CHANGE_GRACE, dt.timedelta(seconds=2 * interval))

    def stop(self) -> None:
        self._stop.set()

    def run_once(self) -> SweepResult:
        """One pass; logs at info level only when something changed."""
        result = sweep(using=self.alias)  # the database's clock: see the class

        # Each sweeper enqueues the PGQUEUE_PERIODIC entries whose backend's jobs live
        # in its database (an entry's "backend", default "default").
        ticks = periodic.enqueue_due(
            using=self.alias, now=self.now, reported=self._reported, grace=self._grace
        )
        result = dataclasses.replace(result, periodic=len(ticks))
        if result:
            logger.info(
                "sweep: recovered=%d dead=%d promoted=%d pruned=%d periodic=%d cancelled=%d"
                " lost_workers=%d repaired=%d",
                result.recovered,
                result.dead,
                result.promoted,
                result.pruned,
                result.periodic,
                result.cancelled,
                result.lost_workers,
                result.repaired,
                extra={"action": "sweep"},
            )
        if self.now is not None and self.now_step:
            self.now += dt.timedelta(seconds=self.now_step)
        return result

    def run_forever(self) -> None:
        """Sweep every ``interval`` seconds until stopped; database errors are logged
        and retried with backoff, except ``NotMigrated``, which is raised."""
        retry = Retry(self.alias, stop=self._stop)
        while not self._stop.is_set():
            close_old_connections()
            try:
                self.run_once()
                retry.succeeded()
            except DatabaseError as exc:
                if isinstance(exc, NotMigrated):
                    raise  # no retry cures a missing table
                delay = retry.failed()
                logger.warning(
                    "sweep failed (%s); retrying in %.1fs",
                    first_line(exc),
                    delay,
                    extra={"action": "db_error"},
                )
                close_connection(self.alias)
            if retry.failures:
                retry.wait()
            else:
                self._stop.wait(self.interval)
