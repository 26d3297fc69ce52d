"""django_pgqueue.testing from Django's TestCase and TransactionTestCase, as a project's
own tests use it: what was enqueued, and the due jobs run in the test, through the
worker's own claim, run and fenced outcome paths."""

from __future__ import annotations

import datetime as dt
import traceback
from unittest import mock

from django.db import OperationalError, connection, transaction
from django.test import TestCase, TransactionTestCase, override_settings
from django.utils import timezone

from django_pgqueue import chain, group, step
from django_pgqueue import testing as pgqueue_testing
from django_pgqueue.exceptions import (
    InvalidJob,
    JobCancelled,
    NotRecorded,
    TooManyJobs,
    TransactionLeak,
)
from django_pgqueue.manager import JobManager
from django_pgqueue.models import Job
from django_pgqueue.testing import (
    RunSummary,
    assert_enqueued,
    assert_not_enqueued,
    enqueued,
    run_jobs,
)
from testproject.demo import tasks as demo
from testproject.demo.models import Delivery
from tests import tasks
from tests.conftest import connect_test_db

#: Retries at least 45 s after a failure (the backoff is 60 s times 0.75 to 1.25): not
#: due in a test that does not move the clock, however slow the machine.
SLOW_BACKOFF = override_settings(PGQUEUE_RETRY_BACKOFF_BASE=60.0)


def later(**delta: float) -> dt.datetime:
    """A clock for run_jobs(now=...): this long from now."""
    return timezone.now() + dt.timedelta(**delta)


def enqueue(task, *args, **kwargs) -> Job:
    """``task.enqueue(...)`` (through the backend, as a project's code does), as its Job."""
    return Job.objects.get(pk=task.enqueue(*args, **kwargs).id)


