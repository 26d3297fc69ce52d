"""What a task can say about itself, in-process: Snooze, Retry and ``@task(backoff=)``,
progress, and keys with a period (``unique_for``, ``debounce``). The end-to-end runs
through real worker processes are in test_lifecycle_process.py."""

from __future__ import annotations

import datetime as dt
import json
import re
import threading
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connections
from django.test import override_settings
from django.urls import reverse

from django_pgqueue import InvalidJob, LeaseLost, Retry, Snooze, db, enqueue_many, lifecycle, sql
from django_pgqueue.exceptions import MAX_DELAY_SECONDS
from django_pgqueue.models import Job, JobKey
from django_pgqueue.sweeper import sweep
from django_pgqueue.taskapi import InvalidTask, TaskResultStatus, default_task_backend
from django_pgqueue.tasks import PgQueueTask
from testproject.demo.models import Delivery
from tests import tasks

SECOND = dt.timedelta(seconds=1)


def claim(job: Job, now: dt.datetime | None = None) -> Job:
    (claimed,) = Job.objects.claim("w1", limit=1, now=now)
    assert claimed.id == job.id
    return claimed


def fresh(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


# --- Snooze -------------------------------------------------------------------------


def test_lifecycle__snooze_and_retry_refuse_bad_delays():
    for bad in (-1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="finite and >= 0"):
            Snooze(bad)
    for bad in ("3", None, True):
        with pytest.raises(TypeError, match="number of seconds or a timedelta"):
            Retry(bad)  # type: ignore[arg-type]
    for bad in (1e300, 1e13, MAX_DELAY_SECONDS + 1, dt.timedelta(days=3660 * 2)):
        with pytest.raises(ValueError, match=r"at most 315360000 \(ten years\)"):
            Snooze(bad)
        with pytest.raises(ValueError, match="at most 315360000"):
            Retry(bad)
    assert Snooze(MAX_DELAY_SECONDS).seconds == MAX_DELAY_SECONDS
    assert Snooze(dt.timedelta(minutes=1)).seconds == 60.0
    assert str(Retry(2, reason="busy")) == "retry in 2s: busy"


def test_lifecycle__snoozes_give_the_attempt_back_and_are_no_failure(run_worker, tmp_path):
    ledger = tmp_path / "runs"
    job = Job.objects.enqueue(tasks.snooze_twice, [str(ledger), 0])
    assert job.max_attempts == 1
    worker = run_worker()
    done = fresh(job)
    assert (done.status, done.result, done.errors) == ("done", 3, [])
    assert (done.attempts, done.snoozes) == (1, 2)
    assert worker.stats.snoozed == 2 and worker.stats.failed == 0


def test_lifecycle__too_many_snoozes_fail_the_job_once(run_worker):
    job = Job.objects.enqueue(tasks.snooze_forever, max_attempts=5)
    with override_settings(PGQUEUE_MAX_SNOOZES=2):
        run_worker()
    dead = fresh(job)
    assert (dead.status, dead.snoozes, dead.attempts) == ("dead", 2, 1)
    (error,) = dead.errors
    assert error["exception_class_path"] == "django_pgqueue.exceptions.SnoozeLimitExceeded"
    assert "PGQUEUE_MAX_SNOOZES = 2" in error["traceback"]


def test_lifecycle__a_transactional_tasks_snooze_rolls_its_effects_back(run_worker):
    job = Job.objects.enqueue(tasks.snooze_after_writing, ["tx-snooze"])
    run_worker()
    done = fresh(job)
    assert (done.status, done.snoozes, done.errors) == ("done", 1, [])
    assert done.result == 1  # the first run's row rolled back
    assert list(Delivery.objects.values_list("job_id", flat=True)) == [job.id * 10 + 1]


@pytest.mark.django_db
def test_lifecycle__snooze_is_fenced_and_scheduled_by_the_database_clock(job_factory, now):
    job = claim(job_factory(), now=now)
    params = {
        "id": job.id,
        "worker_id": "w2",  # not the owner
        "attempt": job.attempts,
        "claimed_at": job.last_attempted_at,
        "seconds": 30.0,
        "channel": "pgqueue_job",
        "now": now,
    }
    assert db.rows("default", sql.JOB_SNOOZE, params) == []
    assert fresh(job).status == "running"
    assert db.rows("default", sql.JOB_SNOOZE, {**params, "worker_id": "w1"}) == [("scheduled",)]
    snoozed = fresh(job)
    assert (snoozed.status, snoozed.attempts, snoozed.snoozes) == ("scheduled", 0, 1)
    assert snoozed.run_at == now + 30 * SECOND
    assert snoozed.lease_owner is None and snoozed.errors == []


@pytest.mark.django_db
def test_lifecycle__a_snooze_after_a_cancel_request_ends_cancelled(job_factory, now):
    job = claim(job_factory(), now=now)
    Job.objects.cancel([job.id], now=now)
    params = {
        "id": job.id,
        "worker_id": "w1",
        "attempt": 1,
        "seconds": 5.0,
        "channel": "pgqueue_job",
        "now": now,
    }
    params["claimed_at"] = job.last_attempted_at
    assert db.rows("default", sql.JOB_SNOOZE, params) == [("cancelled",)]
    cancelled = fresh(job)
    assert cancelled.errors[-1]["exception_class_path"].endswith("JobCancelled")
    assert "snoozed" in cancelled.errors[-1]["traceback"]


@pytest.mark.django_db
def test_manager__snooze_and_progress_are_transitions_of_job_objects(job_factory, now):
    """``Job.objects.snooze`` and ``set_progress`` are the task's own writes, fenced as
    the worker's are: another worker's call changes nothing."""
    job = claim(job_factory(), now=now)
    with pytest.raises(LeaseLost):
        Job.objects.set_progress(job, "w2", 1)
    Job.objects.set_progress(job, "w1", {"step": 2})
    assert fresh(job).progress == {"step": 2}
    assert Job.objects.snooze(job, "w2", 30.0, now=now) is None
    assert fresh(job).status == "running"
    assert Job.objects.snooze(job, "w1", 30.0, now=now) == "scheduled"
    snoozed = fresh(job)
    assert (snoozed.status, snoozed.attempts, snoozed.snoozes) == ("scheduled", 0, 1)
    assert snoozed.run_at == now + 30 * SECOND


# --- Retry and backoff --------------------------------------------------------------


@pytest.mark.django_db
def test_lifecycle__retry_waits_exactly_its_delay_and_counts_the_attempt(job_factory, now):
    job = claim(job_factory(max_attempts=2), now=now)
    assert Job.objects.fail(job, "w1", Retry(30, reason="later"), now=now) == "scheduled"
    retried = fresh(job)
    assert retried.run_at == now + 30 * SECOND  # no jitter, not the backoff
    assert retried.attempts == 1
    assert retried.errors[-1]["exception_class_path"] == "django_pgqueue.exceptions.Retry"
    assert "retry in 30s: later" in retried.errors[-1]["traceback"]
    # On the last attempt a Retry is a failure like any: dead.
    Job.objects.filter(pk=job.pk).update(status="pending", run_at=now)
    job = claim(job, now=now + 31 * SECOND)
    assert Job.objects.fail(job, "w1", Retry(30), now=now + 31 * SECOND) == "dead"


@pytest.mark.django_db
def test_lifecycle__task_backoff_computes_the_delay_from_the_attempt(job_factory, now):
    job = claim(job_factory(task=tasks.fail_with_backoff, args=[]), now=now)
    assert Job.objects.fail(job, "w1", ValueError("x"), now=now) == "scheduled"
    assert fresh(job).run_at == now + 7 * SECOND
    Job.objects.filter(pk=job.pk).update(status="pending")
    job = claim(job, now=now + 8 * SECOND)
    Job.objects.fail(job, "w1", ValueError("x"), now=now + 8 * SECOND)
    assert fresh(job).run_at == now + 8 * SECOND + 14 * SECOND


def test_lifecycle__backoff_must_be_callable():
    with pytest.raises(InvalidTask, match="backoff must be a callable"):
        PgQueueTask(
            priority=0,
            func=tasks._renamed,
            queue_name="default",
            backend="default",
            takes_context=False,
            run_after=None,
            backoff=3,  # type: ignore[arg-type]
        )


@pytest.mark.django_db
def test_lifecycle__a_failing_backoff_falls_back_to_the_default(job_factory, now, caplog):
    job = claim(job_factory(task=tasks.fail_with_broken_backoff, args=[]), now=now)
    assert lifecycle.retry_plan(job, ValueError("x"), True) == (True, None)
    assert "using the default backoff" in caplog.text
    assert Job.objects.fail(job, "w1", ValueError("x"), now=now) == "scheduled"
    assert now + SECOND <= fresh(job).run_at <= now + 3 * SECOND  # base 2 s, jitter


# --- progress -----------------------------------------------------------------------


@pytest.mark.django_db
def test_lifecycle__progress_is_fenced_bounded_and_kept(job_factory, now):
    job = claim(job_factory(), now=now)
    fence = ("default", job.id, "w1", job.attempts, job.last_attempted_at)
    lifecycle.set_progress(*fence, {"done": 3, "of": 10})
    assert fresh(job).progress == {"done": 3, "of": 10}
    with pytest.raises(LeaseLost):
        lifecycle.set_progress("default", job.id, "w2", job.attempts, job.last_attempted_at, 1)
    with pytest.raises(InvalidJob, match="JSON-serialisable"):
        lifecycle.set_progress(*fence, {"at": object()})
    # Issue 28 item 18: what is wrong, not "not JSON-serialisable" about a return value.
    with pytest.raises(InvalidJob, match=r"^progress cannot be stored: progress contains a NUL"):
        lifecycle.set_progress(*fence, "\x00")
    with pytest.raises(InvalidJob, match=r"^progress cannot be stored: progress\['a'\] contains"):
        lifecycle.set_progress(*fence, {"a": "\ud800"})
    with override_settings(PGQUEUE_MAX_PROGRESS_BYTES=20), pytest.raises(InvalidJob, match="20"):
        lifecycle.set_progress(*fence, "x" * 30)
    assert fresh(job).progress == {"done": 3, "of": 10}  # the bad ones changed nothing
    Job.objects.complete(job, "w1", result=1, now=now)
    assert fresh(job).progress == {"done": 3, "of": 10}


# --- unique_for ---------------------------------------------------------------------


def finish(job: Job, status: str = "done") -> None:
    Job.objects.filter(pk=job.pk).update(status=status, finished_at=job.created_at)


@pytest.mark.django_db
def test_lifecycle__unique_for_dedupes_inside_the_period_whatever_the_state(now):
    first = Job.objects.enqueue(tasks.echo, [1], idempotency_key="k", unique_for=60, now=now)
    for status in ("done", "dead"):
        finish(first, status)
        again = Job.objects.enqueue(
            tasks.echo, [2], idempotency_key="k", unique_for=60, now=now + 59 * SECOND
        )
        assert (again.id, again.status, again.args) == (first.id, status, [1])
    later = Job.objects.enqueue(
        tasks.echo, [3], idempotency_key="k", unique_for=60, now=now + 60 * SECOND
    )
    assert later.id != first.id and later.args == [3] and later.status == "pending"
    # A new window opened with the new job.
    assert (
        Job.objects.enqueue(
            tasks.echo, idempotency_key="k", unique_for=60, now=now + 119 * SECOND
        ).id
        == later.id
    )
    assert Job.objects.filter(idempotency_key="k").count() == 2


@pytest.mark.django_db
def test_lifecycle__unique_window_survives_pruning_until_the_sweeper_ends_it(now):
    first = Job.objects.enqueue(
        tasks.echo, idempotency_key="p", unique_for=dt.timedelta(hours=1), now=now
    )
    Job.objects.filter(pk=first.pk).delete()  # pruned before its window closed
    stub = Job.objects.enqueue(tasks.echo, idempotency_key="p", unique_for=3600, now=now)
    assert (stub.id, stub.status) == (first.id, "done")
    assert not Job.objects.filter(pk=stub.pk).exists()
    assert sweep(now=now + 3599 * SECOND).keys == 0
    assert sweep(now=now + 3601 * SECOND).keys == 1
    assert not JobKey.objects.exists()


@pytest.mark.django_db
def test_lifecycle__a_live_job_keeps_its_key_after_the_window(now):
    first = Job.objects.enqueue(tasks.echo, idempotency_key="l", unique_for=10, now=now)
    plain = Job.objects.enqueue(tasks.echo, idempotency_key="l")
    assert plain.id == first.id  # without unique_for: unique among live jobs
    late = Job.objects.enqueue(
        tasks.echo, idempotency_key="l", unique_for=10, now=now + 11 * SECOND
    )
    assert late.id == first.id  # still pending: it wins, as without unique_for
    assert Job.objects.count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"unique_for": 5}, "needs an idempotency_key"),
        ({"idempotency_key": "k", "unique_for": 0}, "unique_for must be"),
        ({"idempotency_key": "k", "unique_for": "5"}, "unique_for must be"),
        ({"idempotency_key": "k", "debounce": -1}, "debounce must be"),
        ({"idempotency_key": "k", "debounce": 1, "unique_for": 1}, "not both"),
        ({"idempotency_key": "k", "debounce": 1, "run_at": dt.datetime.now(dt.UTC)}, "run_at"),
    ],
)
def test_lifecycle__bad_periods_are_refused_and_write_nothing(options, message):
    with pytest.raises(InvalidJob, match=message):
        Job.objects.enqueue(tasks.echo, **options)
    assert not Job.objects.exists() and not JobKey.objects.exists()


