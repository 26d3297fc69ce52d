"""What a task can say about itself, end to end through a real ``pgqueue_worker``
process: snooze, Retry's own delay, unique_for, debounce and progress, each for a plain
and a coroutine task. One worker per test, several jobs at once, to keep CI short."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from django.db import connection

from django_pgqueue.models import Job
from tests import tasks
from tests.conftest import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TIMEOUT = "django_pgqueue.exceptions.JobTimeout"
WORKER = ("pgqueue_worker", "--poll-interval", "0.1", "--concurrency", "4")


def fresh(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def finished(*jobs: Job) -> bool:
    return all(fresh(job).status in ("done", "dead", "cancelled") for job in jobs)


def db_now() -> dt.datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def claims(ledger: Path) -> list[dt.datetime]:
    return [dt.datetime.fromisoformat(line) for line in ledger.read_text().splitlines()]


def test_lifecycle_process__snooze_and_retry(manage, tmp_path):
    """Two snoozes of a max_attempts=1 job, then done: three runs, no error. Retry(3)
    waits at least 3 s of database time though the backoff would say about 2 s, and
    counts an attempt."""
    snoozers = {
        task: Job.objects.enqueue(task, [str(tmp_path / f"snooze-{i}"), 0.3])
        for i, task in enumerate((tasks.snooze_twice, tasks.async_snooze_twice))
    }
    retriers = {
        task: Job.objects.enqueue(task, [str(tmp_path / f"retry-{i}"), 3])
        for i, task in enumerate((tasks.retry_once, tasks.async_retry_once))
    }
    worker = manage(*WORKER)
    wait_for(lambda: finished(*snoozers.values(), *retriers.values()), timeout=30)
    for i, job in enumerate(snoozers.values()):
        done = fresh(job)
        assert (done.status, done.result, done.errors) == ("done", 3, []), worker.output()
        assert (done.attempts, done.max_attempts, done.snoozes) == (1, 1, 2)
        runs = claims(tmp_path / f"snooze-{i}")
        assert len(runs) == 3
        assert all(
            b - a >= dt.timedelta(seconds=0.3) for a, b in zip(runs, runs[1:], strict=False)
        )
    for i, job in enumerate(retriers.values()):
        done = fresh(job)
        assert (done.status, done.result, done.attempts) == ("done", 2, 2), worker.output()
        (error,) = done.errors
        assert error["exception_class_path"] == "django_pgqueue.exceptions.Retry"
        first, second = claims(tmp_path / f"retry-{i}")
        assert second - first >= dt.timedelta(seconds=3)
    assert "snoozed for 0.3s" in worker.output()


def test_lifecycle_process__unique_for_debounce_and_progress(manage, tmp_path):
    """unique_for dedupes against a finished job inside its period, not after it;
    three quick debounced enqueues run once with the last arguments; progress is seen
    while the job runs and kept after."""
    worker = manage(*WORKER)
    pairs = [(tasks.echo, tasks.report_progress), (tasks.async_echo, tasks.async_report_progress)]
    for i, (echo, progress_task) in enumerate(pairs):
        # Inside the period: a period far longer than the worker can take to start and
        # run the job (a 2 s one was over before a loaded CI machine's worker had run it).
        key = f"unique-{i}"
        first = Job.objects.enqueue(echo, [1], idempotency_key=key, unique_for=120)
        wait_for(lambda first=first: fresh(first).status == "done", timeout=20)
        again = Job.objects.enqueue(echo, [2], idempotency_key=key, unique_for=120)
        assert (again.id, again.status) == (first.id, "done")
        assert db_now() < fresh(first).created_at + dt.timedelta(seconds=120)
        # After the period: another key with a 1 s period, waited out in database time.
        brief_key = f"brief-{i}"
        brief = Job.objects.enqueue(echo, [3], idempotency_key=brief_key, unique_for=1)
        wait_for(lambda brief=brief: fresh(brief).status == "done", timeout=20)
        wait_for(lambda brief=brief: db_now() >= fresh(brief).created_at + dt.timedelta(seconds=1))
        later = Job.objects.enqueue(echo, [4], idempotency_key=brief_key, unique_for=1)
        assert later.id != brief.id
        wait_for(lambda later=later: fresh(later).status == "done", timeout=20)
        assert fresh(later).result == {"args": [4], "kwargs": {}}

        # Three enqueues take milliseconds; 1.5 s leaves a loaded machine room for them.
        debounced = [
            Job.objects.enqueue(echo, [n], {"n": n}, idempotency_key=f"d-{i}", debounce=1.5)
            for n in range(3)
        ]
        assert len({job.id for job in debounced}) == 1
        wait_for(lambda job=debounced[0]: fresh(job).status == "done", timeout=20)
        ran = fresh(debounced[0])
        assert (ran.result, ran.attempts) == ({"args": [2], "kwargs": {"n": 2}}, 1)
        # first, brief, later and the debounced one
        assert Job.objects.filter(task=echo.module_path).count() == 4

        marker, gate = tmp_path / f"started-{i}", tmp_path / f"gate-{i}"
        job = Job.objects.enqueue(progress_task, [str(marker), str(gate)])
        wait_for(marker.exists, timeout=20)
        running = fresh(job)
        assert (running.status, running.progress) == ("running", {"done": 1, "of": 2})
        gate.write_text("go")
        wait_for(lambda job=job: fresh(job).status == "done", timeout=20)
        assert fresh(job).progress == {"done": 2, "of": 2}, worker.output()


def test_lifecycle_process__a_delay_no_timestamp_holds_is_the_jobs_failure(manage):
    """Issue 28 item 16: Retry(1e300), Snooze(1e13) (plain and coroutine) and a backoff
    of 1e300 s used to fail the worker's write (DataError: timestamp out of range) and
    leave the job running, its concurrency slot held, until its lease expired. Refused
    when raised, like Snooze(-1): the job's own failure; a bad backoff falls back to the
    default one."""
    delays = [
        Job.objects.enqueue(task, [kind, seconds])
        for task in (tasks.huge_delay, tasks.async_huge_delay)
        for kind, seconds in (("snooze", 1e13), ("retry", 1e300))
    ]
    backoff = Job.objects.enqueue(tasks.fail_with_huge_backoff)
    worker = manage(*WORKER, env={"PGQUEUE_RETRY_BACKOFF_BASE": "0"})
    wait_for(lambda: finished(*delays, backoff), timeout=30)
    for job in delays:
        row = fresh(job)
        assert (row.status, row.attempts) == ("dead", 1), worker.output()
        (error,) = row.errors
        assert error["exception_class_path"] == "builtins.ValueError"
        assert "must be at most 315360000 (ten years)" in error["traceback"]
    row = fresh(backoff)
    assert (row.status, row.attempts, len(row.errors)) == ("dead", 2, 2), worker.output()
    assert "internal error" not in worker.output()
    assert "using the default backoff" in worker.output()


def test_lifecycle_process__a_plain_task_returning_after_its_timeout_timed_out(manage):
    """Issue 28 item 8: @task(timeout=0.3) on a plain task returning after 0.8 s, well
    inside its lease: each attempt is recorded as timed out (JobTimeout, retried), not
    done; a transactional one's effects roll back."""
    from testproject.demo.models import Delivery

    late = Job.objects.enqueue(tasks.returns_late)
    tx = Job.objects.enqueue(tasks.delivers_late, ["someone"])
    worker = manage(*WORKER, env={"PGQUEUE_RETRY_BACKOFF_BASE": "0"})
    wait_for(lambda: finished(late, tx), timeout=30)
    row = fresh(late)
    assert (row.status, row.attempts, row.result) == ("dead", 2, None), worker.output()
    assert [e["exception_class_path"] for e in row.errors] == [TIMEOUT, TIMEOUT]
    assert "past its timeout of 0.3s" in row.errors[0]["traceback"]
    row = fresh(tx)
    assert (row.status, row.attempts) == ("dead", 1), worker.output()
    assert row.errors[-1]["exception_class_path"] == TIMEOUT
    assert not Delivery.objects.filter(job_id=tx.id).exists()