def fresh(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def running() -> list[int]:
    return list(Job.objects.filter(status="running").values_list("id", flat=True))


class AssertEnqueuedTests(TestCase):
    def test_assert_enqueued__passes_for_a_matching_job_and_returns_it(self):
        job = Job.objects.enqueue(demo.add, [1, 2], queue="maths", priority=3)
        assert assert_enqueued(demo.add, args=[1, 2]) == [job]
        assert assert_enqueued("testproject.demo.tasks.add", args=(1, 2), kwargs={}) == [job]
        assert assert_enqueued(demo.add, queue="maths", priority=3, count=1) == [job]
        assert_enqueued(args=[1, 2])  # any task

    def test_assert_enqueued__wrong_argument_lists_what_is_enqueued(self):
        first = enqueue(demo.add, 1, 2)
        second = Job.objects.enqueue(demo.add, [5], {"b": 6}, queue="maths", priority=-2)
        with self.assertRaises(AssertionError) as caught:
            assert_enqueued(demo.add, args=[1, 3])
        assert str(caught.exception) == (
            "expected a job of testproject.demo.tasks.add with args=[1, 3] pending or "
            "scheduled; found 0.\n"
            "Enqueued jobs of testproject.demo.tasks.add (2):\n"
            f"  #{first.id} pending testproject.demo.tasks.add args=[1, 2] kwargs={{}} "
            "queue='default' priority=0\n"
            f"  #{second.id} pending testproject.demo.tasks.add args=[5] "
            "kwargs={\"b\": 6} queue='maths' priority=-2"
        )

    def test_assert_enqueued__a_scheduled_job_shows_when_it_is_due(self):
        run_at = timezone.now() + dt.timedelta(hours=1)
        job = Job.objects.enqueue(demo.add, [1, 2], run_at=run_at)
        assert assert_enqueued(demo.add, status="scheduled") == [job]
        with self.assertRaises(AssertionError) as caught:
            assert_enqueued(demo.add, kwargs={"a": 1})
        assert f"#{job.id} scheduled" in str(caught.exception)
        assert f"run_at={fresh(job).run_at.isoformat()}" in str(caught.exception)

    def test_assert_enqueued__no_job_of_the_task_lists_the_closest(self):
        far = Job.objects.enqueue(tasks.echo, ["x"], queue="other")
        near = enqueue(demo.add, 7, 8)
        with self.assertRaises(AssertionError) as caught:
            assert_enqueued(tasks.double, args=[7, 8])
        message = str(caught.exception)
        assert message.startswith(
            "expected a job of tests.tasks.double with args=[7, 8] pending or scheduled; "
            "found 0.\nNo job of tests.tasks.double is enqueued; the closest of those "
            "enqueued:\n"
        )
        assert message.index(f"#{near.id} ") < message.index(f"#{far.id} ")

    def test_assert_enqueued__nothing_enqueued_says_so(self):
        with self.assertRaisesMessage(AssertionError, "found 0.\nNo job is enqueued."):
            assert_enqueued(demo.add)

    def test_assert_enqueued__count_is_exact(self):
        jobs = [enqueue(demo.add, 1, n) for n in range(3)]
        assert assert_enqueued(demo.add, count=3) == jobs
        with self.assertRaises(AssertionError) as caught:
            assert_enqueued(demo.add, count=2)
        assert str(caught.exception).startswith(
            "expected 2 jobs of testproject.demo.tasks.add pending or scheduled; found 3."
            "\nThose found:\n"
        )
        assert assert_enqueued(tasks.echo, count=0) == []
        with self.assertRaisesMessage(ValueError, "count must be an int >= 0, not -1"):
            assert_enqueued(demo.add, count=-1)

    def test_assert_enqueued__running_and_finished_jobs_are_not_enqueued(self):
        job = enqueue(demo.add, 1, 2)
        (claimed,) = Job.objects.claim("another-worker", limit=1)
        assert claimed.id == job.id
        assert_not_enqueued(demo.add)
        assert assert_enqueued(demo.add, status="running") == [fresh(job)]

    def test_assert_not_enqueued__lists_the_matching_jobs(self):
        job = enqueue(demo.add, 1, 2)
        assert_not_enqueued(demo.add, args=[2, 1])
        assert_not_enqueued(tasks.echo)
        with self.assertRaises(AssertionError) as caught:
            assert_not_enqueued(demo.add, args=[1, 2])
        assert str(caught.exception) == (
            "expected no job of testproject.demo.tasks.add with args=[1, 2] pending or "
            "scheduled; found 1:\n"
            f"  #{job.id} pending testproject.demo.tasks.add args=[1, 2] kwargs={{}} "
            "queue='default' priority=0"
        )
        with self.assertRaisesMessage(TypeError, "assert_not_enqueued() takes no count"):
            assert_not_enqueued(demo.add, count=0)

    def test_enqueued__filters_and_orders_oldest_first(self):
        a = Job.objects.enqueue(tasks.echo, [1], {"k": "v"}, queue="q1")
        b = Job.objects.enqueue(tasks.echo, [2], queue="q2", idempotency_key="two")
        c = enqueue(demo.add, 1, 2)
        assert enqueued() == [a, b, c]
        assert enqueued(tasks.echo) == [a, b]
        assert enqueued(tasks.echo, kwargs={"k": "v"}) == [a]
        assert enqueued(queue="q2") == [b]
        assert enqueued(idempotency_key="two") == [b]
        assert enqueued(tasks.echo, args__contains=[2]) == [b]

    def test_enqueued__bad_criteria_are_named(self):
        with self.assertRaisesMessage(InvalidJob, "task 'tests.tasks.nope' does not import"):
            enqueued("tests.tasks.nope")
        with self.assertRaisesMessage(InvalidJob, "args must be a list or tuple, not int"):
            assert_enqueued(demo.add, args=1)


class RunJobsTests(TestCase):
    """Inside the test's transaction: jobs the test enqueued are run on its connection,
    and nothing commits."""

    def test_run_jobs__runs_what_the_test_enqueued_and_commits_nothing(self):
        job = enqueue(demo.add, 2, 3)
        summary = run_jobs()
        assert isinstance(summary, RunSummary)
        assert (summary.done, len(summary), summary.counts) == (1, 1, {"done": 1})
        assert [(j.id, j.status, j.result) for j in summary.jobs] == [(job.id, "done", 5)]
        assert repr(summary) == "<RunSummary: 1 job run: done=1>"
        with connect_test_db() as other:
            # Another connection sees nothing: the job and its run are the test's.
            assert other.execute("SELECT count(*) FROM pgqueue_job").fetchone() == (0,)
        assert run_jobs().runs == ()

    @SLOW_BACKOFF
    def test_run_jobs__failing_task_is_retried_by_now_until_dead(self):
        job = Job.objects.enqueue(demo.always_fails, ["bad input"], max_attempts=3)
        summary = run_jobs()
        assert (summary.counts, fresh(job).status, fresh(job).attempts) == (
            {"retried": 1},
            "scheduled",
            1,
        )
        assert isinstance(summary.runs[0].error, ValueError)
        # The retry is due in a minute or so: not now.
        assert run_jobs().runs == ()
        summary = run_jobs(now=later(days=1))
        assert [r.outcome for r in summary.runs] == ["retried", "dead"]
        row = fresh(job)
        assert (row.status, row.attempts) == ("dead", 3)
        assert [e["attempt"] for e in row.errors] == [1, 2, 3]
        assert "ValueError: bad input" in row.errors[-1]["traceback"]
        assert run_jobs(now=later(days=2)).runs == ()

    def test_run_jobs__a_chain_runs_to_its_end(self):
        jobs = chain(step(tasks.double, 1), tasks.double, step(tasks.echo, "x")).enqueue()
        assert_enqueued(tasks.double, args=[1], count=1)  # the others wait for it
        summary = run_jobs()
        assert [(j.id, j.result) for j in summary.jobs] == [
            (jobs[0].id, 2),
            (jobs[1].id, 4),
            (jobs[2].id, {"args": [4, "x"], "kwargs": {}}),
        ]
        assert summary.done == 3

    def test_run_jobs__a_group_then_its_callback(self):
        jobs = group(step(tasks.double, 1), step(tasks.double, 2), then=tasks.total).enqueue()
        summary = run_jobs()
        assert summary.done == 3
        assert fresh(jobs[-1]).result == 6

    def test_run_jobs__jobs_a_task_enqueues_run_too(self):
        enqueue(tasks.enqueue_echo, 9)
        summary = run_jobs()
        assert [(j.task, j.result) for j in summary.jobs] == [
            ("tests.tasks.enqueue_echo", 9),
            ("tests.tasks.echo", {"args": [9], "kwargs": {}}),
        ]

    def test_run_jobs__a_debounced_job_runs_once_with_the_last_arguments(self):
        for n in range(3):
            Job.objects.enqueue(tasks.echo, [n], idempotency_key="reindex:1", debounce=60)
        assert_enqueued(tasks.echo, args=[2], status="scheduled", count=1)
        assert run_jobs().runs == ()  # due in a minute
        summary = run_jobs(now=later(minutes=2))
        assert [(j.result, j.status) for j in summary.jobs] == [
            ({"args": [2], "kwargs": {}}, "done")
        ]
        assert run_jobs(now=later(minutes=4)).runs == ()

    @override_settings(PGQUEUE_LIMITS={"testing-limited": {"rate": "2/m"}})
    def test_run_jobs__a_rate_limited_key_runs_what_its_window_allows(self):
        jobs = [enqueue(tasks.limited, n) for n in range(3)]
        unkeyed = enqueue(tasks.echo, "free")
        summary = run_jobs()
        assert sorted(j.id for j in summary.jobs) == sorted([jobs[0].id, jobs[1].id, unkeyed.id])
        assert fresh(jobs[2]).status == "pending"
        # The window is a minute of the database's clock: later, the third starts.
        summary = run_jobs(now=later(minutes=2))
        assert [j.id for j in summary.jobs] == [jobs[2].id]

    @override_settings(PGQUEUE_LIMITS={"testing-limited": {"concurrency": 1}})
    def test_run_jobs__a_key_at_its_concurrency_limit_waits(self):
        first, second = enqueue(tasks.limited, 1), enqueue(tasks.limited, 2)
        (elsewhere,) = Job.objects.claim("another-worker", limit=1)  # runs on another worker
        assert elsewhere.id == first.id
        assert run_jobs().runs == ()
        assert fresh(second).status == "pending"
        assert Job.objects.complete(elsewhere, "another-worker", result=1)
        assert [j.id for j in run_jobs().jobs] == [second.id]

    def test_run_jobs__a_paused_queue_is_not_run(self):
        job = Job.objects.enqueue(tasks.echo, [1], queue="paused")
        Job.objects.pause_queue("paused")
        assert run_jobs().runs == ()
        Job.objects.resume_queue("paused")
        assert [j.id for j in run_jobs().jobs] == [job.id]

    def test_run_jobs__transactional_task_rolled_back_by_the_test(self):
        job = enqueue(tasks.deliver, "ada")
        with transaction.atomic():
            summary = run_jobs()
            assert [(j.status, j.result) for j in summary.jobs] == [("done", 1)]
            assert Delivery.objects.filter(job_id=job.id).exists()
            transaction.set_rollback(True)
        # The task's writes and its job's completion were one: both rolled back.
        assert not Delivery.objects.exists()
        row = fresh(job)
        assert (row.status, row.attempts, row.result) == ("pending", 0, None)

    def test_run_jobs__transactional_task_that_raises_rolls_back_its_writes(self):
        job = enqueue(tasks.deliver, "bob", fail=True)
        summary = run_jobs()
        assert summary.counts == {"retried": 1}
        assert not Delivery.objects.exists()
        assert "could not deliver to bob" in fresh(job).errors[0]["traceback"]
        assert connection.in_atomic_block  # the test's transaction stands

    def test_run_jobs__a_failed_statement_does_not_break_the_tests_transaction(self):
        # Under a worker the first row stays (autocommit); inside the test's transaction
        # the job's statements roll back with the failed one, and the test goes on.
        job = enqueue(tasks.deliver_twice, "cy")
        summary = run_jobs()
        assert summary.counts == {"dead": 1}
        assert type(summary.runs[0].error).__name__ == "IntegrityError"
        assert not Delivery.objects.exists()
        assert fresh(job).status == "dead"

    def test_run_jobs__an_atomic_block_left_open_fails_the_job(self):
        job = enqueue(tasks.leaves_atomic_open, "dee")
        depth = len(connection.atomic_blocks)
        summary = run_jobs()
        assert isinstance(summary.runs[0].error, TransactionLeak)
        assert "an atomic block open" in str(summary.runs[0].error)
        assert (len(connection.atomic_blocks), fresh(job).status) == (depth, "dead")
        assert not Delivery.objects.exists()

    def test_run_jobs__current_job_progress_and_signals(self):
        from django_pgqueue.taskapi import task_finished

        finished = []

        def receiver(sender, task_result, **kwargs):
            finished.append(task_result)

        task_finished.connect(receiver)
        self.addCleanup(task_finished.disconnect, receiver)
        job = Job.objects.enqueue(tasks.whoami, queue="mine")
        (ran,) = run_jobs().jobs
        assert ran.result["id"] == job.id
        assert ran.result["attempt"] == 1
        assert ran.result["queue"] == "mine"
        assert ran.result["worker_id"].startswith("run_jobs:")
        assert ran.progress == {"step": 1}
        assert [(r.id, r.status.name) for r in finished] == [(str(job.id), "SUCCESSFUL")]

    def test_run_jobs__a_coroutine_task_runs_on_the_tests_connection(self):
        Delivery.objects.create(job_id=0, recipient="seen by the coroutine")
        job = enqueue(tasks.async_whoami)
        (ran,) = run_jobs().jobs
        assert ran.result == {"id": job.id, "deliveries": 1}
        assert ran.progress == {"async": True}

    def test_run_jobs__a_snoozed_job_waits_for_its_time(self):
        job = enqueue(tasks.snooze_once, 30)
        assert run_jobs().counts == {"snoozed": 1}
        assert (fresh(job).status, fresh(job).snoozes, fresh(job).attempts) == ("scheduled", 1, 0)
        assert run_jobs().runs == ()
        summary = run_jobs(now=later(minutes=1))
        assert [(j.status, j.result) for j in summary.jobs] == [("done", "woke")]

    def test_run_jobs__a_cancelled_job_is_no_error_to_raise(self):
        job = enqueue(tasks.cancels_itself)
        summary = run_jobs(raise_errors=True)
        assert (summary.counts, fresh(job).status) == ({"cancelled": 1}, "cancelled")
        assert isinstance(summary.runs[0].error, JobCancelled)

    @SLOW_BACKOFF
    def test_run_jobs__raise_errors_reraises_once_the_failure_is_written(self):
        failing = enqueue(demo.always_fails, "boom")
        after = enqueue(demo.add, 1, 1)
        try:
            run_jobs(raise_errors=True)
        except ValueError as exc:  # (assertRaises would drop the traceback)
            frames = [frame.name for frame in traceback.extract_tb(exc.__traceback__)]
        else:
            self.fail("run_jobs(raise_errors=True) raised nothing")
        assert frames[0] == "test_run_jobs__raise_errors_reraises_once_the_failure_is_written"
        assert frames[-1] == "always_fails"  # the task's own traceback
        row = fresh(failing)
        assert (row.status, row.attempts, len(row.errors)) == ("scheduled", 1, 1)
        assert fresh(after).status == "pending"  # nothing ran after the failure
        assert running() == []

    def test_run_jobs__never_leaves_a_job_running(self):
        enqueue(demo.always_fails, "boom")
        run_jobs()
        assert running() == []
        enqueue(demo.always_fails, "boom")
        with self.assertRaises(ValueError):
            run_jobs(raise_errors=True)
        assert running() == []

    def test_run_jobs__an_outcome_that_cannot_be_written_gives_the_job_back(self):
        job = enqueue(tasks.deliver, "eve", fail=True)
        planted = OperationalError("planted: the failure cannot be written")
        with mock.patch.object(JobManager, "fail", side_effect=planted):
            with self.assertRaises(NotRecorded) as caught:
                run_jobs()
        assert "could not be recorded; it was given back" in str(caught.exception)
        row = fresh(job)
        assert (row.status, row.attempts, row.lease_owner) == ("pending", 0, None)
        assert running() == []

    def test_run_jobs__queue_and_task_choose_the_jobs(self):
        mail = Job.objects.enqueue(tasks.echo, ["mail"], queue="mail")
        echo = enqueue(tasks.echo, "default")
        add = enqueue(demo.add, 1, 2)
        assert [j.id for j in run_jobs(queue="mail").jobs] == [mail.id]
        assert [j.id for j in run_jobs(task=demo.add).jobs] == [add.id]
        # The job of another task ahead in line was claimed, and given back unrun.
        row = fresh(echo)
        assert (row.status, row.attempts, row.lease_owner) == ("pending", 0, None)
        summary = run_jobs(task="tests.tasks.echo", queue=["mail", "default"])
        assert [j.id for j in summary.jobs] == [echo.id]

    def test_run_jobs__limit_runs_that_many(self):
        jobs = [enqueue(demo.add, n, n) for n in range(3)]
        assert [j.id for j in run_jobs(limit=2).jobs] == [jobs[0].id, jobs[1].id]
        assert fresh(jobs[2]).status == "pending"

    def test_run_jobs__a_job_that_enqueues_itself_for_ever_is_stopped(self):
        enqueue(tasks.forever, 0)
        with mock.patch.object(pgqueue_testing, "MAX_JOBS", 5):
            with self.assertRaises(TooManyJobs) as caught:
                run_jobs()
        assert "ran 5 jobs (MAX_JOBS) and more are due" in str(caught.exception)
        assert "tests.tasks.forever (5)" in str(caught.exception)
        assert running() == []
        assert_enqueued(tasks.forever, args=[5], count=1)
        assert [j.result for j in run_jobs(limit=3).jobs] == [5, 6, 7]

    def test_run_jobs__bad_arguments_are_named(self):
        with self.assertRaisesMessage(ValueError, "limit must be an int >= 1 or None, not 0"):
            run_jobs(limit=0)
        with self.assertRaisesMessage(ValueError, "now must be a timezone-aware datetime"):
            run_jobs(now=dt.datetime(2030, 1, 1))  # noqa: DTZ001 - the mistake tested
        with self.assertRaisesMessage(InvalidJob, "queue name ''"):
            run_jobs(queue="")
        with self.assertRaisesMessage(InvalidJob, "does not import"):
            run_jobs(task="tests.tasks.missing")


class RunJobsTransactionTests(TransactionTestCase):
    """In autocommit, each job commits as under a worker."""

    def test_run_jobs__each_job_commits(self):
        job = enqueue(tasks.deliver, "fay")
        summary = run_jobs()
        assert summary.done == 1
        with connect_test_db() as other:
            status = other.execute("SELECT status FROM pgqueue_job WHERE id = %s", [job.id])
            assert status.fetchone() == ("done",)
            assert other.execute("SELECT recipient FROM demo_delivery").fetchall() == [("fay",)]

    def test_run_jobs__transactional_task_that_raises_commits_only_its_failure(self):
        job = enqueue(tasks.deliver, "gus", fail=True)
        assert run_jobs().counts == {"retried": 1}
        assert not Delivery.objects.exists()
        assert fresh(job).status == "scheduled"

    def test_run_jobs__a_failed_statement_is_its_own_as_under_a_worker(self):
        enqueue(tasks.deliver_twice, "hal")
        assert run_jobs().counts == {"dead": 1}
        assert list(Delivery.objects.values_list("recipient", flat=True)) == ["hal"]

    def test_run_jobs__an_atomic_block_left_open_is_rolled_back_with_the_connection(self):
        enqueue(tasks.leaves_atomic_open, "ida")
        (run,) = run_jobs().runs
        assert isinstance(run.error, TransactionLeak)
        assert not connection.in_atomic_block
        assert not Delivery.objects.exists()

    @SLOW_BACKOFF
    def test_run_jobs__retried_until_dead_and_never_left_running(self):
        job = Job.objects.enqueue(demo.always_fails, ["x"], max_attempts=2)
        with self.assertRaises(ValueError):
            run_jobs(raise_errors=True)
        assert running() == []
        assert run_jobs(now=later(days=1)).counts == {"dead": 1}
        assert (fresh(job).status, fresh(job).attempts) == ("dead", 2)


class RunJobsAsyncTests(TestCase):
    async def test_run_jobs__from_an_async_test_through_sync_to_async(self):
        from asgiref.sync import sync_to_async

        result = await tasks.async_echo.aenqueue("hi")
        summary = await sync_to_async(run_jobs)()
        assert [(j.id, j.result) for j in summary.jobs] == [
            (int(result.id), {"args": ["hi"], "kwargs": {}})
        ]
