"""The read model of the queue's health: what ``pgqueue_status``, the admin dashboard,
the summary above the admin's job list, its filters and the Prometheus metrics show,
from one set of bounded queries.

Every figure comes from an index walked under a ``LIMIT``, from the small workers
table, or from planner statistics: none of them reads the whole jobs table, so a
status probe or a scrape costs the same on ten million rows as on ten thousand. Where
an exact count would need a scan, the figure is an estimate, and the result says so
(``estimated``).
"""

from __future__ import annotations

import datetime as dt
import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from . import db, flow
from .databases import default_database
from .models import FINISHED_STATUSES, LIVE_STATUSES, Job
from .sql import read as sql
from .states import Status

#: Most workers listed (the workers table holds one row per process).
MAX_WORKERS = 1000

#: Rows each status's sample reads at most; above it, counts are planner estimates.
DEFAULT_CAP = 10_000
#: Most running jobs a snapshot lists with their progress.
RUNNING_LIMIT = 100

#: Most keys of prefix limits listed for their rate windows alone (keys that run are
#: listed anyway: as many as the fleet runs).
RATE_SUBJECTS = 100

#: The window of the "done" and "failed" figures, in seconds.
RECENT_SECONDS = 300

#: Statuses counted per queue.
COUNTED = (*LIVE_STATUSES, Status.DEAD)


def _rows(using: str | None, query: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    return db.rows(using or default_database(), query, params)


@dataclass(frozen=True)
class WorkerInfo:
    """One row of the workers table, with its state judged by the database clock."""

    id: str
    hostname: str
    pid: int
    queues: list[str] | None  # None: every queue
    concurrency: int
    lease_seconds: float
    version: str
    started_at: dt.datetime
    last_seen_at: dt.datetime
    jobs_held: int
    jobs_done: int
    jobs_failed: int
    rss_bytes: int | None  # resident memory at its last heartbeat (None: not measured)
    restarts: int  # processes replaced in its place (time limit, --max-memory)
    lost: bool  # not seen for longer than its lease: killed, hung or cut off
    unseen_for: dt.timedelta

    @property
    def state(self) -> str:
        return "lost" if self.lost else "live"

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "hostname": self.hostname,
            "pid": self.pid,
            "queues": self.queues,
            "concurrency": self.concurrency,
            "version": self.version,
            "started_at": self.started_at.isoformat(),
            "last_seen_at": self.last_seen_at.isoformat(),
            "last_seen_seconds_ago": round(self.unseen_for.total_seconds(), 3),
            "jobs_held": self.jobs_held,
            "jobs_done": self.jobs_done,
            "jobs_failed": self.jobs_failed,
            "rss_bytes": self.rss_bytes,
            "restarts": self.restarts,
            "state": self.state,
        }


def workers(*, using: str | None = None, now: dt.datetime | None = None) -> list[WorkerInfo]:
    """Registered workers, live and lost, ordered by host and id."""
    return [
        WorkerInfo(*row)
        for row in _rows(using, sql.WORKER_GET_ALL, {"now": now, "limit": MAX_WORKERS})
    ]


@dataclass(frozen=True)
class QueueStats:
    """One queue's figures. A name in ``estimated`` marks a figure scaled up from a
    capped sample (by planner statistics, or by the sample's rate); the oldest pending
    age is then a lower bound."""

    queue: str
    pending: int = 0
    scheduled: int = 0
    running: int = 0
    dead: int = 0
    waiting: int = 0  # waiting for the jobs they depend on (workflows)
    done_5m: int = 0  # done in the last RECENT_SECONDS
    failed_5m: int = 0  # dead-lettered (attempts used up) in the last RECENT_SECONDS
    cancelled_5m: int = 0  # cancelled (Job.objects.cancel) in the last RECENT_SECONDS
    finished_per_second: float = 0.0  # done per second over the last minute
    oldest_pending_age: float | None = None  # seconds; None: nothing pending
    estimated: frozenset[str] = frozenset()
    paused: bool = False  # Job.objects.pause_queue(): no worker claims from it

    def as_json(self) -> dict[str, Any]:
        return {
            "pending": self.pending,
            "scheduled": self.scheduled,
            "running": self.running,
            "dead": self.dead,
            "waiting": self.waiting,
            "done_5m": self.done_5m,
            "failed_5m": self.failed_5m,
            "cancelled_5m": self.cancelled_5m,
            "finished_per_second": round(self.finished_per_second, 3),
            "oldest_pending_age_seconds": None
            if self.oldest_pending_age is None
            else round(self.oldest_pending_age, 3),
            "estimated": sorted(self.estimated),
            "paused": self.paused,
        }


