"""The Worker, in-process: claims, runs, completes or fails, heartbeats, stops."""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Iterator

import pytest

from django_pgqueue.models import Job
from django_pgqueue.sweeper import sweep
from django_pgqueue.taskapi import FRAMEWORK, task
from django_pgqueue.worker import Worker
from testproject.demo import tasks
from tests import tasks as test_tasks
from tests.conftest import wait_for
from tests.tasks import sleep_after_marking

pytestmark = pytest.mark.django_db(transaction=True)


@task()
def returns_nan() -> float:
    """Returns a value JSON cannot hold: the job must fail, not store garbage."""
    return float("nan")


def fresh(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def test_worker__runs_jobs_and_stores_results(job_factory, run_worker):
    jobs = [job_factory(args=[n, n]) for n in range(1, 4)]
    worker = run_worker(worker_id="w-test")
    assert (worker.stats.claimed, worker.stats.done, worker.stats.failed) == (3, 3, 0)
    rows = [fresh(job) for job in jobs]
    assert [(r.status, r.result, r.attempts) for r in rows] == [
        ("done", 2, 1),
        ("done", 4, 1),
        ("done", 6, 1),
    ]
    assert {r.lease_owner for r in rows} == {"w-test"}
    assert all(r.finished_at >= r.started_at for r in rows)


def test_worker__runs_jobs_concurrently(job_factory, run_worker):
    jobs = [job_factory(task=tasks.slow, args=[0.4]) for _ in range(3)]
    run_worker(concurrency=3)
    rows = [fresh(job) for job in jobs]
    assert {r.status for r in rows} == {"done"}
    # Every job started before any finished: they ran at the same time.
    assert max(r.started_at for r in rows) < min(r.finished_at for r in rows)


def test_worker__failing_job_is_retried_then_dead(job_factory, run_worker, settings):
    settings.PGQUEUE_RETRY_BACKOFF_BASE = 0.0  # the retry is due at once
    job = job_factory(task=tasks.always_fails, args=["bad input"], max_attempts=2)
    worker = run_worker()
    row = fresh(job)
    assert (row.status, row.attempts) == ("dead", 2)
    assert worker.stats.failed == 2
    assert [e["attempt"] for e in row.errors] == [1, 2]
    assert {e["exception_class_path"] for e in row.errors} == {"builtins.ValueError"}
    assert "ValueError: bad input" in row.errors[-1]["traceback"]


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("testproject.demo.tasks.removed_task", "does not import"),
        ("testproject.demo.gone_module.task", "does not import"),
        ("testproject.demo.tasks.not_a_task", f"is a function, not a {FRAMEWORK}.Task"),
    ],
)
def test_worker__job_whose_task_is_not_importable_is_dead_at_once(
    job_factory, run_worker, path, reason
):
    job = job_factory(max_attempts=5)
    # The code changed after the job was enqueued (enqueue itself refuses such paths).
    Job.objects.filter(pk=job.pk).update(task=path)
    worker = run_worker()
    row = fresh(job)
    assert (row.status, row.attempts) == ("dead", 1)  # no retries
    (error,) = row.errors
    assert error["exception_class_path"] == "django_pgqueue.exceptions.TaskNotFound"
    assert reason in error["traceback"]
    assert path in error["traceback"]
    assert worker.stats.failed == 1


@task()
def returns_set() -> set[int]:
    return {1, 2}


@task()
def returns_nested(kind: str) -> object:
    """A JSON-looking value with something else deep inside."""
    inner = {"set": {3}, "object": object(), "key": {(1, 2): "tuple key"}}[kind]
    return {"rows": [1, {"cell": inner}]}


