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
#: Statuses counted from one sample shared by every queue (pending is counted per queue).
SAMPLED = tuple(status for status in COUNTED if status != Status.PENDING)

#: Most queues whose backlog is read one by one (each up to the cap).
MAX_QUEUES = 1000


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
    """One queue's figures. A name in ``estimated`` marks a figure that is not an exact
    count: scaled up from a capped sample (by planner statistics), or, when it is in
    ``lower_bound`` too, a count that stopped at the cap ("at least"). ``pending`` and
    ``oldest_pending_age`` are read per queue: exact, or ``pending`` a lower bound."""

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
    lower_bound: frozenset[str] = frozenset()  # figures that are "at least" this

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
            "lower_bound": sorted(self.lower_bound),
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
    live = _live_counts(using, cap)
    recent = _recent(using, cap, now)
    workers_ = workers(using=using, now=now)
    clock = recent.clock or _database_now(using)
    view = flow.load(using or default_database())
    names = set(live.counts) | set(recent.jobs) | set(live.oldest) | set(view.paused)
    for worker in workers_:
        if not worker.lost and worker.queues:
            names.update(worker.queues)
    queues: dict[str, QueueStats] = {}
    for name in sorted(names):
        estimated: set[str] = set()
        lower_bound = set(recent.lower_bound)
        if name in live.capped:
            lower_bound.add("pending")
        figures: dict[str, int] = {}
        for status in COUNTED:
            jobs = live.counts[name].get(status, 0)
            if status in live.scale:
                jobs = round(jobs * live.scale[status])
                estimated.add(status)
            figures[status] = jobs
        done, done_minute = recent.jobs[name].get("done", (0, 0))
        age = None
        if name in live.oldest:
            age = max(0.0, (clock - live.oldest[name]).total_seconds())
        queues[name] = QueueStats(
            queue=name,
            done_5m=done,
            failed_5m=recent.jobs[name].get("dead", (0, 0))[0],
            cancelled_5m=recent.jobs[name].get("cancelled", (0, 0))[0],
            finished_per_second=done_minute / 60.0,
            oldest_pending_age=age,
            estimated=frozenset(estimated | lower_bound),
            lower_bound=frozenset(lower_bound),
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


@dataclass
class _LiveCounts:
    counts: dict[str, dict[str, int]]  # queue -> status -> jobs
    oldest: dict[str, dt.datetime]  # queue -> run_at of its oldest pending job
    capped: set[str]  # queues whose pending count stopped at the cap
    scale: dict[str, float]  # status -> factor of its capped, shared sample


def _live_counts(using: str | None, cap: int) -> _LiveCounts:
    """Jobs per live status (and dead) and queue. Pending is counted queue by queue up
    to the cap (exact, or a lower bound), with each queue's oldest job, exact; the
    other statuses share one sample per status, scaled up to the planner's estimate
    when it is capped."""
    out = _LiveCounts(defaultdict(dict), {}, set(), {})
    sampled: dict[str, int] = defaultdict(int)  # status -> rows in its sample
    for status, queue, jobs in _rows(using, sql.JOB_COUNT_SAMPLE_BY_QUEUE, {"cap": cap}):
        out.counts[queue][status] = jobs
        sampled[status] += jobs
    for queue, run_at, jobs in _rows(
        using, sql.JOB_GET_QUEUE_BACKLOG, {"cap": cap, "queues": MAX_QUEUES}
    ):
        out.counts[queue][Status.PENDING] = jobs
        out.oldest[queue] = run_at
        if jobs >= cap:
            out.capped.add(queue)
    capped = [status for status in SAMPLED if sampled[status] >= cap]
    if capped:
        estimates = _status_estimates(using)
        for status in capped:
            out.scale[status] = max(estimates.get(status, 0), cap) / sampled[status]
    return out


@dataclass
class _Recent:
    jobs: dict[str, dict[str, tuple[int, int]]]  # queue -> outcome -> (window, minute)
    lower_bound: set[str]  # figures that stopped at the cap: "at least"
    clock: dt.datetime | None


def _recent(using: str | None, cap: int, now: dt.datetime | None) -> _Recent:
    """Jobs finished per outcome and queue in the last RECENT_SECONDS and (done) the
    last minute, counted from the newest ``cap`` of each outcome. Below the cap every
    figure is exact; at it, each queue's count is a lower bound (never scaled up by the
    sample's rate: a burst is not a steady rate), except the last minute's, exact
    while the sample reaches back past it."""
    out = _Recent(defaultdict(dict), set(), now)
    size = {"done": 0, "dead": 0, "cancelled": 0}
    reach: dict[str, dt.datetime] = {}  # outcome -> oldest finished_at in its sample
    for outcome, queue, jobs, last_minute, first_at, at in _rows(
        using,
        sql.JOB_SAMPLE_FINISHED,
        {"cap": cap, "window_seconds": RECENT_SECONDS, "now": now},
    ):
        out.clock = at
        out.jobs[queue][outcome] = (jobs, last_minute)
        size[outcome] += jobs
        if outcome not in reach or first_at < reach[outcome]:
            reach[outcome] = first_at
    for outcome, figure in (
        ("done", "done_5m"),
        ("dead", "failed_5m"),
        ("cancelled", "cancelled_5m"),
    ):
        if size[outcome] >= cap:
            out.lower_bound.add(figure)
    if (
        size["done"] >= cap
        and out.clock is not None
        and reach["done"] >= out.clock - dt.timedelta(seconds=60)
    ):
        out.lower_bound.add("finished_per_second")
    return out


def running(using: str | None, limit: int | None = None) -> list[dict[str, Any]]:
    """Running jobs (at most ``limit``, default RUNNING_LIMIT) with what they last said
    of their progress and how many durable steps they recorded (``steps``; the last,
    ``last_step``: kind, name and when, or None), as JSON-ready dicts, the lease
    expiring soonest first."""
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
            "steps": steps or 0,
            "last_step": None
            if kind is None
            else {"kind": kind, "name": name, "finished_at": finished_at.isoformat()},
        }
        for (
            job_id,
            queue,
            task,
            worker,
            attempt,
            claimed,
            progress,
            steps,
            kind,
            name,
            finished_at,
        ) in rows
    ]