@dataclass(frozen=True)
class BudgetStats:
    """One budget of a limit in force: a key's (``kind`` "key": an exact key, or one
    key of a ``prefix*`` limit) or a queue's (``kind`` "queue"). ``pending`` counts at
    most the sampling cap per priority level (``capped``: it reached it); ``waiting``
    is the pending that the limit holds back now (the budget is full)."""

    kind: str
    limit: str
    subject: str
    concurrency: int | None
    running: int
    rate: tuple[int, float] | None
    started: int  # starts in the rate window now
    pending: int
    capped: bool = False

    @property
    def full(self) -> bool:
        """No job of this budget may start now."""
        return (self.concurrency is not None and self.running >= self.concurrency) or (
            self.rate is not None and self.started >= self.rate[0]
        )

    @property
    def waiting(self) -> int:
        return self.pending if self.full else 0

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "limit": self.limit,
            "key" if self.kind == "key" else "queue": self.subject,
            "concurrency": self.concurrency,
            "running": self.running,
            "rate": None if self.rate is None else flow.format_rate(self.rate),
            "started_in_window": self.started,
            "pending": self.pending,
            "pending_capped": self.capped,
            "waiting": self.waiting,
        }


def budgets(
    view: flow.FlowView, *, using: str | None = None, cap: int = DEFAULT_CAP
) -> list[BudgetStats]:
    """The budgets of ``view``'s limits with what they run, start and hold back (see
    ``sql.FLOW_GET_BUDGETS``: bounded queries only)."""
    if not view.limits:
        return []
    rows = _rows(
        using,
        sql.FLOW_GET_BUDGETS,
        {**view.params, "cap": cap, "subjects": RATE_SUBJECTS, "now": None},
    )
    return [
        BudgetStats(
            kind=kind,
            limit=name,
            subject=subject,
            concurrency=concurrency,
            running=running_,
            rate=None if rate is None else (rate, period),
            started=started,
            pending=pending,
            capped=pending >= cap,
        )
        for kind, name, subject, concurrency, running_, rate, period, started, pending in rows
    ]


@dataclass(frozen=True)
class Snapshot:
    """Every queue's figures and the registered workers, at one database time."""

    taken_at: dt.datetime
    queues: dict[str, QueueStats]
    workers: list[WorkerInfo]
    cap: int
    #: Up to RUNNING_LIMIT running jobs with their progress (``set_progress``).
    running: list[dict[str, Any]] = field(default_factory=list)
    #: The budgets of the limits in force (flow control), and the fair queues.
    budgets: list[BudgetStats] = field(default_factory=list)
    fair: frozenset[str] = frozenset()

    @property
    def live_workers(self) -> list[WorkerInfo]:
        return [w for w in self.workers if not w.lost]

    def total(self, name: str) -> int:
        return sum(getattr(q, name) for q in self.queues.values())

    def as_json(self) -> dict[str, Any]:
        return {
            "taken_at": self.taken_at.isoformat(),
            "queues": {name: q.as_json() for name, q in sorted(self.queues.items())},
            "workers": [w.as_json() for w in self.workers],
            "running": self.running,
            "limits": [b.as_json() for b in self.budgets],
            "fair_queues": sorted(self.fair),
        }