@pytest.mark.parametrize(
    ("job_task", "args", "reason"),
    [
        (returns_set, [], "return value is of type set, which JSON cannot hold"),
        (returns_nan, [], "return value is nan: JSON has no NaN or Infinity"),
        (returns_nested, ["set"], "return value['rows'][1]['cell'] is of type set"),
        (returns_nested, ["object"], "return value['rows'][1]['cell'] is of type object"),
        (returns_nested, ["key"], "return value['rows'][1]['cell'] has a key (1, 2) of type"),
    ],
    ids=["set", "nan", "nested_set", "nested_object", "tuple_key"],
)
def test_worker__non_json_return_value_is_dead_at_once_with_where(
    job_factory, run_worker, job_task, args, reason
):
    """Never retried (the task would return the same), and the error says the return
    value must be JSON, naming the type and where in the value."""
    job = job_factory(task=job_task, args=args, max_attempts=5)
    worker = run_worker()
    row = fresh(job)
    assert (row.status, row.result, row.attempts) == ("dead", None, 1)  # ran once
    assert (worker.stats.failed, worker.stats.done) == (1, 0)
    (error,) = row.errors
    assert error["exception_class_path"] == "django_pgqueue.exceptions.InvalidResult"
    assert "the task's return value must be JSON-serialisable: " in error["traceback"]
    assert reason in error["traceback"]


@task()
def returns_nul() -> str:
    return "a\x00b"


@task()
def raises_with_nul() -> None:
    raise ValueError("bad byte \x00 here")


def test_worker__result_jsonb_cannot_store_fails_the_job_at_once(job_factory, run_worker):
    """Not a database error retried for a whole lease: a failed attempt with the reason."""
    job = job_factory(task=returns_nul, args=[], max_attempts=1)
    worker = run_worker(lease_seconds=30, timeout=10)
    row = fresh(job)
    assert (row.status, worker.stats.failed) == ("dead", 1)
    assert row.errors[0]["exception_class_path"] == "django_pgqueue.exceptions.InvalidResult"
    assert "return value contains a NUL" in row.errors[0]["traceback"]


def test_worker__error_message_with_nul_is_recorded(job_factory, run_worker):
    job = job_factory(task=raises_with_nul, args=[], max_attempts=1)
    worker = run_worker(lease_seconds=30, timeout=10)
    row = fresh(job)
    assert (row.status, worker.stats.failed) == ("dead", 1)
    assert "ValueError: bad byte \\x00 here" in row.errors[0]["traceback"]


def test_worker__max_jobs_stops_after_that_many(job_factory, run_worker):
    jobs = [job_factory() for _ in range(5)]
    worker = run_worker(burst=False, max_jobs=2)
    assert (worker.stats.claimed, worker.stats.done) == (2, 2)
    statuses = [fresh(job).status for job in jobs]
    assert statuses == ["done", "done", "pending", "pending", "pending"]


def test_worker__queue_filter(job_factory, run_worker):
    a = job_factory(queue="a")
    b = job_factory(queue="b")
    c = job_factory(queue="c")
    run_worker(queues=["a", "c"])
    assert [fresh(j).status for j in (a, b, c)] == ["done", "pending", "done"]


def test_worker__promotes_due_scheduled_jobs_when_idle(job_factory, run_worker):
    past = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
    job = job_factory(run_at=past + dt.timedelta(seconds=1), now=past)
    assert fresh(job).status == "scheduled"
    run_worker()
    assert fresh(job).status == "done"


def test_worker__heartbeat_keeps_a_long_job_leased(job_factory):
    """A job running four times longer than its lease is not taken back by a sweeper."""
    job = job_factory(task=tasks.slow, args=[1.2])
    worker = Worker(lease_seconds=0.3, poll_interval=0.1, burst=True)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_for(lambda: fresh(job).status == "running", timeout=10)

        def swept_until_done() -> bool:
            sweep()
            return fresh(job).status == "done"

        wait_for(swept_until_done, timeout=15, interval=0.05)
    finally:
        worker.stop()
        thread.join(10)
    row = fresh(job)
    assert (row.attempts, row.errors, row.result) == (1, [], 1.2)
    assert worker.stats.lost == 0


