"""Claiming pending jobs: ``Job.objects.claim``. Runs the statements of ``sql/claim.py``;
a claim under flow control (limits, paused or fair queues) is ``flow.claim_flow``'s.

Every claim is one statement: its candidates locked ``FOR UPDATE SKIP LOCKED`` (so
competing workers take disjoint jobs and never wait on each other), leased to the
worker and their attempt charged. A worker resumes each claim where its previous one
ended (``after``), so a claim never walks the dead index entries of the jobs claimed
since the last vacuum (``worker/position.py`` keeps the position).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from django.db import models

from . import db, flow
from .conf import settings
from .sql import claim as sql

#: The position of a queue a resumed claim starts at its head: above every priority (the
#: CHECK constraint keeps them within -100 to 100) and every id, so that only its range
#: below the position, the whole line, holds anything (``sql.JOB_CLAIM_QUEUES_AFTER``).
QUEUE_HEAD = flow.QUEUE_HEAD


def check_limit(limit: Any) -> int:
    """A claim's ``limit``, checked: an int >= 1; ``ValueError`` naming it otherwise."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"claim limit must be an int >= 1, not {limit!r}")
    return limit


def claim(
    model: type[models.Model],
    alias: str,
    worker_id: str,
    *,
    limit: int,
    queues: Iterable[str] | None = None,
    lease_seconds: float | None = None,
    after: tuple[int, int] | Mapping[str, tuple[int, int]] | None = None,
    now: dt.datetime | None = None,
    flow_view: flow.FlowView | None = None,
) -> list[Any]:
    """Lease up to ``limit`` pending jobs to ``worker_id``, highest priority first (see
    ``Job.objects.claim``); under flow control, ``flow.claim_flow``'s claim."""
    check_limit(limit)
    view = flow.settings_view() if flow_view is None else flow_view
    if view.in_force(queues):
        return flow.claim_flow(
            model,
            alias,
            worker_id,
            limit=limit,
            view=view,
            queues=queues,
            lease_seconds=lease_seconds,
            now=now,
        ).jobs
    name, params = _statement(worker_id, limit, queues, lease_seconds, after, now)
    jobs: list[Any] = db.jobs(model, alias, getattr(sql, name), params)
    jobs.sort(key=lambda job: (-job.priority, job.id))
    return jobs


class KindClaim(NamedTuple):
    """What a claim by kind (:func:`claim_kinds`) leased, and what it saw."""

    #: The jobs leased, in claim order.
    jobs: list[Any]
    #: How many candidates it locked: fewer than its two limits, the line is drained.
    scanned: int
    #: Whether a candidate it passed over comes before a job it leased, in claim order
    #: (a worker's position after that job would skip it: read from the head next).
    passed_behind: bool


def claim_kinds(
    model: type[models.Model],
    alias: str,
    worker_id: str,
    *,
    loop_tasks: Iterable[str],
    thread_tasks: Iterable[str] = (),
    loop_limit: int,
    thread_limit: int,
    queues: Iterable[str] | None = None,
    lease_seconds: float | None = None,
    after: tuple[int, int] | Mapping[str, tuple[int, int]] | None = None,
    now: dt.datetime | None = None,
) -> KindClaim:
    """Lease jobs for both sides of a worker with an event loop, as :func:`claim`
    but by kind, whatever flow control says (the caller checks that none applies): of
    its next ``loop_limit + thread_limit`` candidates, at most ``loop_limit`` jobs of
    ``loop_tasks`` (the coroutine tasks it runs on its loop) and ``thread_limit`` of
    ``thread_tasks`` (those it runs on threads); a job of any other task counts against
    both limits, and is leased only while both have room."""
    for name, value in (("loop_limit", loop_limit), ("thread_limit", thread_limit)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"claim {name} must be an int >= 0, not {value!r}")
    limit = check_limit(loop_limit + thread_limit)
    name, params = _statement(worker_id, limit, queues, lease_seconds, after, now)
    params.update(
        loop_tasks=sorted(set(loop_tasks)),
        thread_tasks=sorted(set(thread_tasks)),
        loop_limit=loop_limit,
        thread_limit=thread_limit,
    )
    # (read at the call, as claim() reads its statement: a test may replace one)
    query = getattr(sql, f"{name}_KINDS")
    columns, found = db.returned(alias, query, params)
    # One row at least: what was seen, with NULLs for the job when none was leased.
    scanned, passed_behind = found[0][-2:] if found else (0, False)
    key = columns.index("id")
    rows = [row[:-2] for row in found if row[key] is not None]
    jobs: list[Any] = db.load_jobs(model, alias, columns[:-2], rows, (query, params))
    jobs.sort(key=lambda job: (-job.priority, job.id))
    return KindClaim(jobs, scanned, passed_behind)


def _statement(
    worker_id: str,
    limit: int,
    queues: Iterable[str] | None,
    lease_seconds: float | None,
    after: tuple[int, int] | Mapping[str, tuple[int, int]] | None,
    now: dt.datetime | None,
) -> tuple[str, dict[str, Any]]:
    """The name of the claim statement without flow control for these arguments (in
    ``sql/claim.py``), and its parameters: from the head or resumed ``after``, of all
    queues or some."""
    params: dict[str, Any] = {
        "worker_id": worker_id,
        "limit": limit,
        "lease_seconds": settings.LEASE_SECONDS if lease_seconds is None else lease_seconds,
        "now": now,
    }
    if queues is not None:
        params["queues"] = list(queues)
        if after is None:
            query = "JOB_CLAIM_QUEUES"
        elif isinstance(after, Mapping):
            query = "JOB_CLAIM_QUEUES_AFTER"
            ends = [after.get(name, QUEUE_HEAD) for name in params["queues"]]
            params["after_priorities"] = [priority for priority, _ in ends]
            params["after_ids"] = [job_id for _, job_id in ends]
        else:
            raise ValueError("claim(queues=..., after=...) takes a position per queue")
    elif after is not None:
        if isinstance(after, Mapping):
            raise ValueError("claim(after=...) of all queues takes one position")
        query = "JOB_CLAIM_AFTER"
        params["after_priority"], params["after_id"] = after
    else:
        query = "JOB_CLAIM"
    return query, params