def _status_estimates(using: str | None) -> dict[str, int]:
    """Rows per status from planner statistics (no scan): reltuples x frequency."""
    stats = column_stats(using or default_database(), "status")
    if stats.total < 0:
        return {}
    return {status: round(stats.total * share) for status, share in stats.freqs.items()}


def snapshot(
    *, using: str | None = None, cap: int = DEFAULT_CAP, now: dt.datetime | None = None
) -> Snapshot:
    """Per-queue figures and workers from bounded queries (see the module docstring)."""
    counts: dict[str, dict[str, int]] = defaultdict(dict)  # queue -> status -> jobs
    sampled: dict[str, int] = defaultdict(int)  # status -> rows in its sample
    oldest: dict[str, dt.datetime] = {}
    for status, queue, jobs, oldest_run_at in _rows(
        using, sql.JOB_COUNT_SAMPLE_BY_QUEUE, {"cap": cap}
    ):
        counts[queue][status] = jobs
        sampled[status] += jobs
        if oldest_run_at is not None:
            oldest[queue] = oldest_run_at
    for queue, run_at in _rows(using, sql.JOB_GET_PENDING_HEADS, {}):
        if queue not in oldest or run_at < oldest[queue]:
            oldest[queue] = run_at
    # A capped status: scale each queue's share of the sample up to the estimate.
    scale: dict[str, float] = {}
    capped = [status for status in COUNTED if sampled[status] >= cap]
    if capped:
        estimates = _status_estimates(using)
        for status in capped:
            scale[status] = max(estimates.get(status, 0), cap) / sampled[status]

    finished: dict[str, dict[str, tuple[int, int]]] = defaultdict(dict)
    sample_size = {"done": 0, "dead": 0, "cancelled": 0}
    sample_oldest: dict[str, dt.datetime] = {}
    clock = now
    for outcome, queue, jobs, last_minute, first_at, at in _rows(
        using,
        sql.JOB_SAMPLE_FINISHED,
        {"cap": cap, "window_seconds": RECENT_SECONDS, "now": now},
    ):
        clock = at
        finished[queue][outcome] = (jobs, last_minute)
        sample_size[outcome] += jobs
        if outcome not in sample_oldest or first_at < sample_oldest[outcome]:
            sample_oldest[outcome] = first_at
    workers_ = workers(using=using, now=now)
    if clock is None:
        clock = _database_now(using)
    # A capped recent sample covers less than the window: scale it by its rate.
    rate_scale: dict[str, tuple[float, float]] = {}
    for outcome, size in sample_size.items():
        if size >= cap and outcome in sample_oldest:
            span = max((clock - sample_oldest[outcome]).total_seconds(), 1e-3)
            rate_scale[outcome] = (
                max(1.0, RECENT_SECONDS / span),
                max(1.0, 60.0 / span) if span < 60 else 1.0,
            )

    view = flow.load(using or default_database())
    names = set(counts) | set(finished) | set(oldest) | set(view.paused)
    for worker in workers_:
        if not worker.lost and worker.queues:
            names.update(worker.queues)
    queues: dict[str, QueueStats] = {}
    for name in sorted(names):
        estimated: set[str] = set()
        figures: dict[str, int] = {}
        for status in COUNTED:
            jobs = counts[name].get(status, 0)
            if status in scale:
                jobs = round(jobs * scale[status])
                estimated.add(status)
            figures[status] = jobs
        done, done_minute = finished[name].get("done", (0, 0))
        dead, _ = finished[name].get("dead", (0, 0))
        cancelled, _ = finished[name].get("cancelled", (0, 0))
        if "done" in rate_scale:
            window_factor, minute_factor = rate_scale["done"]
            done, done_minute = round(done * window_factor), round(done_minute * minute_factor)
            estimated.update(("done_5m", "finished_per_second"))
        if "dead" in rate_scale:
            dead = round(dead * rate_scale["dead"][0])
            estimated.add("failed_5m")
        if "cancelled" in rate_scale:
            cancelled = round(cancelled * rate_scale["cancelled"][0])
            estimated.add("cancelled_5m")
        age = None
        if name in oldest:
            age = max(0.0, (clock - oldest[name]).total_seconds())
            if "pending" in scale:
                estimated.add("oldest_pending_age")
        queues[name] = QueueStats(
            queue=name,
            done_5m=done,
            failed_5m=dead,
            cancelled_5m=cancelled,
            finished_per_second=done_minute / 60.0,
            oldest_pending_age=age,
            estimated=frozenset(estimated),
            paused=name in view.paused,
            **figures,
        )
    return Snapshot(
        taken_at=clock,
        queues=queues,
        workers=workers_,
        cap=cap,
        running=running(using),
        budgets=budgets(view, using=using, cap=cap),
        fair=view.fair,
    )