def concurrently(count: int, enqueue: Any) -> list[int]:
    """Run ``enqueue()`` on ``count`` threads at once, each on its own connection."""
    barrier = threading.Barrier(count)
    ids: list[int] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            barrier.wait(10)
            ids.append(enqueue().id)
        except BaseException as exc:  # re-raised below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    if errors:
        raise errors[0]
    assert len(ids) == count
    return ids


@pytest.mark.django_db(transaction=True)
def test_lifecycle__eight_concurrent_unique_enqueues_make_one_job():
    ids = concurrently(
        8, lambda: Job.objects.enqueue(tasks.echo, idempotency_key="c", unique_for=60)
    )
    assert len(set(ids)) == 1
    assert Job.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_lifecycle__eight_concurrent_unique_enqueues_around_a_finished_job(now):
    """Inside the period all eight get the finished job; after it, all eight get one new
    job (the upsert that opens the new period is taken once)."""
    first = Job.objects.enqueue(tasks.echo, [0], idempotency_key="f", unique_for=60, now=now)
    finish(first)

    def enqueue_at(seconds: int) -> list[int]:
        at = now + seconds * SECOND
        return concurrently(
            8,
            lambda: Job.objects.enqueue(
                tasks.echo, [seconds], idempotency_key="f", unique_for=60, now=at
            ),
        )

    assert set(enqueue_at(59)) == {first.id}
    (new_id,) = set(enqueue_at(61))
    assert new_id != first.id
    assert Job.objects.get(pk=new_id).args == [61]
    assert Job.objects.count() == 2


