"""Durable steps end to end through real ``pgqueue_worker`` processes that die: a task
that SIGKILLs its own worker in the middle of a step is rescued by ``pgqueue_sweep``
and resumes at that step; a cursor loop killed three times processes each item once;
a durable sleep leaves the job scheduled, its attempt not spent."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from django_pgqueue.models import Job, JobStep
from testproject.demo.models import Execution
from tests import tasks
from tests.conftest import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

WORKER = ("pgqueue_worker", "--poll-interval", "0.1", "--lease-seconds", "1")
SWEEPER = ("pgqueue_sweep", "--loop", "--interval", "0.2")


def fresh(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def keep_workers(manage: Any, jobs: dict[str, Job], timeout: float) -> list[Any]:
    """One worker per job's queue, started again whenever it dies, until every job
    finished; the processes that ran (the dead ones first)."""
    started = {queue: manage(*WORKER, "--queue", queue) for queue in jobs}
    ran = list(started.values())

    def all_finished() -> bool:
        for queue, proc in started.items():
            if proc.popen.poll() is not None and fresh(jobs[queue]).status not in ("done", "dead"):
                started[queue] = manage(*WORKER, "--queue", queue)
                ran.append(started[queue])
        return all(fresh(job).status in ("done", "dead") for job in jobs.values())

    wait_for(all_finished, timeout=timeout, interval=0.1)
    return ran


def lines(path: Path) -> Counter[str]:
    return Counter(path.read_text().split())


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_steps_process__a_worker_killed_in_step_two_is_rescued_and_resumes_there(
    manage, tmp_path, kind
):
    """Each job kills its worker in step two after its ledger row: the sweeper rescues
    it, a new worker resumes at step two. Step one ran once, step three once. Plain,
    step two ran twice (its row twice: at least once). Transactional, the killed run's
    row rolled back with its step; the second run kills its worker again right after
    its commit, and the third skips the step: its row is there once."""
    task = tasks.three_steps if kind == "sync" else tasks.async_three_steps
    jobs = {}
    for mode in ("plain", "tx"):
        ledger, marker = tmp_path / f"{mode}.ledger", tmp_path / f"{mode}.killed"
        jobs[mode] = Job.objects.enqueue(
            task, [str(ledger), str(marker), mode == "tx"], queue=f"steps-{mode}"
        )
    sweeper = manage(*SWEEPER)
    ran = keep_workers(manage, {f"steps-{m}": job for m, job in jobs.items()}, timeout=60)
    output = "\n".join(proc.output() for proc in [*ran, sweeper])
    assert len(ran) == 5, output  # plain's worker died once, tx's twice
    for mode, job in jobs.items():
        done = fresh(job)
        assert (done.status, done.result) == ("done", ["one", 2, "three"]), output
        assert done.attempts == (2 if mode == "plain" else 3)
        assert (tmp_path / f"{mode}.killed").exists()
        assert (tmp_path / f"{mode}.killed.commit").exists() == (mode == "tx")
        assert lines(tmp_path / f"{mode}.ledger") == {"one": 1, "two": 2, "three": 1}
        rows = Execution.objects.filter(job_id=job.id, kind="two").count()
        assert rows == (2 if mode == "plain" else 1), mode
        assert [s.name for s in JobStep.objects.filter(job_id=job.id)] == ["one", "two", "three"]


def test_steps_process__a_cursor_loop_killed_three_times_processes_each_item_once(
    manage, tmp_path
):
    """10,000 items in chunks of 250, each chunk's rows and the cursor's save in one
    transaction; the worker is SIGKILLed after three chunks (once each): every item has
    exactly one row and the job returns 10,000."""
    job = Job.objects.enqueue(
        tasks.cursor_loop, [10_000, 250, [1000, 5000, 9750], str(tmp_path / "killed")]
    )
    sweeper = manage(*SWEEPER)
    ran = keep_workers(manage, {"default": job}, timeout=90)
    output = "\n".join(proc.output() for proc in [*ran, sweeper])
    done = fresh(job)
    assert (done.status, done.result, done.attempts) == ("done", 10_000, 4), output
    items = Counter(
        Execution.objects.filter(job_id=job.id, kind="item").values_list("attempt", flat=True)
    )
    assert len(items) == 10_000 and set(items.values()) == {1}
    assert sorted(items) == list(range(10_000))
    assert len(ran) == 4


def db_now() -> dt.datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_steps_process__sleep_schedules_the_job_without_spending_an_attempt(
    manage, tmp_path, kind
):
    """``sleep(2)`` (``asleep``) puts the job back to scheduled about 2 s ahead in
    database time, its attempt given back; the run after it does not run the step
    before the sleep."""
    ledger = tmp_path / "ledger"
    task = tasks.sleep_between if kind == "sync" else tasks.async_sleep_between
    job = Job.objects.enqueue(task, [str(ledger), 2])
    before = db_now()
    worker = manage(*WORKER)
    wait_for(lambda: fresh(job).status == "scheduled", timeout=30)
    slept = fresh(job)
    assert (slept.attempts, slept.snoozes) == (0, 1), worker.output()
    (step,) = JobStep.objects.filter(job_id=job.id, kind="sleep")
    end = dt.datetime.fromisoformat(step.value["until"])
    assert end - step.finished_at == dt.timedelta(seconds=2)
    assert dt.timedelta(seconds=2) <= slept.run_at - step.finished_at < dt.timedelta(seconds=2.5)
    assert step.finished_at > before
    wait_for(lambda: fresh(job).status == "done", timeout=30)
    done = fresh(job)
    assert (done.result, done.attempts, done.snoozes) == ("after", 1, 1), worker.output()
    assert ledger.read_text().split("\n")[:-1] == ["before", "run 1 0", "run 1 1", "after"]
    assert done.started_at is not None and done.finished_at - slept.run_at >= dt.timedelta(0)


def chaos(manage: Any, tmp_path: Path, *, fault: bool) -> tuple[list[Job], Counter[Any]]:
    """8 jobs of 4 transactional steps on 2 workers (2 runners each) that their steps
    SIGKILL at random (after a step's write, or right after its commit), restarted as
    they die, the sweeper rescuing; the ledger rows of each (job, step)."""
    jobs = [Job.objects.enqueue(tasks.chaos_steps, [4, str(tmp_path), fault]) for _ in range(8)]
    ids = [job.id for job in jobs]
    sweeper = manage(*SWEEPER)
    workers = [manage(*WORKER, "--concurrency", "2") for _ in range(2)]

    def all_done() -> bool:
        for i, proc in enumerate(workers):
            if proc.popen.poll() is not None:
                workers[i] = manage(*WORKER, "--concurrency", "2")
        return Job.objects.filter(id__in=ids, status="done").count() == len(ids)

    try:
        wait_for(all_done, timeout=150, interval=0.1)
    except AssertionError:
        raise AssertionError(sweeper.output()) from None
    rows = Counter(Execution.objects.filter(job_id__in=ids).values_list("job_id", "kind"))
    return jobs, rows


def test_steps_process__chaos_each_transactional_steps_effect_once(manage, tmp_path):
    jobs, rows = chaos(manage, tmp_path, fault=False)
    kills = list(tmp_path.glob("*-commit")) + list(tmp_path.glob("*-write"))
    assert len(kills) >= 3  # the seeds kill several times (their draws are fixed per id)
    assert len(rows) == 8 * 4 and set(rows.values()) == {1}, rows
    assert all(fresh(job).result == 4 for job in jobs)


def test_steps_process__chaos_catches_a_step_recorded_outside_its_transaction(manage, tmp_path):
    """The planted fault: each step's row commits on its own, the step recorded after:
    a kill between the two runs the step again, and the ledger shows it."""
    _, rows = chaos(manage, tmp_path, fault=True)
    assert max(rows.values()) > 1, rows