def _database_now(using: str | None) -> dt.datetime:
    return db.clock(using or default_database())


@dataclass(frozen=True)
class Minute:
    """One minute of the dashboard's history."""

    start: dt.datetime
    finished: int  # done jobs that finished in this minute (at least, if lower_bound)
    failed: int  # jobs dead-lettered in this minute (at least, if failed_lower_bound)
    wait_avg: float | None  # seconds those jobs waited before their last attempt
    wait_max: float | None  # (of the first ``cap`` of them)
    estimated: bool = False  # ``finished`` is not exact (kept for callers: = lower_bound)
    lower_bound: bool = False  # ``finished`` stopped at its count cap
    failed_lower_bound: bool = False  # the dead-letter sample was capped


@dataclass(frozen=True)
class History:
    minutes: list[Minute] = field(default_factory=list)
    cap: int = 0
    count_cap: int = 0


#: Most done jobs counted in one minute of the history (an index range each).
HISTORY_COUNT_CAP = 10_000


def history(
    *,
    minutes: int = 60,
    cap: int = 2000,
    count_cap: int = HISTORY_COUNT_CAP,
    using: str | None = None,
    now: dt.datetime | None = None,
) -> History:
    """Finished and failed jobs per minute, and their wait, over the last ``minutes``
    (the last one still running). Each minute's done jobs are counted exactly up to
    ``count_cap`` (then a lower bound, ``lower_bound``: a busy minute is never scaled
    up from a sample as if its rate were steady); the wait is that of its first ``cap``
    jobs. At most ``minutes`` x (``count_cap`` + ``cap``) index entries are read."""
    rows = _rows(
        using,
        sql.JOB_GET_HISTORY,
        {"minutes": minutes, "cap": cap, "count_cap": count_cap, "now": now},
    )
    out = [
        Minute(
            start=start,
            finished=jobs,
            failed=dead,
            wait_avg=wait_avg,
            wait_max=wait_max,
            estimated=jobs >= count_cap,
            lower_bound=jobs >= count_cap,
            failed_lower_bound=dead_capped,
        )
        for start, jobs, wait_avg, wait_max, dead, dead_capped in rows
    ]
    return History(minutes=out, cap=cap, count_cap=count_cap)


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
    admin. Never scans the table: pending is counted queue by queue, the other live
    statuses and dead and cancelled jobs through their partial indexes, each under a
    LIMIT of ``cap`` (exact below it, "at least" at it); done is a planner estimate
    unless the table is small. The longest wait is exact."""
    live: dict[tuple[str, str], int] = {}
    for status, queue, jobs in _rows(using, sql.JOB_COUNT_LIVE_BY_QUEUE, {"cap": cap}):
        if status != Status.PENDING:
            live[(status, queue)] = jobs
    backlog_capped = False
    for queue, _, jobs in _rows(
        using, sql.JOB_GET_QUEUE_BACKLOG, {"cap": cap, "queues": MAX_QUEUES}
    ):
        live[(Status.PENDING, queue)] = jobs
        backlog_capped = backlog_capped or jobs >= cap
    totals: dict[str, int | None] = {}
    for status in LIVE_STATUSES:
        totals[status] = sum(n for (s, _), n in live.items() if s == status)
    capped = {s for s, n in totals.items() if n is not None and n >= cap}
    if backlog_capped:
        capped.add(Status.PENDING)

    finished, estimated = _finished_totals(using, cap)
    totals.update(finished)
    ((dead, cancelled),) = _rows(using, sql.JOB_COUNT_ENDED, {"cap": cap})
    for status, jobs in ((Status.DEAD, dead), (Status.CANCELLED, cancelled)):
        totals[status] = jobs
        if jobs >= cap:
            capped.add(status)
    estimated -= {Status.DEAD, Status.CANCELLED}

    ((wait, expired),) = _rows(
        using, sql.JOB_GET_HEALTH, {"cap": cap, "queues": MAX_QUEUES, "now": now}
    )
    return QueueSummary(
        live=live,
        totals=totals,
        estimated=frozenset(estimated),
        capped=frozenset(capped),
        oldest_pending_wait=wait,
        expired_leases=expired,
        cap=cap,
    )


def _finished_totals(using: str, cap: int) -> tuple[dict[str, int | None], set[str]]:
    """done/dead/cancelled totals: exact on a small table, else from planner
    statistics (``queue_summary`` counts dead and cancelled through their indexes)."""
    stats = column_stats(using, "status")
    if stats.small(cap):
        # Small table: exact, and still bounded in case the statistics are stale.
        jobs = Job.objects.db_manager(using).order_by()
        return {s: jobs.filter(status=s)[: cap + 1].count() for s in FINISHED_STATUSES}, set()
    if stats.total < 0 or not stats.freqs:
        return dict.fromkeys(FINISHED_STATUSES), set()
    return (
        {s: round(stats.total * stats.freqs.get(s, 0.0)) for s in FINISHED_STATUSES},
        set(FINISHED_STATUSES),
    )


#: Pending jobs of each queue whose tasks the admin's task filter offers.
LIVE_VALUES_PER_QUEUE = 1000


def live_values(using: str, *, cap: int = 10_000) -> tuple[set[str], set[str]]:
    """The queues and the tasks that hold live jobs (``sql.JOB_GET_LIVE_VALUES``):
    every queue; the tasks of the first jobs of each queue and status (bounded)."""
    rows = _rows(
        using,
        sql.JOB_GET_LIVE_VALUES,
        {"cap": cap, "queues": MAX_QUEUES, "per_queue": LIVE_VALUES_PER_QUEUE},
    )
    return {queue for queue, _ in rows}, {task for _, task in rows}


def column_stats(using: str, column: str) -> ColumnStats:
    """The planner's statistics about one column of the jobs table (no scan)."""
    ((total, size, vals, freqs),) = _rows(using, sql.JOB_GET_COLUMN_STATS, {"column": column})
    pairs = zip(vals or (), freqs or (), strict=True)
    return ColumnStats(total=total, bytes=size, freqs=dict(pairs))