# --- debounce -----------------------------------------------------------------------


@pytest.mark.django_db
def test_lifecycle__debounce_moves_one_job_and_keeps_the_last_arguments(now):
    made = [
        Job.objects.enqueue(
            tasks.echo, [n], {"n": n}, idempotency_key="d", debounce=5, now=now + n * SECOND
        )
        for n in range(3)
    ]
    assert len({job.id for job in made}) == 1
    job = fresh(made[0])
    assert (job.args, job.kwargs, job.status) == ([2], {"n": 2}, "scheduled")
    assert job.run_at == now + 2 * SECOND + 5 * SECOND
    # Started: never changed; the next enqueue makes a new job.
    Job.objects.filter(pk=job.pk).update(status="pending", run_at=now)
    claim(job, now=now + 8 * SECOND)
    after = Job.objects.enqueue(
        tasks.echo, [9], idempotency_key="d", debounce=5, now=now + 9 * SECOND
    )
    assert after.id != job.id and after.args == [9]
    assert fresh(job).args == [2]
    # A key whose job started is pruned by the sweeper once its time passed.
    Job.objects.filter(pk=after.pk).update(status="done")
    assert sweep(now=now + 20 * SECOND).keys == 1


@pytest.mark.django_db(transaction=True)
def test_lifecycle__eight_concurrent_debounced_enqueues_make_one_job():
    ids = concurrently(
        8, lambda: Job.objects.enqueue(tasks.echo, [1], idempotency_key="dc", debounce=30)
    )
    assert len(set(ids)) == 1
    assert Job.objects.count() == 1