def test_worker__stop_lets_the_running_job_finish(job_factory, tmp_path):
    marker = tmp_path / "started"
    job = job_factory(task=sleep_after_marking, args=[str(marker), 0.5])
    waiting = job_factory()
    worker = Worker(poll_interval=0.1, lease_seconds=30)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_for(marker.exists, timeout=10)  # the task body runs, not just claimed
        worker.stop()
        thread.join(10)
        assert not thread.is_alive()
    finally:
        worker.stop()
        thread.join(10)
    assert fresh(job).status == "done"
    # Claiming stopped: the second job was never taken.
    assert (fresh(waiting).status, fresh(waiting).attempts) == ("pending", 0)


def test_worker__task_module_raising_on_import_fails_the_job_and_keeps_the_slot(
    job_factory, run_worker
):
    broken = Job.objects.create(
        task="tests.broken_at_import.some_task", max_attempts=1, args=[], kwargs={}
    )
    after = job_factory(args=[2, 3])
    worker = run_worker(concurrency=1)
    broken = fresh(broken)
    assert broken.status == "dead"
    assert broken.errors[-1]["exception_class_path"] == "builtins.SystemExit"
    assert "broken at import" in broken.errors[-1]["traceback"]
    # The only runner thread survived and ran the next job.
    assert fresh(after).status == "done"
    assert worker.stats.done == 1


def test_worker__failing_task_signal_receiver_does_not_lose_the_job(job_factory, run_worker):
    from django_pgqueue.backend import PgQueueBackend
    from django_pgqueue.taskapi import task_started

    senders = []

    def receiver(sender, task_result, **kwargs):
        senders.append(sender)
        raise RuntimeError("receiver bug")

    task_started.connect(receiver)
    try:
        job = job_factory(args=[1, 1])
        run_worker()
    finally:
        task_started.disconnect(receiver)
    assert (fresh(job).status, fresh(job).result) == ("done", 2)
    assert senders == [PgQueueBackend]


def rescue_all_leases() -> None:
    """Take back every running job, as a sweeper would once the leases ran out."""
    sweep(now=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))


def test_worker__stale_run_ending_keeps_the_reclaimed_attempt_leased(job_factory):
    """Attempt 1 still runs when its lease is taken back and this same worker claims
    the job again (attempt 2). When attempt 1 ends (fenced out), the worker must keep
    extending attempt 2's lease: dropping it would hand the job to a third run."""
    job = job_factory(task=test_tasks.gated, args=["reclaim"])
    worker = Worker(concurrency=2, lease_seconds=1.0, poll_interval=0.05, worker_id="w-re")
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_for(test_tasks.STARTED["reclaim", 1].is_set, timeout=10)
        rescue_all_leases()
        wait_for(test_tasks.STARTED["reclaim", 2].is_set, timeout=10)
        test_tasks.GATES["reclaim", 1].set()
        wait_for(lambda: worker.stats.lost == 1, timeout=10)  # attempt 1 fenced out
        before = fresh(job).lease_expires_at
        wait_for(lambda: fresh(job).lease_expires_at > before, timeout=5)
        assert job.id in worker._state.held
        test_tasks.GATES["reclaim", 2].set()
        wait_for(lambda: fresh(job).status == "done", timeout=10)
    finally:
        for gate in ("reclaim", 1), ("reclaim", 2):
            test_tasks.GATES[gate].set()
        worker.stop()
        thread.join(10)
    assert (fresh(job).attempts, fresh(job).result) == (2, 2)


