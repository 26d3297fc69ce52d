"""The sweeper: rescue expired leases, promote due jobs, prune old done jobs.

Every time rule is tested as a boundary pair with the clock pinned: one second past the
horizon is acted on, one second short is not.
"""

from __future__ import annotations

import datetime as dt
import logging
import time

import psycopg
import pytest
from django.db import connection, transaction

from django_pgqueue import sql
from django_pgqueue.models import Job
from django_pgqueue.sweeper import Sweeper, SweepResult, sweep
from tests.conftest import wait_for

S = dt.timedelta(seconds=1)


def fresh(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def claimed(job_factory, at: dt.datetime, lease: int = 60, **overrides) -> Job:
    """A job claimed by worker "w1" at ``at``; its lease expires at ``at + lease``."""
    job = job_factory(now=at, **overrides)
    (claimed_job,) = Job.objects.claim("w1", limit=1, lease_seconds=lease, now=at)
    assert claimed_job.id == job.id
    return claimed_job


def done(job_factory, at: dt.datetime) -> Job:
    """A job that finished at ``at``."""
    job = claimed(job_factory, at)
    assert Job.objects.complete(job, "w1", now=at)
    return job


# --- rescue of expired leases ---------------------------------------------------------


@pytest.mark.django_db
def test_sweep__rescues_a_lease_expired_one_second_ago_only(job_factory, now):
    expired = claimed(job_factory, now)  # lease ends at now + 60 s
    live = claimed(job_factory, now + 2 * S)  # lease ends at now + 62 s
    result = sweep(now=now + 61 * S)
    assert result == SweepResult(recovered=1)
    row = fresh(expired)
    assert (row.status, row.lease_owner, row.lease_expires_at) == ("pending", None, None)
    assert row.attempts == 1  # the lost attempt stays charged
    (error,) = row.errors
    assert error["exception_class_path"] == "django_pgqueue.exceptions.LeaseExpired"
    assert (error["worker_id"], error["attempt"]) == ("w1", 1)
    assert fresh(live).status == "running"
    assert fresh(live).lease_owner == "w1"


@pytest.mark.django_db
def test_sweep__lease_ending_exactly_now_is_not_rescued(job_factory, now):
    job = claimed(job_factory, now)
    assert sweep(now=now + 60 * S) == SweepResult()
    assert fresh(job).status == "running"


@pytest.mark.django_db
def test_sweep__expiry_on_the_last_attempt_is_dead(job_factory, now):
    job = claimed(job_factory, now, max_attempts=1)
    result = sweep(now=now + 61 * S)
    assert result == SweepResult(dead=1)
    row = fresh(job)
    assert (row.status, row.attempts, row.finished_at) == ("dead", 1, now + 61 * S)
    assert row.lease_owner == "w1"  # kept: who was running it when it died
    (error,) = row.errors
    assert error["exception_class_path"] == "django_pgqueue.exceptions.LeaseExpired"
    assert "lease of worker w1 expired after attempt 1 of 1" in error["traceback"]


@pytest.mark.django_db
def test_sweep__rescued_job_runs_again_and_a_second_expiry_is_dead(job_factory, now):
    job = claimed(job_factory, now, max_attempts=2)
    assert sweep(now=now + 61 * S).recovered == 1
    (again,) = Job.objects.claim("w2", limit=1, lease_seconds=60, now=now + 70 * S)
    assert again.attempts == 2
    assert sweep(now=now + 131 * S).dead == 1
    errors = fresh(job).errors
    assert [(e["worker_id"], e["attempt"]) for e in errors] == [("w1", 1), ("w2", 2)]


# --- promotion of scheduled jobs ------------------------------------------------------


@pytest.mark.django_db
def test_sweep__promotes_a_job_due_one_second_ago_only(job_factory, now):
    due = job_factory(run_at=now + 60 * S, now=now)
    not_yet = job_factory(run_at=now + 62 * S, now=now)
    assert sweep(now=now + 61 * S) == SweepResult(promoted=1)
    assert fresh(due).status == "pending"
    assert fresh(not_yet).status == "scheduled"


@pytest.mark.django_db
def test_sweep__promotes_a_job_due_exactly_now(job_factory, now):
    job = job_factory(run_at=now + 60 * S, now=now)
    assert sweep(now=now + 60 * S).promoted == 1
    assert fresh(job).status == "pending"


@pytest.mark.django_db(transaction=True)
@pytest.mark.concurrency
def test_sweep__promotion_wakes_workers_of_the_queue(job_factory, now, other_connection):
    listener = other_connection(autocommit=True)
    job_factory(queue="later", run_at=now + 60 * S, now=now)
    listener.execute("LISTEN pgqueue_job")
    sweep(now=now + 61 * S)
    got = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert got == ["later"]


# --- pruning --------------------------------------------------------------------------


@pytest.mark.django_db
def test_sweep__prunes_done_jobs_past_retention_only(job_factory, now, settings):
    settings.PGQUEUE_RETENTION_SECONDS = 3600
    old = done(job_factory, now)
    recent = done(job_factory, now + 2 * S)
    result = sweep(now=now + 3601 * S)
    assert result == SweepResult(pruned=1)
    assert not Job.objects.filter(pk=old.pk).exists()
    assert Job.objects.filter(pk=recent.pk).exists()


@pytest.mark.django_db
def test_sweep__never_prunes_dead_jobs(job_factory, now, settings):
    settings.PGQUEUE_RETENTION_SECONDS = 60
    job = claimed(job_factory, now)
    assert Job.objects.fail(job, "w1", RuntimeError("x"), retry=False, now=now) == "dead"
    assert sweep(now=now + dt.timedelta(days=365)).pruned == 0
    assert fresh(job).status == "dead"


def cancelled(job_factory, at: dt.datetime) -> Job:
    """A job cancelled (before it ran) at ``at``."""
    job = job_factory(now=at)
    assert Job.objects.cancel([job.id], now=at).cancelled == [job.id]
    return job


def dead(job_factory, at: dt.datetime) -> Job:
    """A job dead-lettered at ``at``."""
    job = claimed(job_factory, at)
    assert Job.objects.fail(job, "w1", RuntimeError("x"), retry=False, now=at) == "dead"
    return job


@pytest.mark.django_db
@pytest.mark.parametrize(("make", "setting"), [
    (cancelled, "PGQUEUE_CANCELLED_RETENTION_SECONDS"),
    (dead, "PGQUEUE_DEAD_RETENTION_SECONDS"),
    (done, "PGQUEUE_RETENTION_SECONDS"),
], ids=["cancelled", "dead", "done"])  # fmt: skip
def test_sweep__prunes_each_final_state_one_second_past_its_retention(
    job_factory, now, settings, make, setting
):
    setattr(settings, setting, 3600)
    job = make(job_factory, now)
    assert sweep(now=now + 3599 * S).pruned == 0  # one second short: kept
    assert Job.objects.filter(pk=job.pk).exists()
    assert sweep(now=now + 3601 * S).pruned == 1  # one second past: pruned
    assert not Job.objects.filter(pk=job.pk).exists()


@pytest.mark.django_db
def test_sweep__cancelled_jobs_are_pruned_by_default_and_dead_letters_kept(job_factory, now):
    kept = dead(job_factory, now)
    gone = cancelled(job_factory, now)
    assert sweep(now=now + dt.timedelta(days=8)).pruned == 1
    assert list(Job.objects.values_list("pk", flat=True)) == [kept.pk]
    assert gone.pk != kept.pk


@pytest.mark.django_db
def test_sweep__cancelled_retention_none_keeps_them(job_factory, now, settings):
    settings.PGQUEUE_CANCELLED_RETENTION_SECONDS = None
    job = cancelled(job_factory, now)
    assert sweep(now=now + dt.timedelta(days=3650)).pruned == 0
    assert Job.objects.filter(pk=job.pk).exists()


@pytest.mark.django_db
@pytest.mark.parametrize(("status", "index"), [
    ("done", "pgqueue_job_done_idx"),
    ("cancelled", "pgqueue_job_cancelled_idx"),
], ids=["done", "cancelled"])  # fmt: skip
def test_sweep__pruning_reads_each_states_own_index(status, index):
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgqueue_job (backend, queue, task, args, kwargs, priority, status,"
            " attempts, max_attempts, run_at, errors, created_at, finished_at)"
            " SELECT 'default', 'default', 'testproject.demo.tasks.add', '[]', '{}', 0,"
            " s, 0, 5, clock_timestamp(), '[]', clock_timestamp(), clock_timestamp()"
            " FROM generate_series(1, 3000) AS g,"
            " unnest(ARRAY['done', 'cancelled', 'dead']) AS s"
        )
        cursor.execute("ANALYZE pgqueue_job")
        query = psycopg.ClientCursor(connection.connection).mogrify(
            sql.JOB_LOCK_FINISHED_BEFORE,
            {"status": status, "now": None, "retention_seconds": 60, "batch_size": 100},
        )
        cursor.execute("EXPLAIN (FORMAT JSON) " + query)
        plan = str(cursor.fetchone()[0])
    assert f"'Index Name': '{index}'" in plan, plan


# --- bounded batches ------------------------------------------------------------------


def statements(captured, marker: str) -> int:
    return sum(1 for q in captured if marker in q["sql"])


@pytest.mark.django_db
def test_sweep__works_in_bounded_batches_but_finishes_the_pass(
    job_factory, now, settings, django_assert_max_num_queries
):
    settings.PGQUEUE_SWEEP_BATCH_SIZE = 3
    settings.PGQUEUE_RETENTION_SECONDS = 60
    for _ in range(7):
        claimed(job_factory, now)
        job_factory(run_at=now + S, now=now)
        done(job_factory, now)
    with django_assert_max_num_queries(100) as captured:
        result = sweep(now=now + dt.timedelta(hours=1))
    assert result == SweepResult(recovered=7, promoted=7, pruned=7)
    # 7 rows in batches of 3: 3 + 3 + 1, so three statements of each kind.
    assert statements(captured, "expired AS (") == 3
    assert statements(captured, "WITH due AS (") == 3
    assert statements(captured, "status = 'done'\n") == 3
    # Cancelled jobs have a retention of their own: one (empty) batch of them.
    assert statements(captured, "status = 'cancelled'\n") == 1
    assert Job.objects.filter(status="pending").count() == 14


@pytest.mark.django_db
def test_sweep__full_last_batch_needs_one_more_empty_batch(
    job_factory, now, settings, django_assert_max_num_queries
):
    settings.PGQUEUE_SWEEP_BATCH_SIZE = 3
    for _ in range(6):
        claimed(job_factory, now)
    with django_assert_max_num_queries(100) as captured:
        assert sweep(now=now + dt.timedelta(hours=1)).recovered == 6
    assert statements(captured, "expired AS (") == 3  # 3, 3, then 0 ends it


# --- several sweepers at once ---------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.concurrency
def test_sweep__two_sweepers_at_once_split_the_work_without_blocking(
    job_factory, now, other_connection
):
    ids = {claimed(job_factory, now).id for _ in range(4)}
    later = now + dt.timedelta(hours=1)
    # Sweeper 1 rescues a batch of two in an open transaction, holding their row locks.
    other = other_connection()
    cursor = psycopg.ClientCursor(other)
    cursor.execute(
        sql.JOB_RESCUE_EXPIRED,
        {"now": later, "batch_size": 2, "keep_errors": 10, "channel": "pgqueue_job"},
    )
    first = {row[0] for row in cursor.fetchall()}
    assert len(first) == 2

    # Sweeper 2 would fail on lock_timeout if it waited; it skips the locked rows.
    with transaction.atomic():
        with connection.cursor() as c:
            c.execute("SET LOCAL lock_timeout = '100ms'")
            c.execute("SET LOCAL statement_timeout = '2s'")
        started = time.monotonic()
        result = sweep(now=later)
        elapsed = time.monotonic() - started
    assert elapsed < 1.0
    assert result == SweepResult(recovered=2)
    other.commit()
    assert Job.objects.filter(pk__in=ids, status="pending").count() == 4
    # Each job was rescued once: exactly one LeaseExpired entry each.
    assert [len(j.errors) for j in Job.objects.filter(pk__in=ids)] == [1, 1, 1, 1]
    assert sweep(now=later) == SweepResult()


# --- the Sweeper class ----------------------------------------------------------------


@pytest.mark.django_db
def test_sweeper__run_once_sweeps_with_the_database_clock(job_factory, caplog):
    job_factory()
    (job,) = Job.objects.claim("w1", limit=1, lease_seconds=0.001)
    with caplog.at_level(logging.INFO, logger="django_pgqueue"):
        result = wait_for(Sweeper().run_once, timeout=5)
    assert result == SweepResult(recovered=1)
    assert fresh(job).status == "pending"
    assert "sweep: recovered=1 dead=0 promoted=0 pruned=0 periodic=0 cancelled=0" in caplog.text


@pytest.mark.django_db
def test_sweeper__run_once_is_quiet_when_nothing_changed(db, caplog):
    with caplog.at_level(logging.INFO, logger="django_pgqueue"):
        assert Sweeper().run_once() == SweepResult()
    assert "sweep:" not in caplog.text


@pytest.mark.django_db
def test_manager__sweep_and_its_parts_are_on_job_objects_as_documented(job_factory, now):
    """``Job.objects.sweep()`` (documented, and gone for a release without a deprecation)
    and its parts run the sweeper's passes on the manager's database: a lease expired one
    second ago comes back, a job due one second ago is promoted, a done job past its
    retention is pruned, and a lost worker's row is deleted."""
    expired = claimed(job_factory, now - 61 * S)
    due = job_factory(now=now - 10 * S, run_at=now - S)
    old = done(job_factory, now - dt.timedelta(days=30))
    result = Job.objects.sweep(now=now)
    assert isinstance(result, SweepResult)
    assert (result.recovered, result.promoted, result.pruned) == (1, 1, 1)
    assert (fresh(expired).status, fresh(due).status) == ("pending", "pending")
    assert not Job.objects.filter(pk=old.pk).exists()
    # Each part alone, on the same shapes (nothing left to do the second time).
    Job.objects.all().delete()
    again = claimed(job_factory, now - 61 * S)
    assert Job.objects.rescue_expired(now=now) == (1, 0, 0)
    assert Job.objects.rescue_expired(now=now) == (0, 0, 0)
    assert fresh(again).status == "pending"
    later = job_factory(now=now - 10 * S, run_at=now - S)
    assert Job.objects.promote_due(now=now) == 1 and fresh(later).status == "pending"
    Job.objects.all().delete()
    gone = done(job_factory, now - dt.timedelta(days=30))
    assert Job.objects.prune_finished(now=now) == 1
    assert not Job.objects.filter(pk=gone.pk).exists()
    assert Job.objects.prune_lost_workers(now=now) == 0
    assert Job.objects.prune_expired_keys(now=now) == 0
    assert Job.objects.prune_rate_windows(now=now) == 0
    assert Job.objects.resolve_missed(now=now) == 0