@dataclass(frozen=True)
class TagCount:
    """The jobs carrying one tag (``pgqueue_status --tag``): by status and queue, at
    most ``cap`` of them read (``capped``: there may be more)."""

    tag: str
    counts: dict[tuple[str, str], int]
    cap: int

    @property
    def capped(self) -> bool:
        return sum(self.counts.values()) >= self.cap

    def as_json(self) -> dict[str, Any]:
        return {
            "tag": self.tag,
            "capped": self.capped,
            "jobs": [
                {"status": status, "queue": queue, "jobs": jobs}
                for (status, queue), jobs in self.counts.items()
            ],
        }


def tag_count(using: str | None, tag: str, *, cap: int = 100_000) -> TagCount:
    """How many jobs carry ``tag``, by status and queue, through the tags index; at most
    ``cap`` jobs are read (``sql.JOB_COUNT_TAG``)."""
    rows = _rows(using, sql.JOB_COUNT_TAG, {"tag": tag, "cap": cap})
    return TagCount(tag=tag, counts={(s, q): n for s, q, n in rows}, cap=cap)


def common_tags(using: str, *, limit: int = 100) -> list[str]:
    """Tags for the admin's filter: every tag in use on a small table, the planner's
    most common ones on a big one (no scan; a rare tag is still found by the search)."""
    small = column_stats(using, "tags").small(limit * 100)
    rows = _rows(using, sql.JOB_GET_COMMON_TAGS, {"small": small, "limit": limit})
    return [tag for (tag,) in rows]


def common_values(using: str, column: str, *, limit: int = 100) -> list[str]:
    """Values of ``queue`` or ``task`` for the admin's filters: those that hold live
    jobs (``live_values``) first, then, to ``limit``, every other value on a small
    table (DISTINCT) or the planner's most common values on a big one (no scan; rare
    values of finished jobs may be missing there, and the admin search still finds
    them). Sorted."""
    if column not in ("queue", "task"):
        raise ValueError(f"no common values for column {column!r}")
    queues, tasks = live_values(using)
    live = sorted(queues if column == "queue" else tasks)[:limit]
    stats = column_stats(using, column)
    if stats.small(limit * 100):
        others = list(
            Job.objects.db_manager(using)
            .order_by(column)
            .values_list(column, flat=True)
            .distinct()[:limit]
        )
    else:
        others = sorted(stats.freqs)
    chosen = set(live)
    for value in others:
        if len(chosen) >= limit:
            break
        chosen.add(value)
    return sorted(chosen)