# --- bulk ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_lifecycle__bulk_enqueue_and_enqueue_many_take_periods(now):
    first = Job.objects.enqueue(tasks.echo, [0], idempotency_key="u", unique_for=60, now=now)
    finish(first)
    result = Job.objects.bulk_enqueue(
        [
            {"task": tasks.echo, "args": [1]},
            {"task": tasks.echo, "args": [2], "idempotency_key": "u", "unique_for": 60},
            {"task": tasks.echo, "args": [3], "idempotency_key": "d", "debounce": 5},
            {"task": tasks.echo, "args": [4], "idempotency_key": "d", "debounce": 5},
        ],
        now=now + SECOND,
    )
    assert (result.created, result.skipped) == (2, 2)
    debounced = Job.objects.get(task=tasks.echo.module_path, status="scheduled")
    assert (debounced.args, debounced.run_at) == ([4], now + 6 * SECOND)
    assert Job.objects.get(pk=first.pk).args == [0]
    many = enqueue_many(
        tasks.echo,
        [([5], {}, {"idempotency_key": "d", "debounce": 5}), ([6], {})],
    )
    assert (many.created, many.skipped) == (1, 1)
    assert Job.objects.get(pk=debounced.pk).args == [5]
    with pytest.raises(InvalidJob, match="job #1: debounce must be"):
        Job.objects.bulk_enqueue(
            [{"task": tasks.echo}, {"task": tasks.echo, "idempotency_key": "x", "debounce": 0}]
        )
    with pytest.raises(
        InvalidJob, match="job #0: options must be a mapping of concurrency_key, debounce"
    ):
        enqueue_many(tasks.echo, [([], {}, {"priority": 3})])
    assert Job.objects.count() == 4  # first, [1], the debounced one, [6]


