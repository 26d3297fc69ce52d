"""monitoring.py: per-queue figures, recent throughput, history and workers, exact on a
small table and bounded (estimated) above the cap."""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest
from django.db import connection

from django_pgqueue import monitoring, sql
from django_pgqueue.models import Job
from django_pgqueue.worker import presence

pytestmark = pytest.mark.django_db

S = dt.timedelta(seconds=1)


def finish(job: Job, *, status: str, at: dt.datetime, waited: float = 0.0) -> None:
    """Make ``job`` look finished at ``at`` after waiting ``waited`` seconds."""
    Job.objects.filter(pk=job.pk).update(
        status=status,
        attempts=1,
        lease_owner="w",
        run_at=at - dt.timedelta(seconds=waited + 0.5),
        last_attempted_at=at - dt.timedelta(seconds=0.5),
        started_at=at - dt.timedelta(seconds=0.5),
        finished_at=at,
    )


def analyze() -> None:
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE pgqueue_job")


def test_snapshot__counts_each_status_per_queue_and_the_oldest_wait(job_factory, now):
    for _ in range(3):
        job_factory(queue="a", run_at=now - 30 * S, now=now)
    job_factory(queue="a", run_at=now - 90 * S, priority=-5, now=now)  # oldest, low priority
    job_factory(queue="b", run_at=now + 3600 * S, now=now)  # scheduled
    job_factory(queue="b", run_at=now - 10 * S, now=now)
    Job.objects.claim("w", limit=1, queues=["b"], now=now)  # running
    dead = job_factory(queue="b")
    finish(dead, status="dead", at=now - 10 * S)

    snap = monitoring.snapshot(now=now)
    a, b = snap.queues["a"], snap.queues["b"]
    assert (a.pending, a.scheduled, a.running, a.dead) == (4, 0, 0, 0)
    assert (b.pending, b.scheduled, b.running, b.dead) == (0, 1, 1, 1)
    assert a.oldest_pending_age == pytest.approx(90, abs=0.01)
    assert b.oldest_pending_age is None
    assert (b.failed_5m, a.estimated, b.estimated) == (1, frozenset(), frozenset())
    assert snap.taken_at == now


def test_snapshot__recent_done_and_rate_over_the_last_minute(job_factory, now):
    jobs = [job_factory(queue="a") for _ in range(6)]
    for job, seconds_ago in zip(jobs, (5, 30, 59, 61, 200, 301), strict=True):
        finish(job, status="done", at=now - seconds_ago * S)
    q = monitoring.snapshot(now=now).queues["a"]
    # 5 within 5 minutes (not the one 301 s ago); 3 within the last minute.
    assert (q.done_5m, q.finished_per_second) == (5, pytest.approx(3 / 60))
    assert q.estimated == frozenset()


def test_snapshot__recent_cancellations_are_counted(job_factory, now):
    """Cancelled jobs were in no figure: a queue whose jobs were all cancelled looked idle."""
    jobs = [job_factory(queue="a") for _ in range(4)]
    for job, seconds_ago in zip(jobs, (5, 100, 299, 400), strict=True):
        finish(job, status="cancelled", at=now - seconds_ago * S)
    finish(job_factory(queue="b"), status="done", at=now - 5 * S)
    snap = monitoring.snapshot(now=now)
    a, b = snap.queues["a"], snap.queues["b"]
    assert (a.cancelled_5m, a.done_5m, a.failed_5m) == (3, 0, 0)
    assert (b.cancelled_5m, b.done_5m) == (0, 1)
    assert snap.as_json()["queues"]["a"]["cancelled_5m"] == 3
    capped = monitoring.snapshot(now=now, cap=2).queues["a"]
    assert "cancelled_5m" in capped.lower_bound and capped.cancelled_5m == 2


def test_snapshot__above_the_cap_counts_are_estimates_not_scans(job_factory, now):
    for i in range(40):
        job_factory(queue="a" if i % 4 else "b", run_at=now + 3600 * S)  # scheduled
    analyze()
    snap = monitoring.snapshot(cap=10, now=now)
    total = sum(q.scheduled for q in snap.queues.values())
    assert total == pytest.approx(40, abs=2)  # the planner's estimate, split by sample
    assert all("scheduled" in q.estimated for q in snap.queues.values())


def test_snapshot__pending_is_counted_per_queue_up_to_the_cap(job_factory, now):
    """Pending is counted queue by queue: a queue over the cap is a lower bound, never
    an estimate that a big queue's share of one sample hides a small queue in."""
    for i in range(40):
        job_factory(queue="a" if i % 8 else "b", run_at=now - (i + 1) * S, now=now)
    snap = monitoring.snapshot(cap=10, now=now)
    a, b = snap.queues["a"], snap.queues["b"]
    assert (a.pending, a.lower_bound, "pending" in a.estimated) == (10, {"pending"}, True)
    assert (b.pending, b.lower_bound, b.estimated) == (5, frozenset(), frozenset())
    assert (a.oldest_pending_age, b.oldest_pending_age) == (40.0, 33.0)


def test_snapshot__a_capped_recent_sample_is_a_lower_bound(job_factory, now):
    # 60 jobs done one every 5 s over the last 5 minutes; a cap of 10 sees the newest
    # 10 (about 50 s worth): at least 10, never scaled up by their rate.
    for i in range(60):
        finish(job_factory(queue="a"), status="done", at=now - (5 * i + 1) * S)
    q = monitoring.snapshot(cap=10, now=now).queues["a"]
    assert (q.done_5m, q.finished_per_second) == (10, pytest.approx(10 / 60))
    assert {"done_5m", "finished_per_second"} <= q.lower_bound <= q.estimated
    # A sample that reaches back past the last minute counts that minute exactly.
    q = monitoring.snapshot(cap=20, now=now).queues["a"]
    assert (q.done_5m, q.finished_per_second) == (20, pytest.approx(12 / 60))
    assert q.lower_bound == {"done_5m"}


