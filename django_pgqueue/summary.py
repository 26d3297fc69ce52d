"""What the admin reads about the queue: the summary above the job list and the planner
statistics behind its filters and its totals.

Nothing here scans the jobs table. Live counts walk the partial indexes of the live
statuses under a LIMIT (``sql.JOB_COUNT_LIVE_BY_QUEUE``); done and dead totals, and the
filters' choices on a big table, come from the planner's statistics
(``sql.JOB_GET_COLUMN_STATS``: ``pg_class.reltuples`` and ``pg_stats``), which autovacuum's
ANALYZE keeps roughly current; a small table is counted exactly.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from django.db import connections

from . import sql
from .models import FINISHED_STATUSES, LIVE_STATUSES, Job

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


def _rows(using: str, query: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    with connections[using].cursor() as cursor:
        cursor.execute(query, params)
        return cursor.fetchall()


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