def test_worker__stale_prefetched_copy_of_a_reclaimed_job_is_not_run(job_factory):
    """A prefetched job (attempt 1, not started) is taken back and claimed again by
    this same worker (attempt 2) before a runner frees up. The stale copy must not run
    (it would run the task on an attempt the worker no longer owns), and attempt 2
    must still run."""
    for gate in ("busy", 2), ("prefetched", 1), ("prefetched", 2):
        test_tasks.GATES[gate].set()  # only attempt 1 of "busy" waits for the test
    busy = job_factory(task=test_tasks.gated, args=["busy"])
    worker = Worker(concurrency=1, batch_size=3, lease_seconds=1.0, poll_interval=0.05)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_for(test_tasks.STARTED["busy", 1].is_set, timeout=10)
        prefetched = job_factory(task=test_tasks.gated, args=["prefetched"], priority=10)
        wait_for(lambda: fresh(prefetched).status == "running", timeout=10)
        rescue_all_leases()
        wait_for(lambda: fresh(prefetched).attempts == 2, timeout=10)  # claimed again
        test_tasks.GATES["busy", 1].set()
        wait_for(lambda: fresh(prefetched).status == "done", timeout=10)
        wait_for(lambda: fresh(busy).status == "done", timeout=10)
    finally:
        test_tasks.GATES["busy", 1].set()
        worker.stop()
        thread.join(10)
    assert [run for run in test_tasks.RUNS if run[0] == "prefetched"] == [("prefetched", 2)]
    assert (fresh(prefetched).attempts, fresh(prefetched).result) == (2, 2)


def test_worker__claim_connection_keeps_to_the_claim_index_with_stale_statistics():
    """Right after a bulk load (no ANALYZE yet) the planner believes a handful of jobs
    are pending and would bitmap-scan and sort the whole backlog on every claim; the
    worker's claim connection walks the claim index and stops at the LIMIT."""
    from django.db import connection

    from django_pgqueue import sql
    from django_pgqueue.worker.connections import configure_session

    Job.objects.bulk_enqueue(
        {"task": "testproject.demo.tasks.add", "args": [i, i]} for i in range(5000)
    )
    try:
        configure_session("default", "claim", "w-plan", 5.0)
        with connection.cursor() as cursor:
            cursor.execute(
                "EXPLAIN " + sql.JOB_CLAIM,
                {"worker_id": "w-plan", "limit": 50, "queues": None, "lease_seconds": 60,
                 "now": None},
            )  # fmt: skip
            plan = "\n".join(row[0] for row in cursor.fetchall())
    finally:
        connection.close()  # the pinned plan setting must not outlive this test
    assert "Index Scan using pgqueue_job_claim_idx" in plan, plan
    assert "Bitmap" not in plan and "Sort" not in plan, plan


def test_worker__claim_connection_commits_asynchronously_runner_connection_does_not():
    """Claims commit without waiting for the disk (a claim a crash loses is one never
    made); the connections that record outcomes keep the project's durable commits."""
    from django.db import connection

    from django_pgqueue.worker.connections import configure_session

    def setting() -> str:
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('synchronous_commit')")
            return str(cursor.fetchone()[0])

    try:
        configure_session("default", "completer", "w-commit")
        assert setting() == "on"
        connection.close()
        configure_session("default", "claim", "w-commit", 5.0)
        assert setting() == "off"
    finally:
        connection.close()  # the claim settings must not outlive this test


def test_worker__claims_whole_batches_and_the_next_one_ahead():
    """A batch size above the concurrency claims the next batch while the current one
    runs, and only whole batches while claimed jobs still wait locally."""
    worker = Worker(concurrency=4, batch_size=50)
    assert worker._ahead == 50
    assert worker._free_slots() + worker._ahead == 100
    assert worker._claim_size(120) == 50
    assert worker._claim_size(20) == 20  # nothing waits locally: claim what fits
    worker._jobs.put(Job(id=1))
    assert worker._claim_size(20) == 0  # jobs still wait: wait for a whole batch
    assert worker._claim_size(50) == 50
    assert Worker(concurrency=4, batch_size=4)._ahead == 0  # no prefetch asked for


# --- how failures are reported (log lines, task_finished) ------------------------------