def running(using: str | None, limit: int | None = None) -> list[dict[str, Any]]:
    """Running jobs (at most ``limit``, default RUNNING_LIMIT) with what they last said
    of their progress, as JSON-ready dicts, the lease expiring soonest first."""
    rows = _rows(using, sql.JOB_GET_RUNNING, {"limit": limit or RUNNING_LIMIT})
    return [
        {
            "id": job_id,
            "queue": queue,
            "task": task,
            "worker_id": worker,
            "attempt": attempt,
            "claimed_at": None if claimed is None else claimed.isoformat(),
            "progress": None if progress is None else json.loads(progress),
        }
        for job_id, queue, task, worker, attempt, claimed, progress in rows
    ]


def _database_now(using: str | None) -> dt.datetime:
    return db.clock(using or default_database())


@dataclass(frozen=True)
class Minute:
    """One minute of the dashboard's history."""

    start: dt.datetime
    finished: int  # done jobs that finished in this minute
    failed: int  # jobs dead-lettered in this minute
    wait_avg: float | None  # seconds those jobs waited before their last attempt
    wait_max: float | None
    estimated: bool = False  # ``finished`` scaled up from a capped sample


@dataclass(frozen=True)
class History:
    minutes: list[Minute] = field(default_factory=list)
    cap: int = 0


def history(
    *,
    minutes: int = 60,
    cap: int = 2000,
    using: str | None = None,
    now: dt.datetime | None = None,
) -> History:
    """Finished and failed jobs per minute, and their wait, over the last ``minutes``
    (the last one still running). At most ``minutes`` x ``cap`` index entries are read:
    a busier minute is scaled up by the rate of its first ``cap`` jobs (estimated)."""
    rows = _rows(using, sql.JOB_GET_HISTORY, {"minutes": minutes, "cap": cap, "now": now})
    out = []
    for start, jobs, first_at, last_at, wait_avg, wait_max, dead in rows:
        estimated = False
        if jobs >= cap and first_at is not None and last_at is not None:
            span = max((last_at - start).total_seconds(), 1e-3)
            jobs = max(jobs, round(jobs * 60.0 / span))
            estimated = True
        out.append(
            Minute(
                start=start,
                finished=jobs,
                failed=dead,
                wait_avg=wait_avg,
                wait_max=wait_max,
                estimated=estimated,
            )
        )
    return History(minutes=out, cap=cap)


# --- the admin's job list: summary above it, choices of its filters --------------------

#: Below this size (and with no statistics yet) the summary counts exactly.
SMALL_TABLE_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class QueueSummary:
    """What the admin shows above the job list, from bounded or estimated queries only."""

    live: dict[tuple[str, str], int]  # (status, queue) -> jobs, for live statuses
    totals: dict[str, int | None]  # status -> jobs (None: unknown without a full scan)
    estimated: frozenset[str]  # statuses whose total is a planner estimate
    capped: frozenset[str]  # live statuses that reached the cap: "at least"
    oldest_pending_wait: dt.timedelta | None  # longest wait at the head of a line
    expired_leases: int  # running jobs whose lease expired (capped too)
    cap: int

    @property
    def queues(self) -> list[str]:
        return sorted({queue for _, queue in self.live})


