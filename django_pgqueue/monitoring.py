"""The read model of the queue's health: what ``pgqueue_status``, the admin dashboard
and the Prometheus metrics show, from one set of bounded queries.

Every figure comes from an index walked under a ``LIMIT``, from the small workers
table, or from planner statistics: none of them reads the whole jobs table, so a
status probe or a scrape costs the same on ten million rows as on ten thousand. Where
an exact count would need a scan, the figure is an estimate, and the result says so
(``estimated``).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from django.db import connections

from . import sql
from .conf import settings

#: Most workers listed (the workers table holds one row per process).
MAX_WORKERS = 1000


def _rows(using: str | None, query: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    with connections[using or settings.DATABASE].cursor() as cursor:
        cursor.execute(query, params)
        return cursor.fetchall()


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
            "state": self.state,
        }


def workers(*, using: str | None = None, now: dt.datetime | None = None) -> list[WorkerInfo]:
    """Registered workers, live and lost, ordered by host and id."""
    return [
        WorkerInfo(*row)
        for row in _rows(using, sql.WORKER_GET_ALL, {"now": now, "limit": MAX_WORKERS})
    ]