class Collect(logging.Handler):
    """Records of our loggers and Django's ``django.tasks`` logger, for one test."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.loggers = [logging.getLogger("django_pgqueue"), logging.getLogger(FRAMEWORK)]

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def __enter__(self) -> Collect:
        for logger in self.loggers:
            logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        for logger in self.loggers:
            logger.removeHandler(self)


@pytest.fixture
def finished() -> Iterator[list[tuple[str, str]]]:
    """(job id, status) of every task_finished the worker sends."""
    from django_pgqueue.taskapi import task_finished

    sent: list[tuple[str, str]] = []

    def receiver(sender: object, task_result: object, **kwargs: object) -> None:
        sent.append((task_result.id, task_result.status))  # type: ignore[attr-defined]

    task_finished.connect(receiver)
    yield sent
    task_finished.disconnect(receiver)


def test_worker__retried_attempt_is_one_line_and_no_task_finished(
    job_factory, run_worker, settings, finished
):
    """One warning line, the exception's first line, no traceback from our logger or
    Django's; task_finished only for the final outcome (here: done on attempt 2)."""
    settings.PGQUEUE_RETRY_BACKOFF_BASE = 0  # the retry is due at once
    job = job_factory(task=test_tasks.fails_first_attempt, args=[])
    with Collect() as logs:
        run_worker()
    row = fresh(job)
    assert (row.status, row.attempts, row.result) == ("done", 2, 2)
    assert "second line of the message" in row.errors[0]["traceback"]  # the traceback is kept
    assert [r for r in logs.records if r.exc_info] == []
    (line,) = [r for r in logs.records if "first attempt fails" in r.getMessage()]
    assert (line.name, line.levelno) == ("django_pgqueue.worker.outcomes", logging.WARNING)
    assert line.getMessage() == (
        f"job {job.id} tests.tasks.fails_first_attempt failed after "
        f"{line.args[2]:.3f}s (attempt 1/5), will retry: ValueError: first attempt fails"
    )
    assert finished == [(str(job.id), "SUCCESSFUL")]


def test_worker__final_failure_has_one_traceback_and_one_task_finished(
    job_factory, run_worker, settings, finished
):
    settings.PGQUEUE_RETRY_BACKOFF_BASE = 0
    # Django's own line of the failure written too (by default it is folded into the
    # worker's where both would go to the same handlers, as here).
    settings.PGQUEUE_FRAMEWORK_LOG_LINES = True
    job = job_factory(task=tasks.always_fails, args=["kaput"], max_attempts=2)
    with Collect() as logs:
        run_worker()
    assert (fresh(job).status, fresh(job).attempts) == ("dead", 2)
    # (The backport logs FAILED with logger.exception outside any handler: its record
    # has exc_info (None, None, None), which prints no traceback.)
    with_traceback = [r for r in logs.records if r.exc_info and r.exc_info[0]]
    assert [(r.name, r.levelno) for r in with_traceback] == [
        ("django_pgqueue.worker.outcomes", logging.ERROR)
    ]
    assert with_traceback[0].getMessage().endswith("(attempt 2/2) -> dead")
    assert finished == [(str(job.id), "FAILED")]
    # Django's own receiver still logs the outcome, as one line.
    (django_line,) = [r for r in logs.records if r.name == FRAMEWORK and "FAILED" in str(r.args)]
    assert not (django_line.exc_info and django_line.exc_info[0])


def test_worker__burst_runs_a_retry_that_is_due_before_exiting(job_factory, run_worker, settings):
    """The poll interval throttles promotion; a burst worker promotes once more before
    it exits, so a due retry of a job it failed is not left behind."""
    settings.PGQUEUE_RETRY_BACKOFF_BASE = 0
    # Slow enough that the idle promote while it runs finds nothing due yet.
    job = job_factory(task=test_tasks.fails_first_attempt, args=[], kwargs={"seconds": 0.5})
    run_worker(poll_interval=60, timeout=20)
    assert (fresh(job).status, fresh(job).attempts) == ("done", 2)


def test_worker__burst_leaves_a_retry_due_later_and_exits(job_factory, run_worker, settings):
    settings.PGQUEUE_RETRY_BACKOFF_BASE = 600
    job = job_factory(task=test_tasks.fails_first_attempt, args=[])
    worker = run_worker(timeout=20)
    assert (fresh(job).status, fresh(job).attempts) == ("scheduled", 1)
    assert worker.stats.failed == 1