def test_snapshot__lists_live_workers_and_their_queues(now):
    presence.register("default", "w-1", queues=["idle"], concurrency=2, lease_seconds=30)
    try:
        snap = monitoring.snapshot()
        assert [w.id for w in snap.live_workers] == ["w-1"]
        assert snap.queues["idle"].pending == 0  # a queue served, with nothing in it
        data = json.loads(json.dumps(snap.as_json()))
        assert data["workers"][0]["id"] == "w-1"
        assert data["workers"][0]["state"] == "live"
    finally:
        presence.unregister("w-1")


def test_history__finished_failed_and_wait_per_minute(job_factory, now):
    minute = now.replace(second=0, microsecond=0)
    for seconds in (10, 20):
        finish(job_factory(), status="done", at=minute - 120 * S + seconds * S, waited=4)
    finish(job_factory(), status="done", at=minute + 5 * S, waited=2)
    finish(job_factory(), status="dead", at=minute - 119 * S)
    hist = monitoring.history(minutes=5, now=now)
    assert [m.start for m in hist.minutes] == [
        minute - dt.timedelta(minutes=n) for n in (4, 3, 2, 1, 0)
    ]
    by_start = {m.start: m for m in hist.minutes}
    two_ago = by_start[minute - dt.timedelta(minutes=2)]
    assert (two_ago.finished, two_ago.failed) == (2, 1)
    assert two_ago.wait_avg == pytest.approx(4.0)
    assert by_start[minute].finished == 1 and by_start[minute].wait_max == pytest.approx(2.0)
    assert by_start[minute - dt.timedelta(minutes=1)].finished == 0


def test_history__a_busy_minute_is_a_lower_bound(job_factory, now):
    minute = now.replace(second=0, microsecond=0) - dt.timedelta(minutes=1)
    for i in range(30):  # one every 2 s: 30 in the minute
        finish(job_factory(), status="done", at=minute + (2 * i + 1) * S)
    busy = monitoring.history(minutes=2, cap=5, count_cap=10, now=now).minutes[0]
    assert (busy.finished, busy.lower_bound, busy.estimated) == (10, True, True)
    assert busy.wait_avg == pytest.approx(0.0)  # of its first 5 jobs
    exact = monitoring.history(minutes=2, cap=5, count_cap=30, now=now).minutes[0]
    assert (exact.finished, exact.lower_bound) == (30, True)
    exact = monitoring.history(minutes=2, cap=5, count_cap=31, now=now).minutes[0]
    assert (exact.finished, exact.lower_bound) == (30, False)


@pytest.mark.parametrize(
    ("name", "index", "params"),
    [
        ("JOB_SAMPLE_FINISHED", "pgqueue_job_done_idx", {"cap": 100, "window_seconds": 300}),
        (
            "JOB_SAMPLE_FINISHED",
            "pgqueue_job_cancelled_idx",
            {"cap": 100, "window_seconds": 300},
        ),
        (
            "JOB_GET_HISTORY",
            "pgqueue_job_done_idx",
            {"cap": 100, "count_cap": 1000, "minutes": 60},
        ),
        ("JOB_GET_QUEUE_BACKLOG", "pgqueue_job_pending_age_idx", {"cap": 100, "queues": 10}),
        ("JOB_GET_RUNNING", "pgqueue_job_lease_idx", {"limit": 100}),
        ("JOB_COUNT_SAMPLE_BY_QUEUE", "pgqueue_job_dead_idx", {"cap": 100}),
        ("JOB_COUNT_ENDED", "pgqueue_job_dead_idx", {"cap": 100}),
        ("JOB_GET_HEALTH", "pgqueue_job_pending_age_idx", {"cap": 100, "queues": 10}),
        (
            "JOB_GET_LIVE_VALUES",
            "pgqueue_job_pending_age_idx",
            {"cap": 100, "queues": 10, "per_queue": 10},
        ),
    ],
)
def test_monitoring_sql__reads_indexes_not_the_table(name, index, params, now):
    # 5,000 jobs, mostly done: the figures must come from the partial indexes.
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgqueue_job (backend, queue, task, args, kwargs, priority, status,"
            " attempts, max_attempts, run_at, errors, created_at, finished_at, lease_owner,"
            " lease_expires_at)"
            " SELECT 'default', 'q' || (g %% 3), 't', '[]', '{}', 0,"
            " CASE WHEN g %% 50 = 0 THEN 'pending' WHEN g %% 97 = 0 THEN 'dead'"
            "      WHEN g %% 89 = 0 THEN 'running' ELSE 'done' END, 1, 3,"
            " %(now)s - g * interval '1 second', '[]', %(now)s,"
            " %(now)s - g * interval '1 second', 'w', %(now)s"
            " FROM generate_series(1, 5000) AS g",
            {"now": now},
        )
        cursor.execute("ANALYZE pgqueue_job")
        cursor.execute("EXPLAIN " + getattr(sql, name), {**params, "now": now})
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert index in plan, plan
    assert "Seq Scan on pgqueue_job" not in plan, plan
    if index in ("pgqueue_job_done_idx", "pgqueue_job_cancelled_idx"):
        # The time window bounds the index scan itself, not a filter after it: with no
        # job in the window, a filter would walk every done job.
        assert re.search(r"Index Cond: \(+finished_at >=", plan), plan
