"""Cancellation: Job.objects.cancel(), what workers and the sweeper do with it, and real
worker processes stopping cancelled jobs."""

from __future__ import annotations

import datetime as dt
import logging
import re
import threading
import time
from pathlib import Path

import pytest
from django.test import override_settings

from django_pgqueue.exceptions import InvalidJob, JobCancelled
from django_pgqueue.manager import CancelResult
from django_pgqueue.models import Job
from django_pgqueue.sweeper import sweep
from django_pgqueue.taskapi import TaskResultStatus, default_task_backend
from testproject.demo.models import Delivery

from .conftest import wait_for

S = dt.timedelta(seconds=1)
CANCELLED_PATH = "django_pgqueue.exceptions.JobCancelled"


def fresh(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def claim(worker_id: str = "w1", **kwargs: object) -> Job:
    (job,) = Job.objects.claim(worker_id, limit=1, **kwargs)
    return job


def cancel_errors(job: Job) -> list[dict]:
    return [e for e in fresh(job).errors if e["exception_class_path"] == CANCELLED_PATH]


# --- the manager ------------------------------------------------------------------------


def test_cancel__pending_and_scheduled_jobs_are_cancelled_at_once(job_factory, now):
    pending = job_factory()
    scheduled = job_factory(run_at=now + dt.timedelta(days=1), now=now)
    result = Job.objects.cancel([pending.id, scheduled.id], now=now)
    assert result == CancelResult(cancelled=sorted([pending.id, scheduled.id]), requested=[])
    for job in (pending, scheduled):
        row = fresh(job)
        assert (row.status, row.finished_at, row.cancel_requested_at) == ("cancelled", now, now)
        assert len(cancel_errors(job)) == 1
    assert Job.objects.claim("w1", limit=10) == []  # never runs


def test_cancel__get_result_is_failed_with_one_job_cancelled_error(job_factory):
    job = job_factory()
    Job.objects.cancel([job.id])
    result = default_task_backend.get_result(str(job.id))
    assert result.status == TaskResultStatus.FAILED
    (error,) = result.errors
    assert error.exception_class is JobCancelled
    assert "cancelled before it ran (pending)" in error.traceback


def test_cancel__running_job_is_requested_and_the_lease_extension_reports_it(job_factory):
    job = job_factory()
    running = claim()
    assert Job.objects.cancel([job.id]) == CancelResult(cancelled=[], requested=[job.id])
    row = fresh(job)
    assert (row.status, row.lease_owner) == ("running", "w1")  # the worker's fence holds
    assert row.cancel_requested_at is not None
    owned = Job.objects.extend_leases("w1", [running])
    assert owned == {job.id}
    assert owned.cancel_requested == {job.id}
    assert Job.objects.extend_leases("w2", [running]).cancel_requested == frozenset()


def test_cancel__finished_and_unknown_ids_are_left_alone(job_factory):
    done = job_factory()
    Job.objects.complete(claim(), "w1")
    dead = job_factory(max_attempts=1)
    Job.objects.fail(claim(), "w1", ValueError("boom"))
    cancelled = job_factory()
    Job.objects.cancel([cancelled.id])
    before = {j.id: (j.status, j.errors) for j in Job.objects.all()}
    assert Job.objects.cancel([done.id, dead.id, cancelled.id, 10**12]) == CancelResult([], [])
    assert {j.id: (j.status, j.errors) for j in Job.objects.all()} == before


@override_settings(PGQUEUE_SWEEP_BATCH_SIZE=2)
def test_cancel__works_in_bounded_batches(job_factory, django_assert_num_queries):
    jobs = [job_factory() for _ in range(5)]
    with django_assert_num_queries(3):  # ceil(5 / 2) statements
        result = Job.objects.cancel([j.id for j in jobs] * 2)
    assert result.cancelled == sorted(j.id for j in jobs)


@pytest.mark.parametrize(
    ("outcome", "status"),
    [("complete", "cancelled"), ("fail", "cancelled"), ("release", "cancelled")],
)
def test_cancel__a_requested_job_ends_cancelled_whatever_its_outcome(job_factory, outcome, status):
    job = job_factory(max_attempts=5)
    running = claim()
    Job.objects.cancel([job.id])
    manager = Job.objects
    if outcome == "complete":
        assert manager.complete_status(running, "w1", result=1) == "cancelled"
    elif outcome == "fail":
        assert manager.fail(running, "w1", ValueError("boom")) == "cancelled"  # no retry
    else:
        assert manager.release(running, "w1")
    row = fresh(job)
    assert row.status == status
    assert row.finished_at is not None and row.lease_expires_at is None
    assert len(cancel_errors(job)) == 1
    assert row.errors[-1]["exception_class_path"] == CANCELLED_PATH


def test_cancel__a_task_raising_job_cancelled_keeps_one_cancel_error(job_factory):
    job = job_factory()
    running = claim()
    Job.objects.cancel([job.id])
    assert Job.objects.fail(running, "w1", JobCancelled("stopped")) == "cancelled"
    assert len(cancel_errors(job)) == 1


def test_sweep__expired_lease_of_a_cancel_requested_job_is_cancelled_not_retried(job_factory, now):
    job = job_factory(max_attempts=5)
    claim(lease_seconds=10, now=now)
    Job.objects.cancel([job.id], now=now + S)
    result = sweep(now=now + 11 * S)
    assert (result.cancelled, result.recovered, result.dead) == (1, 0, 0)
    row = fresh(job)
    assert row.status == "cancelled"
    assert row.errors[-1]["exception_class_path"] == CANCELLED_PATH
    assert "expired" in row.errors[-1]["traceback"]


@pytest.mark.concurrency
def test_cancel__row_locked_elsewhere_is_not_waited_for(
    transactional_db, job_factory, other_connection
):
    job = job_factory()
    other = other_connection()
    with other.transaction():
        other.execute("SELECT 1 FROM pgqueue_job WHERE id = %s FOR UPDATE", [job.id])
        started = time.monotonic()
        assert Job.objects.cancel([job.id]) == CancelResult([], [])
        assert time.monotonic() - started < 5  # a few short retries, never a lock wait
    assert fresh(job).status == "pending"
    assert Job.objects.cancel([job.id]).cancelled == [job.id]


# --- in-process workers -----------------------------------------------------------------


def cancel_when(marker: Path, job: Job) -> None:
    """Cancel ``job`` as soon as its task created ``marker`` (from another thread)."""
    import threading

    from django.db import connections

    def target() -> None:
        try:
            wait_for(marker.exists, timeout=30)
            Job.objects.cancel([job.id])
        finally:
            connections.close_all()

    threading.Thread(target=target, daemon=True).start()


def test_worker__async_task_coroutine_is_cancelled(run_worker, tmp_path):
    from tests.tasks import async_sleeper

    marker = tmp_path / "started"
    job = Job.objects.enqueue(async_sleeper, [str(marker), 60])
    cancel_when(marker, job)
    started = time.monotonic()
    run_worker(lease_seconds=0.6, timeout=30)
    assert time.monotonic() - started < 20
    row = fresh(job)
    assert row.status == "cancelled"
    assert Path(f"{marker}.cancelled").exists()  # CancelledError reached the coroutine
    assert row.errors[-1]["exception_class_path"] == CANCELLED_PATH


def test_worker__cooperative_task_sees_cancel_requested(run_worker, tmp_path):
    from tests.tasks import cooperative

    marker = tmp_path / "started"
    job = Job.objects.enqueue(cooperative, [str(marker), 60])
    cancel_when(marker, job)
    run_worker(lease_seconds=0.6, timeout=30)
    row = fresh(job)
    assert (row.status, row.result) == ("cancelled", "stopped")
    assert len(cancel_errors(job)) == 1


class Seen(logging.Handler):
    """Sets ``event`` when a record containing ``text`` is emitted on its logger (attached
    to the logger itself, so it works whatever propagation other tests configured)."""

    def __init__(self, text: str) -> None:
        super().__init__(logging.INFO)
        self.text = text
        self.event = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.event.set()


def test_worker__prefetched_job_cancelled_before_it_starts_never_runs(run_worker, tmp_path):
    from django.db import connections

    from tests.tasks import cooperative, sleep_after_marking

    first_marker, second_marker = tmp_path / "first", tmp_path / "second"
    first = Job.objects.enqueue(cooperative, [str(first_marker), 60])
    second = Job.objects.enqueue(sleep_after_marking, [str(second_marker), 0])
    # (The listener tells the task, on a NOTIFY; the heartbeat only if that never came.)
    heartbeat = logging.getLogger("django_pgqueue.worker.state")
    runner = logging.getLogger("django_pgqueue.worker.runner")
    seen = Seen(f"job {second.id}: cancellation requested")
    skipped = Seen(f"job {second.id} cancelled before it started")
    levels = heartbeat.level, runner.level
    heartbeat.addHandler(seen)
    runner.addHandler(skipped)
    heartbeat.setLevel(logging.INFO)
    runner.setLevel(logging.INFO)

    def operator() -> None:
        try:
            wait_for(first_marker.exists, timeout=30)
            assert Job.objects.cancel([second.id]).requested == [second.id]  # prefetched
            assert seen.event.wait(20), "the worker never passed the cancellation on"
            Job.objects.cancel([first.id])
        finally:
            connections.close_all()

    try:
        threading.Thread(target=operator, daemon=True).start()
        run_worker(concurrency=1, batch_size=2, lease_seconds=0.6, timeout=30)
    finally:
        heartbeat.removeHandler(seen)
        runner.removeHandler(skipped)
        heartbeat.setLevel(levels[0])
        runner.setLevel(levels[1])
    assert (fresh(first).status, fresh(second).status) == ("cancelled", "cancelled")
    assert not second_marker.exists()
    assert fresh(second).attempts == 0  # given back, not charged
    assert skipped.event.is_set()


# --- real worker processes -------------------------------------------------------------

WORKER = ("pgqueue_worker", "--poll-interval", "0.1")


@pytest.mark.slow
def test_process__cancelled_pending_job_never_runs(transactional_db, manage, tmp_path):
    from tests.tasks import sleep_after_marking

    marker = tmp_path / "ran"
    job = Job.objects.enqueue(sleep_after_marking, [str(marker), 0])
    other = Job.objects.enqueue(sleep_after_marking, [str(tmp_path / "other"), 0])
    assert Job.objects.cancel([job.id]).cancelled == [job.id]
    worker = manage(*WORKER, "--burst")
    assert worker.wait() == 0, worker.output()
    assert fresh(other).status == "done"  # the worker did run, and skipped nothing else
    assert fresh(job).status == "cancelled"
    assert not marker.exists()


@pytest.mark.slow
def test_process__running_cooperative_task_stops_within_one_heartbeat(
    transactional_db, manage, tmp_path
):
    from tests.tasks import cooperative

    lease = 3.0  # the heartbeat extends (and reads cancellation) every lease / 3 = 1 s
    marker = tmp_path / "started"
    job = Job.objects.enqueue(cooperative, [str(marker), 60])
    worker = manage(*WORKER, "--lease-seconds", str(lease))
    wait_for(marker.exists, timeout=30)
    assert Job.objects.cancel([job.id]).requested == [job.id]
    requested = time.monotonic()
    # One heartbeat period, plus the task's 10 ms step and the write.
    wait_for(lambda: fresh(job).status == "cancelled", timeout=lease / 3 + 1.5)
    elapsed = time.monotonic() - requested
    worker.signal(15)
    assert worker.wait() == 0, worker.output()
    row = fresh(job)
    assert row.result == "stopped"
    assert len(cancel_errors(job)) == 1
    assert f"job {job.id} tests.tasks.cooperative cancelled" in worker.output()
    assert elapsed < lease / 3 + 1.5


@pytest.mark.slow
def test_process__transactional_task_cancelled_mid_run_leaves_no_effect(
    transactional_db, manage, tmp_path
):
    from tests.tasks import transactional_until_cancelled

    marker = tmp_path / "started"
    job = Job.objects.enqueue(transactional_until_cancelled, [str(marker), 60])
    worker = manage(*WORKER, "--lease-seconds", "3")
    wait_for(marker.exists, timeout=30)
    assert Job.objects.cancel([job.id]).requested == [job.id]
    wait_for(lambda: fresh(job).status == "cancelled", timeout=10)
    worker.signal(15)
    assert worker.wait() == 0, worker.output()
    assert not Delivery.objects.filter(job_id=job.id).exists()  # rolled back
    row = fresh(job)
    assert row.result is None
    assert row.errors[-1]["exception_class_path"] == CANCELLED_PATH
    assert any("rolled back" in e["traceback"] for e in row.errors)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("operation", "ids", "message"),
    [
        ("cancel", "812", "not str '812'"),
        ("cancel", b"12", "not bytes"),
        ("cancel", [1.9], "int job ids only, not float 1.9"),
        ("cancel", [True], "int job ids only, not bool True"),
        ("cancel", 5, "collection of int job ids, not int 5"),
        ("discard_dead", "25", "not str '25'"),
        ("requeue_dead", "36", "not str '36'"),
    ],
)
def test_operations__odd_id_arguments_are_refused_changing_nothing(
    job_factory, now, operation, ids, message
):
    pending = [job_factory() for _ in range(8)]
    dead = [job_factory() for _ in range(8)]
    Job.objects.filter(pk__in=[j.id for j in dead]).update(status="dead", finished_at=now)
    before = sorted(Job.objects.values_list("id", "status", "cancel_requested_at"))
    with pytest.raises(InvalidJob, match=re.escape(message)):
        getattr(Job.objects, operation)(ids)
    assert sorted(Job.objects.values_list("id", "status", "cancel_requested_at")) == before
    assert len(before) == len(pending) + len(dead)


@pytest.mark.slow
def test_process__cancel_reaches_a_running_task_within_a_second_despite_a_long_lease(
    transactional_db, manage, tmp_path
):
    """cancel() NOTIFYs; the worker's listener sets the task's flag at once, long before
    the next lease extension (a third of a 300 s lease). Counted cancelled, not done."""
    from tests.tasks import cooperative

    marker = tmp_path / "started"
    job = Job.objects.enqueue(cooperative, [str(marker), 120])
    worker = manage(*WORKER, "--lease-seconds", "300")
    wait_for(marker.exists, timeout=30)
    assert Job.objects.cancel([job.id]).requested == [job.id]
    requested = time.monotonic()
    wait_for(lambda: fresh(job).status == "cancelled", timeout=5, interval=0.02)
    elapsed = time.monotonic() - requested
    worker.signal(15)
    assert worker.wait() == 0, worker.output()
    assert fresh(job).result == "stopped"
    assert elapsed < 1.5, f"cancel took {elapsed:.2f}s to reach the task"
    assert "stopped: done=0 failed=0 cancelled=1" in worker.output()
