"""Soft time limits (``worker/limits.py``): ``SoftTimeLimitExceeded`` raised inside a
task that ran too long, through real ``pgqueue_worker`` processes for sync and
coroutine tasks, and the options' validation."""

from __future__ import annotations

import signal
import time

import pytest
from django.test import override_settings
from django.urls import reverse

from django_pgqueue import SoftTimeLimitExceeded
from django_pgqueue.exceptions import InvalidJob
from django_pgqueue.models import Job, WorkerProcess
from django_pgqueue.taskapi import InvalidTask, task
from django_pgqueue.worker.limits import SoftLimit, soft_limit
from testproject.demo.tasks import add
from tests import tasks
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

WORKER = ("pgqueue_worker", "--poll-interval", "0.1", "--concurrency", "2")


def fresh(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def ended(job: Job) -> bool:
    return fresh(job).status in ("done", "dead", "cancelled")


def soft_failure(job: Job) -> dict:
    row = fresh(job)
    assert row.status == "dead", row.status
    assert row.errors[-1]["exception_class_path"] == (
        "django_pgqueue.exceptions.SoftTimeLimitExceeded"
    ), row.errors
    return row.errors[-1]


@pytest.mark.slow
@pytest.mark.parametrize("processes", [1, 2])
def test_soft_limit__a_busy_loop_fails_within_2s_and_the_worker_runs_the_next_job(
    manage, processes
):
    """Sync (thread) and coroutine tasks with soft_time_limit=1: the attempt fails with
    SoftTimeLimitExceeded within 2 s of its start; the same worker then runs more."""
    args = [*WORKER] + (["--processes", str(processes)] if processes > 1 else [])
    manage(*args)
    busy = Job.objects.enqueue(tasks.busy_loop, [30])
    waiting = Job.objects.enqueue(tasks.async_busy_wait, [30])
    wait_for(lambda: ended(busy) and ended(waiting), timeout=30)
    for job in (busy, waiting):
        soft_failure(job)
        row = fresh(job)
        assert (row.finished_at - row.started_at).total_seconds() < 2.0
    after = Job.objects.enqueue(add, [1, 2])
    wait_for(lambda: ended(after), timeout=20)
    assert fresh(after).status == "done"


@pytest.mark.slow
def test_soft_limit__per_enqueue_override_and_cleanup(manage, tmp_path):
    """enqueue(soft_time_limit=) applies to a task without the option; the task may
    catch the exception to clean up, and re-raising it fails the attempt."""
    manage(*WORKER)
    marker = tmp_path / "cleaned"
    job = Job.objects.enqueue(tasks.cleans_up_on_soft_limit, [str(marker)], soft_time_limit=0.5)
    assert fresh(job).soft_time_limit == 0.5
    wait_for(lambda: ended(job), timeout=20)
    soft_failure(job)
    assert marker.read_text() == "cleaned up"


def test_soft_limit__the_setting_is_the_default():
    job = Job(soft_time_limit=None)
    assert soft_limit(job, None) is None
    assert soft_limit(job, 3.0) == 3.0
    assert soft_limit(Job(soft_time_limit=2.0), 3.0) == 2.0
    with override_settings(PGQUEUE_SOFT_TIME_LIMIT=7):
        assert soft_limit(job, None) == 7.0


def test_soft_limit__raised_in_the_thread_then_never_after_the_block():
    """In process: the asynchronous exception lands in the guarded loop; once the block
    is left nothing more is raised, even with the timer due."""
    started = time.monotonic()
    with pytest.raises(SoftTimeLimitExceeded, match="soft time limit"):
        with SoftLimit(0.2):
            while True:
                pass
    assert 0.2 <= time.monotonic() - started < 1.0
    with SoftLimit(0.05):
        pass
    deadline = time.monotonic() + 0.2
    while time.monotonic() < deadline:  # would raise here if the timer still fired
        pass


def test_soft_limit__bad_values_are_named():
    with pytest.raises(InvalidJob, match="soft_time_limit must be a number of seconds"):
        Job.objects.enqueue(add, [1, 2], soft_time_limit=-1)
    with pytest.raises(InvalidJob, match="soft_time_limit must be a number of seconds"):
        Job.objects.enqueue(add, [1, 2], soft_time_limit="10")
    assert not Job.objects.exists()
    with pytest.raises(InvalidTask, match="soft_time_limit must be a number of seconds"):
        task(soft_time_limit=0)(lambda: None)


@pytest.mark.slow
@pytest.mark.parametrize("processes", [1, 2])
def test_hard_limit__a_job_sleeping_in_c_fails_and_the_process_is_replaced(manage, processes):
    """A 60 s sleep in C (``time.sleep``) with time_limit=2: recorded failed with
    TimeLimitExceeded within 4 s of its claim, the worker process replaced (supervisor's
    child restarted, or the one process re-executed with the same pid), and a job
    enqueued after runs."""
    args = [*WORKER, "--concurrency", "1"] + (
        ["--processes", str(processes)] if processes > 1 else []
    )
    worker = manage(*args)
    # A sync task on a thread slot and a coroutine blocking the event loop.
    for hung_task in (tasks.sleeps_in_c, tasks.async_sleeps_in_c):
        hung = Job.objects.enqueue(hung_task, [60])
        wait_for(lambda hung=hung: ended(hung), timeout=30)
        row = fresh(hung)
        assert row.status == "dead"
        assert row.errors[-1]["exception_class_path"] == (
            "django_pgqueue.exceptions.TimeLimitExceeded"
        ), row.errors
        assert (row.finished_at - row.last_attempted_at).total_seconds() < 4.0
    after = Job.objects.enqueue(add, [1, 2])
    wait_for(lambda: ended(after), timeout=30)
    assert fresh(after).status == "done"
    expected = "replaced (a job past its time limit" if processes > 1 else "time limit of 2s"
    wait_for(lambda: expected in worker.output(), timeout=5)
    assert worker.popen.poll() is None  # (the one process: execv keeps its pid)
    # A new process started for each: the one process's start-up lines, or new children.
    wait_for(lambda: worker.output().count(" starting: database=") == processes + 2, timeout=20)


@pytest.mark.slow
def test_hard_limit__the_process_other_jobs_are_released_without_charge(manage, tmp_path):
    """A job running beside the one past its limit is given back unrun-charged (its
    attempt not counted) and then runs to completion in the replacement."""
    worker = manage(*WORKER, "--concurrency", "2")
    marker = tmp_path / "started"
    beside = Job.objects.enqueue(tasks.sleep_after_marking, [str(marker), 3], max_attempts=1)
    hung = Job.objects.enqueue(tasks.sleeps_in_c, [60])
    wait_for(marker.exists, timeout=20)
    wait_for(lambda: ended(hung), timeout=30)
    assert fresh(hung).status == "dead"
    # max_attempts=1: only an uncharged release lets it run again and succeed.
    wait_for(lambda: ended(beside), timeout=30)
    row = fresh(beside)
    assert (row.status, row.attempts) == ("done", 1), (row.status, row.errors, worker.output())


@pytest.mark.slow
@pytest.mark.parametrize("processes", [1, 2])
def test_max_memory__a_worker_over_it_is_recycled_and_the_jobs_after_finish(manage, processes):
    """A task keeping 200 MB alive on --max-memory 150: the process stops claiming,
    finishes, and is replaced; the 50 jobs after it all finish."""
    args = [*WORKER, "--max-memory", "150"] + (
        ["--processes", str(processes)] if processes > 1 else []
    )
    worker = manage(*args)
    big = Job.objects.enqueue(tasks.keeps_memory, [200])
    wait_for(lambda: ended(big), timeout=30)
    assert fresh(big).status == "done"
    wait_for(lambda: "is over --max-memory 150 MB" in worker.output(), timeout=20)
    after = [Job.objects.enqueue(add, [n, n]) for n in range(50)]
    wait_for(
        lambda: Job.objects.filter(pk__in=[j.pk for j in after], status="done").count() == 50,
        timeout=60,
    )
    # A new process started: the one process's second start-up line, or a new child.
    wait_for(lambda: worker.output().count(" starting: database=") == processes + 1, timeout=20)
    assert worker.popen.poll() is None
    # The workers table (pgqueue_status, the workers page) shows its RSS and restarts.
    rows = wait_for(
        lambda: (
            sorted(WorkerProcess.objects.values_list("restarts", flat=True))
            == [0] * (processes - 1) + [1]
            and list(WorkerProcess.objects.values_list("rss_bytes", flat=True))
        ),
        timeout=20,
    )
    assert all(rss and rss > 10 * 2**20 for rss in rows)
    status = manage("pgqueue_status")
    assert status.wait() == 0
    assert " MB" in status.output() and "restarts" in status.output()


@pytest.mark.slow
def test_hard_limit__a_sigkill_of_the_replacement_loses_nothing(manage, tmp_path):
    """The re-executed process, SIGKILLed while it runs a job: the job's lease expires,
    the sweeper gives it back, another worker runs it; every job ends."""
    worker = manage(*WORKER, "--lease-seconds", "1")
    hung = Job.objects.enqueue(tasks.sleeps_in_c, [60])
    wait_for(lambda: ended(hung), timeout=30)
    wait_for(lambda: worker.output().count(" starting: database=") == 2, timeout=20)
    marker = tmp_path / "started"
    job = Job.objects.enqueue(tasks.sleep_after_marking, [str(marker), 2])
    wait_for(marker.exists, timeout=20)
    worker.signal(signal.SIGKILL)
    worker.wait()
    assert fresh(job).status == "running"
    manage("pgqueue_sweep", "--loop", "--interval", "0.5")
    manage(*WORKER, "--lease-seconds", "1")
    wait_for(lambda: ended(job), timeout=40)
    assert fresh(job).status == "done" and fresh(hung).status == "dead"
    assert not Job.objects.exclude(status__in=("done", "dead")).exists()


def test_time_limits__shown_on_the_jobs_page(admin_client):
    job = Job.objects.enqueue(add, [1, 2], soft_time_limit=7.5, time_limit=12)
    page = admin_client.get(reverse("admin:django_pgqueue_job_change", args=[job.id]))
    assert page.status_code == 200
    text = page.content.decode()
    assert "Soft time limit" in text and "7.5" in text
    assert "Time limit" in text and "12.0" in text


def test_soft_limit__a_coroutine_run_on_a_thread_slot_is_cancelled_at_it():
    """A coroutine task run on a thread slot (here testing.run_jobs; also a
    transactional one, or --async-concurrency 0) has its soft limit too: cancelled at
    1 s, the attempt fails with SoftTimeLimitExceeded (it ran its 30 s before)."""
    from django_pgqueue.testing import run_jobs

    job = Job.objects.enqueue(tasks.async_busy_wait, [30])
    started = time.monotonic()
    run_jobs()
    assert time.monotonic() - started < 5
    assert "soft time limit of 1s" in str(soft_failure(job))


@pytest.mark.slow
def test_hard_limit__a_job_done_beside_it_is_recorded_not_run_again(manage, tmp_path):
    """A job that finished beside the one past its hard limit, its completion still
    held by the batched completer (a 30 s flush interval here), is recorded done
    before the process is replaced: it was given back and ran a second time."""
    ledger = tmp_path / "ledger"
    worker = manage(*WORKER, "--concurrency", "2", env={"PGQUEUE_COMPLETION_FLUSH_INTERVAL": "30"})
    hung = Job.objects.enqueue(tasks.sleeps_in_c, [60])
    wait_for(lambda: fresh(hung).status == "running", timeout=20)
    beside = Job.objects.enqueue(tasks.noted, [str(ledger), "ran"])
    wait_for(ledger.exists, timeout=20)
    wait_for(lambda: ended(hung), timeout=30)
    # Given back, it would run again in the replacement (and be held there 30 s).
    wait_for(lambda: ended(beside), timeout=20)
    row = fresh(beside)
    assert (row.status, row.attempts) == ("done", 1), (row.status, worker.output())
    assert ledger.read_text() == "ran\n"


@pytest.mark.slow
@pytest.mark.parametrize("processes", [1, 2])
def test_hard_limit__the_replacement_keeps_its_given_worker_id(manage, processes):
    """With --worker-id, the process that replaces one past its hard limit (the same
    pid re-executed, or the supervisor's new child) is not refused its own id as held
    by a live process: it registers and runs the next job."""
    args = [*WORKER, "--concurrency", "1", "--worker-id", "fixed"] + (
        ["--processes", str(processes)] if processes > 1 else []
    )
    worker = manage(*args)
    wait_for(lambda: WorkerProcess.objects.count() == processes, timeout=20)
    before = sorted(WorkerProcess.objects.values_list("id", flat=True))
    hung = Job.objects.enqueue(tasks.sleeps_in_c, [60])
    wait_for(lambda: ended(hung), timeout=30)
    wait_for(lambda: worker.output().count(" starting: database=") == processes + 1, timeout=20)
    after = [Job.objects.enqueue(add, [n, n]) for n in range(2 * processes)]
    wait_for(lambda: all(ended(job) for job in after), timeout=30)
    assert "is held by" not in worker.output(), worker.output()
    assert worker.popen.poll() is None
    ids = wait_for(
        lambda: sorted(WorkerProcess.objects.values_list("id", flat=True)) == before, timeout=10
    )
    assert ids and all(i.startswith("fixed") for i in before), before


@pytest.mark.slow
def test_hard_limit__no_job_is_claimed_while_the_process_is_being_replaced(manage, tmp_path):
    """Jobs claimed without a pause beside the one past its hard limit: claims close
    before the held jobs are read and given back, so none is claimed by the process
    that is going away (it stayed running, leased to it, until its lease expired)."""
    worker = manage(*WORKER, "--concurrency", "4")
    hung = Job.objects.enqueue(tasks.sleeps_in_c, [60])
    wait_for(lambda: fresh(hung).status == "running", timeout=20)
    from django_pgqueue.bulk import enqueue_many

    assert enqueue_many(tasks.busy_loop, [((0.02,), {})] * 400) == 400
    wait_for(lambda: ended(hung), timeout=30)
    quick = Job.objects.exclude(pk=hung.pk)
    wait_for(lambda: quick.filter(status="done").count() == 400, timeout=40)
    assert "time limit of 2s" in worker.output()


@pytest.mark.slow
def test_hard_limit__a_task_holding_its_job_row_locked_is_still_ended(manage):
    """A cursor saved inside the task's transaction locks the job's row FOR SHARE until
    the commit; the task then hangs in C. The runner's session is ended first, so the
    failure is recorded and the process replaced (the fail write waited for good)."""
    worker = manage(*WORKER, "--concurrency", "1")
    hung = Job.objects.enqueue(tasks.saves_then_sleeps_in_a_transaction, [60])
    wait_for(lambda: ended(hung), timeout=20)
    row = fresh(hung)
    assert row.status == "dead"
    assert row.errors[-1]["exception_class_path"] == (
        "django_pgqueue.exceptions.TimeLimitExceeded"
    ), row.errors
    assert not row.steps.exists()  # the cursor's save rolled back with the transaction
    after = Job.objects.enqueue(add, [1, 2])
    wait_for(lambda: ended(after), timeout=30)
    assert fresh(after).status == "done", worker.output()