# --- where progress and snoozes are seen --------------------------------------------


@pytest.mark.django_db
def test_lifecycle__status_json_and_admin_show_progress_and_snoozes(job_factory, admin_client):
    job = claim(job_factory())
    lifecycle.set_progress("default", job.id, "w1", 1, job.last_attempted_at, {"rows": 41})
    Job.objects.filter(pk=job.pk).update(snoozes=3)
    out = StringIO()
    call_command("pgqueue_status", "--json", stdout=out)
    (running,) = json.loads(out.getvalue())["running"]
    assert (running["id"], running["worker_id"], running["progress"]) == (
        job.id,
        "w1",
        {"rows": 41},
    )
    page = admin_client.get(reverse("admin:django_pgqueue_job_change", args=[job.id]))
    text = page.content.decode()
    assert "&quot;rows&quot;: 41" in text or '"rows": 41' in text, text[:2000]
    snoozes = re.search(r'field-snoozes">.*?<div class="readonly">([^<]*)</div>', text, re.S)
    assert snoozes is not None and snoozes[1] == "3", text[:2000]


@pytest.mark.django_db
def test_lifecycle__task_results_of_snoozed_and_retried_jobs_are_ready(job_factory, now):
    snoozed = claim(job_factory(), now=now)
    params = {
        "id": snoozed.id,
        "worker_id": "w1",
        "attempt": 1,
        "seconds": 5.0,
        "channel": "pgqueue_job",
        "now": now,
    }
    db.rows("default", sql.JOB_SNOOZE, {**params, "claimed_at": snoozed.last_attempted_at})
    result = default_task_backend.get_result(str(snoozed.id))
    assert (result.status, result.errors) == (TaskResultStatus.READY, [])
    retried = claim(job_factory(), now=now)
    Job.objects.fail(retried, "w1", Retry(5, reason="later"), now=now)
    result = default_task_backend.get_result(str(retried.id))
    assert result.status == TaskResultStatus.READY
    assert [e.exception_class_path for e in result.errors] == ["django_pgqueue.exceptions.Retry"]