@pytest.mark.parametrize("levels", [501, 1200])
def test_worker__too_deep_return_value_is_dead_at_once(job_factory, run_worker, levels):
    """Past the documented 500 levels: refused by validation (501), or where Django's
    normalize_json overflows the stack (1,200), a clean failure, not an internal error
    that leaves the job running until its lease expires."""
    job = job_factory(task=test_tasks.returns_nested, args=[levels], max_attempts=5)
    worker = run_worker(lease_seconds=30, timeout=20)
    row = fresh(job)
    assert (row.status, row.attempts, worker.stats.failed) == ("dead", 1, 1)
    (error,) = row.errors
    assert error["exception_class_path"] == "django_pgqueue.exceptions.InvalidResult"
    assert "nested more than 500 levels deep" in error["traceback"]


def test_worker__job_with_args_stored_too_deep_is_dead_at_once(job_factory, run_worker):
    """A row written before the depth was enforced (or around enqueue): its TaskResult
    cannot be built; the job fails cleanly with the reason instead of staying running."""
    from django.db import connection

    from django_pgqueue.taskapi import task_finished

    job = job_factory(args=[1, 2], max_attempts=5)
    text = "[" * 1200 + "1" + "]" * 1200
    with connection.cursor() as cursor:
        cursor.execute("UPDATE pgqueue_job SET args = %s::jsonb WHERE id = %s", [text, job.id])
    seen: list[str] = []

    def receiver(sender: object, task_result: object, **kwargs: object) -> None:
        seen.append(str(task_result))  # wants a TaskResult

    task_finished.connect(receiver)
    try:
        worker = run_worker(lease_seconds=30, timeout=20)
    finally:
        task_finished.disconnect(receiver)
    row = fresh(job)
    assert (row.status, row.attempts, worker.stats.failed) == ("dead", 1, 1)
    assert row.errors[0]["exception_class_path"] == "django_pgqueue.exceptions.InvalidJob"
    assert "args or kwargs are nested more than 500 levels deep" in row.errors[0]["traceback"]


@pytest.mark.django_db(transaction=True)
def test_worker__an_abort_replaced_by_a_database_error_still_aborts(monkeypatch):
    """The second stop signal's ``Abort`` can land inside a query; psycopg leaves the
    connection busy, and the clean-up on the way out fails on it with a database error
    that replaces the ``Abort``. The claim loop used to take that for a failed claim,
    retry, and wait out the running job (CI: test_shutdown__second_signal_exits_at_once
    did not exit in 10 s)."""
    from django.db import DatabaseError

    from django_pgqueue.signals import Abort

    worker = Worker(poll_interval=0.05, lease_seconds=30)

    def claim_interrupted(free: int) -> None:
        try:
            raise Abort("SIGTERM")
        except Abort:
            raise DatabaseError("can't change 'autocommit' now") from None

    monkeypatch.setattr(worker, "_claim_held", claim_interrupted)
    before = set(threading.enumerate())
    raised: list[BaseException] = []

    def run() -> None:
        from django.db import connections

        try:
            worker.run()
        except BaseException as exc:  # noqa: BLE001 - what the test looks at
            raised.append(exc)
        finally:
            connections.close_all()  # this thread's

    thread = threading.Thread(target=run)
    thread.start()
    try:
        thread.join(15)  # (without the fix it claims again every 0.5 s, for ever)
        assert not thread.is_alive(), "the claim loop went on after the Abort"
        assert len(raised) == 1 and isinstance(raised[0], Abort), raised
    finally:
        # An aborted worker leaves its threads as a dying process would: end them here
        # (the usual way out, with nothing held), and the sessions they hold, so that
        # the test database can be dropped.
        worker.stop()
        thread.join(15)
        worker._finish()
        for thread in set(threading.enumerate()) - before:
            thread.join(10)
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