@dataclass(frozen=True)
class ColumnStats:
    """Planner statistics about one column (see ``sql.JOB_GET_COLUMN_STATS``)."""

    total: int  # estimated rows in the table; -1 if never analyzed
    bytes: int  # size of the table's heap
    freqs: dict[str, float]  # most common values -> share of rows

    def small(self, rows: int) -> bool:
        """True if an exact answer is cheap: at most ``rows`` rows, or never analyzed
        and under ``SMALL_TABLE_BYTES``."""
        return 0 <= self.total <= rows or (self.total < 0 and self.bytes <= SMALL_TABLE_BYTES)


def queue_summary(
    using: str, *, cap: int = 10_000, now: dt.datetime | None = None
) -> QueueSummary:
    """Counts per status and queue, the longest wait, and expired leases, for the
    admin. Never scans the table: live counts walk partial indexes under a LIMIT
    of ``cap``; done/dead totals are planner estimates unless the table is small."""
    live: dict[tuple[str, str], int] = {}
    for status, queue, jobs in _rows(using, sql.JOB_COUNT_LIVE_BY_QUEUE, {"cap": cap}):
        live[(status, queue)] = jobs
    totals: dict[str, int | None] = {}
    for status in LIVE_STATUSES:
        totals[status] = sum(n for (s, _), n in live.items() if s == status)
    capped = frozenset(s for s, n in totals.items() if n is not None and n >= cap)

    finished, estimated = _finished_totals(using, cap)
    totals.update(finished)

    ((wait, expired),) = _rows(using, sql.JOB_GET_HEALTH, {"cap": cap, "now": now})
    return QueueSummary(
        live=live,
        totals=totals,
        estimated=estimated,
        capped=capped,
        oldest_pending_wait=wait,
        expired_leases=expired,
        cap=cap,
    )


def _finished_totals(using: str, cap: int) -> tuple[dict[str, int | None], frozenset[str]]:
    """done/dead totals: exact on a small table, else from planner statistics."""
    stats = column_stats(using, "status")
    if stats.small(cap):
        # Small table: exact, and still bounded in case the statistics are stale.
        jobs = Job.objects.db_manager(using).order_by()
        return {s: jobs.filter(status=s)[: cap + 1].count() for s in FINISHED_STATUSES}, (
            frozenset()
        )
    if stats.total < 0 or not stats.freqs:
        return dict.fromkeys(FINISHED_STATUSES), frozenset()
    return (
        {s: round(stats.total * stats.freqs.get(s, 0.0)) for s in FINISHED_STATUSES},
        frozenset(FINISHED_STATUSES),
    )


def column_stats(using: str, column: str) -> ColumnStats:
    """The planner's statistics about one column of the jobs table (no scan)."""
    ((total, size, vals, freqs),) = _rows(using, sql.JOB_GET_COLUMN_STATS, {"column": column})
    pairs = zip(vals or (), freqs or (), strict=True)
    return ColumnStats(total=total, bytes=size, freqs=dict(pairs))


def common_values(using: str, column: str, *, limit: int = 100) -> list[str]:
    """Values of ``queue`` or ``task`` for the admin's filters: exact (DISTINCT) on a
    small table, the planner's most common values on a big one (no scan; rare values
    may be missing there, and the admin search still finds them)."""
    if column not in ("queue", "task"):
        raise ValueError(f"no common values for column {column!r}")
    stats = column_stats(using, column)
    if stats.small(limit * 100):
        return list(
            Job.objects.db_manager(using)
            .order_by(column)
            .values_list(column, flat=True)
            .distinct()[:limit]
        )
    return sorted(stats.freqs)[:limit]
