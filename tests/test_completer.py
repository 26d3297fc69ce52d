"""The completer: successful ordinary jobs recorded in batches, fenced row by row."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connections

from django_pgqueue import sql, validation
from django_pgqueue.framework import load_task, to_task_result
from django_pgqueue.models import Job
from django_pgqueue.sweeper import sweep
from django_pgqueue.worker import Worker
from django_pgqueue.worker.completer import Completion
from django_pgqueue.worker.state import Held
from testproject.demo.models import Execution

from .conftest import ManagedProcess, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def fresh(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def in_thread(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` on a thread of its own (its own connection, closed afterwards), as the
    completer thread does; return its result."""
    out: list[Any] = []

    def target() -> None:
        try:
            out.append(fn())
        finally:
            connections.close_all()

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(30)
    assert out, "the thread failed"
    return out[0]


def claimed_completions(worker: Worker, job_factory: Callable[..., Job], n: int) -> list:
    """Claim ``n`` add jobs for ``worker`` and hold them as the runners would after
    their tasks returned: one Completion each, value a + b."""
    for i in range(n):
        job_factory(args=[i, i])
    claimed = Job.objects.claim(worker.worker_id, limit=n, lease_seconds=60)
    assert len(claimed) == n
    batch = []
    for job in claimed:
        worker._state.held[job.id] = Held(job, started=0.0, completing=True)
        task_result = to_task_result(job, load_task(job.task))
        batch.append(Completion(job, sum(job.args), 0.001, task_result, None))
    return batch


def test_completer__flush_completes_many_jobs_in_one_statement(job_factory):
    worker = Worker(worker_id="w-batch")
    batch = claimed_completions(worker, job_factory, 25)

    def flush() -> list[str]:
        sent: list[str] = []

        def collect(execute: Any, sql: str, *args: Any) -> Any:
            sent.append(sql)
            return execute(sql, *args)

        # (An execute wrapper sees the statement's text on every Django version; the
        # debug cursor's log of a statement bound on the server need not have it.)
        with connections["default"].execute_wrapper(collect):
            worker._completer.flush(batch)
        return [text for text in sent if "pgqueue_job" in text]

    statements = in_thread(flush)
    assert len(statements) == 1
    assert statements[0] == sql.JOB_COMPLETE_MANY
    assert worker._completer.flushes == 1
    assert (worker.stats.done, worker.stats.lost) == (25, 0)
    rows = [fresh(c.job) for c in batch]
    assert {r.status for r in rows} == {"done"}
    assert [r.result for r in rows] == [sum(c.job.args) for c in batch]
    assert {r.lease_expires_at for r in rows} == {None}
    assert all(r.finished_at is not None for r in rows)
    assert worker._state.held == {}  # the slots and the heartbeat's entries are freed


def test_completer__lost_lease_is_not_marked_done_the_others_are(job_factory, caplog):
    worker = Worker(worker_id="w-fenced")
    batch = claimed_completions(worker, job_factory, 3)
    lost = batch[1].job
    # Between the run and the flush the lease was taken back and claimed elsewhere.
    Job.objects.filter(pk=lost.pk).update(lease_owner="someone-else")
    with caplog.at_level(logging.INFO, logger="django_pgqueue.worker"):
        in_thread(lambda: worker._completer.flush(batch))
    assert (worker.stats.done, worker.stats.lost) == (2, 1)
    row = fresh(lost)
    assert (row.status, row.lease_owner, row.result, row.finished_at) == (
        "running",
        "someone-else",
        None,
        None,
    )
    assert [fresh(c.job).status for c in (batch[0], batch[2])] == ["done", "done"]
    lost_lines = [r for r in caplog.records if getattr(r, "action", None) == "lease_lost"]
    assert [(r.job_id, r.worker_id) for r in lost_lines] == [(lost.id, "w-fenced")]
    assert "lease lost before complete was recorded" in lost_lines[0].getMessage()
    done_lines = [r for r in caplog.records if getattr(r, "action", None) == "done"]
    assert sorted(r.job_id for r in done_lines) == sorted([batch[0].job.id, batch[2].job.id])
    assert worker._state.held == {}


def test_completer__complete_many_answers_in_input_order(job_factory):
    jobs = [job_factory(args=[n, 0]) for n in range(4)]
    claimed = {j.id: j for j in Job.objects.claim("w-order", limit=4)}
    ordered = [claimed[j.id] for j in reversed(jobs)]  # descending ids
    Job.objects.filter(pk=jobs[0].pk).update(attempts=7)  # a newer attempt: fenced out
    recorded = Job.objects.complete_many([(j, j.args[0]) for j in ordered], "w-order")
    assert recorded == [True, True, True, False]
    assert [fresh(j).result for j in jobs] == [None, 1, 2, 3]
    assert Job.objects.complete_many([], "w-order") == []


def test_completer__heartbeat_extends_a_job_waiting_for_its_flush(job_factory, settings):
    """A finished job whose completion is not written yet keeps its lease: the sweeper
    finds nothing to take back long after the first lease ran out, and the job is done
    (attempt 1) once the stopping worker flushes."""
    settings.PGQUEUE_COMPLETION_FLUSH_INTERVAL = 600.0  # only the shutdown flushes
    job = job_factory(args=[20, 22])
    worker = Worker(lease_seconds=0.6, poll_interval=0.05, worker_id="w-waiting")
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:

        def completing() -> bool:
            with worker._state.lock:
                held = worker._state.held.get(job.id)
                return held is not None and held.completing

        wait_for(completing, timeout=10)
        first_lease = fresh(job).lease_expires_at
        wait_for(lambda: fresh(job).lease_expires_at > first_lease, timeout=10)
        with connections["default"].cursor() as cursor:

            def first_lease_ran_out() -> bool:
                cursor.execute("SELECT clock_timestamp() > %s", [first_lease])
                return bool(cursor.fetchone()[0])

            wait_for(first_lease_ran_out, timeout=10)
        assert sweep().recovered == 0
        row = fresh(job)
        assert (row.status, row.attempts, row.lease_owner) == ("running", 1, "w-waiting")
        assert worker._completer.flushes == 0
    finally:
        worker.stop()
        thread.join(10)
    assert not thread.is_alive()
    row = fresh(job)
    assert (row.status, row.result, row.attempts, row.errors) == ("done", 42, 1, [])
    assert (worker.stats.done, worker.stats.lost) == (1, 0)


@pytest.mark.slow
def test_completer__sigterm_flushes_pending_completions_before_exit(
    job_factory, manage: Callable[..., ManagedProcess]
):
    """A worker process told to stop writes the completions it still holds, then
    exits 0: every job ran once and is done, none is left to its lease."""
    jobs = [
        Job.objects.enqueue("testproject.demo.fault_tasks.ledger_plain", [n]) for n in range(6)
    ]
    worker = manage(
        "pgqueue_worker",
        "--concurrency",
        "3",
        "--poll-interval",
        "0.1",
        env={"PGQUEUE_COMPLETION_FLUSH_INTERVAL": "600"},  # only the shutdown flushes
    )
    ids = [j.id for j in jobs]
    wait_for(lambda: Execution.objects.filter(job_id__in=ids).count() == 6, timeout=30)
    # Every task ran; none is recorded yet (the flush interval has not run out).
    assert Job.objects.filter(pk__in=ids, status="running").count() == 6
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output()
    rows = [fresh(j) for j in jobs]
    assert [(r.status, r.result, r.attempts) for r in rows] == [("done", n, 1) for n in range(6)]
    assert sorted(Execution.objects.filter(job_id__in=ids).values_list("job_id", flat=True)) == (
        sorted(ids)
    )
    assert worker.output().count(" done in ") == 6  # one INFO line per job, at the flush


def test_completer__waiting_jobs_free_their_slots_up_to_one_batch(settings):
    """Finished jobs waiting for their flush do not count against the claim's free
    slots, except the part of the backlog beyond one full batch (back-pressure)."""
    settings.PGQUEUE_COMPLETION_BATCH_SIZE = 10
    worker = Worker(concurrency=4, batch_size=8)
    worker._state.held.update({i: Held(Job(id=i)) for i in range(2)})  # running
    assert worker._free_slots() == 6
    worker._state.held.update({i: Held(Job(id=i), completing=True) for i in range(2, 12)})
    assert worker._free_slots() == 6  # one batch waits: no slot taken
    worker._state.held.update({i: Held(Job(id=i), completing=True) for i in range(12, 15)})
    assert worker._free_slots() == 3  # three beyond the batch take three slots


def test_completer__idle_worker_writes_a_completion_at_once(job_factory, settings):
    """With nothing else in flight the completion does not wait for the flush interval
    (which only batches bursts): the job is done long before the interval ran out."""
    settings.PGQUEUE_COMPLETION_FLUSH_INTERVAL = 0.9
    job = job_factory(args=[1, 2])
    worker = Worker(poll_interval=0.05, worker_id="w-idle", burst=True)
    worker.run()
    row = fresh(job)
    assert (row.status, row.result) == ("done", 3)
    assert (row.finished_at - row.started_at).total_seconds() < 0.45
    assert worker._completer.flushes == 1


def test_completer__burst_waits_for_jobs_still_in_flight(job_factory, settings):
    """While another job of the worker still runs, a finished job waits (up to the
    interval) to share its statement; the last one to finish sends both at once."""
    settings.PGQUEUE_COMPLETION_FLUSH_INTERVAL = 0.9
    worker = Worker(worker_id="w-burst")
    first, second = claimed_completions(worker, job_factory, 2)
    worker._state.held[second.job.id].completing = False  # still running
    worker._completer.submit(first, last=False)
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(worker._completer._next_batch()))
    thread.start()
    wait_for(lambda: bool(worker._completer._cond._waiters), timeout=5)  # type: ignore[attr-defined]
    assert not out  # waiting for the job in flight
    worker._state.held[second.job.id].completing = True
    worker._completer.submit(second, last=True)
    thread.join(5)
    assert [c.job.id for c in out[0]] == [first.job.id, second.job.id]


@pytest.fixture
def completion_threads(monkeypatch) -> list[tuple[str, int]]:
    """(thread name, batch size) of every batched completion statement."""
    from django_pgqueue.manager import JobManager

    seen: list[tuple[str, int]] = []
    real = JobManager.complete_many_status

    def spy(self: JobManager, completions: Any, *args: Any, **kwargs: Any) -> list[str | None]:
        seen.append((threading.current_thread().name, len(completions)))
        return real(self, completions, *args, **kwargs)

    monkeypatch.setattr(JobManager, "complete_many_status", spy)
    return seen


def test_completer__idle_worker_records_on_the_runner_thread(
    job_factory, run_worker, completion_threads
):
    """Nothing else in flight: the runner writes its job's completion itself (same fenced
    statement) instead of handing it to the completer thread."""
    job = job_factory(args=[2, 3])
    worker = run_worker(worker_id="w-inline")
    assert (fresh(job).status, fresh(job).result) == ("done", 5)
    assert completion_threads == [("pgqueue-runner-0", 1)]
    assert worker._completer.flushes == 1


def test_completer__a_burst_still_goes_to_the_completer_thread(
    job_factory, run_worker, completion_threads, settings
):
    settings.PGQUEUE_COMPLETION_FLUSH_INTERVAL = 0.05
    jobs = [job_factory(args=[i, i]) for i in range(40)]
    run_worker(concurrency=4, batch_size=40)
    assert {fresh(j).status for j in jobs} == {"done"}
    assert sum(n for _, n in completion_threads) == 40
    assert "pgqueue-completer" in {name for name, _ in completion_threads}


def test_worker__freed_slot_wakes_the_claim_loop_only_when_it_wants_slots():
    """After a short claim the loop waits for new work only (NOTIFY, poll): a job that
    ends then does not wake it for a claim that would find nothing."""
    worker = Worker(worker_id="w-slots")
    state = worker._state
    state.slots_wanted.set()
    state.slot_freed()
    assert state.wakeup.is_set()
    state.wakeup.clear()
    state.slots_wanted.clear()
    state.slot_freed()
    assert not state.wakeup.is_set()
    state.forget([])  # a completion written: the same rule
    assert not state.wakeup.is_set()


def test_completer__batch_refused_for_one_row_writes_the_others_and_fails_that_one(
    job_factory, caplog
):
    """A result jsonb refuses (here past validation: text it refuses, as a bug or a
    limit we did not know would make) is a permanent error, not one retried for a
    lease: the batch is split, the others are done once, the bad row is dead at once
    with the database's reason (attempts left or not)."""
    worker = Worker(worker_id="w-refused", lease_seconds=300)
    batch = claimed_completions(worker, job_factory, 30)
    for c in batch:
        c.text = str(c.value)
    bad = batch[17]
    bad.text = '"\\u0000"'  # jsonb: unsupported Unicode escape sequence (SQLSTATE 22P05)
    with caplog.at_level(logging.INFO, logger="django_pgqueue.worker"):
        in_thread(lambda: worker._completer.flush(batch))  # fails on a 30 s join if retried
    row = fresh(bad.job)
    assert (row.status, row.attempts, row.max_attempts, row.result) == ("dead", 1, 5, None)
    (error,) = row.errors
    assert error["exception_class_path"] == "django_pgqueue.exceptions.InvalidResult"
    assert "PostgreSQL refused the task's return value" in error["traceback"]
    assert "unsupported Unicode escape sequence" in error["traceback"]
    others = [fresh(c.job) for c in batch if c is not bad]
    assert {(r.status, r.attempts) for r in others} == {("done", 1)}
    assert [r.result for r in others] == [c.value for c in batch if c is not bad]
    assert (worker.stats.done, worker.stats.failed, worker.stats.lost) == (29, 1, 0)
    assert worker._state.held == {}
    assert not [r for r in caplog.records if "retrying in" in r.getMessage()]


def test_completer__refused_data_is_told_from_a_transient_error():
    import psycopg.errors
    from django.db import DataError, OperationalError

    from django_pgqueue.worker.state import refused_data

    def wrapped(django_class: type, error: Exception) -> Exception:
        exc = django_class(str(error))
        exc.__cause__ = error
        return exc

    too_long = psycopg.errors.ProgramLimitExceeded("jsonb strings cannot exceed 268435455 bytes")
    assert refused_data(wrapped(OperationalError, too_long))  # SQLSTATE 54000
    assert refused_data(wrapped(DataError, psycopg.errors.NumericValueOutOfRange("overflow")))
    assert not refused_data(wrapped(OperationalError, psycopg.errors.AdminShutdown("bye")))
    assert not refused_data(OperationalError("connection lost"))


def test_completer__job_cancelled_after_its_last_lease_extension_is_reported_cancelled(
    job_factory, caplog
):
    """The row ends 'cancelled' (result kept): the worker logs, signals (FAILED) and
    counts it as cancelled, not done."""
    from django_pgqueue.taskapi import task_finished

    worker = Worker(worker_id="w-late-cancel")
    batch = claimed_completions(worker, job_factory, 3)
    late = batch[1].job
    assert Job.objects.cancel([late.id]).requested == [late.id]  # after the task returned
    finished: list[tuple[str, str]] = []

    def receiver(sender: object, task_result: Any, **kwargs: object) -> None:
        finished.append((task_result.id, task_result.status))

    task_finished.connect(receiver)
    try:
        with caplog.at_level(logging.INFO, logger="django_pgqueue.worker"):
            in_thread(lambda: worker._completer.flush(batch))
    finally:
        task_finished.disconnect(receiver)
    row = fresh(late)
    assert (row.status, row.result) == ("cancelled", sum(late.args))
    assert (worker.stats.done, worker.stats.cancelled, worker.stats.failed) == (2, 1, 0)
    assert sorted(finished) == sorted(
        [(str(c.job.id), "FAILED" if c.job is late else "SUCCESSFUL") for c in batch]
    )
    lines = {r.job_id: r.getMessage() for r in caplog.records if hasattr(r, "job_id")}
    assert f"job {late.id} testproject.demo.tasks.add cancelled after" in lines[late.id]
    assert " done in " in lines[batch[0].job.id]


@pytest.mark.slow
def test_process__a_result_jsonb_cannot_hold_fails_its_job_alone(
    job_factory, manage: Callable[..., ManagedProcess]
):
    """One job of a burst returns an int of more digits than jsonb's numeric holds (its
    worker lifted Python's own limit): that job is dead on its first attempt with the
    reason; the 29 others of its batches ran once and are done (none waits out a lease
    or runs twice)."""
    ids = [
        Job.objects.enqueue("testproject.demo.fault_tasks.ledger_plain", [n, 20]).id
        for n in range(29)
    ]
    bad = Job.objects.enqueue("tests.tasks.returns_huge_int", [140_000], max_attempts=5)
    worker = manage(
        "pgqueue_worker", "--burst", "--concurrency", "4", "--poll-interval", "0.1",
        "--lease-seconds", "30",
    )  # fmt: skip
    assert worker.wait(60) == 0, worker.output()
    row = fresh(bad)
    assert (row.status, row.attempts) == ("dead", 1), worker.output()
    assert "return value[0] is an int of more than 131072 digits" in row.errors[0]["traceback"]
    rows = Job.objects.filter(pk__in=ids)
    assert sorted((r.status, r.attempts, r.result) for r in rows) == [
        ("done", 1, n) for n in range(29)
    ]
    runs = Execution.objects.filter(job_id__in=ids).values_list("job_id", flat=True)
    assert sorted(runs) == sorted(ids)  # each ran once


@pytest.mark.parametrize(
    "value",
    [None, True, False, 0, -7, 10**15 - 1, -(10**15) + 1, 10**15, 2**70, 1.5, "x", [1], {}],
)
def test_returned__fast_path_gives_what_the_general_path_gives(value):
    from django_pgqueue.taskapi import normalize_json

    normal = normalize_json(value)
    assert validation.returned(value) == (normal, validation.result_json(normal))


def test_completer__a_groups_results_past_256_mb_are_named_in_the_error():
    """The last member of a group whose results together pass jsonb's 256 MB is refused
    for all of them: its error says so, not only "the task's return value" (issue 28
    item 18). PostgreSQL's own words are matched (a real 256 MB array is too big for a
    test)."""
    from django_pgqueue.worker.state import refusal

    reason = "total size of jsonb array elements exceeds the maximum of 268435455 bytes"
    message = refusal(reason)
    assert message.startswith("PostgreSQL refused the task's return value: total size")
    assert "members' results together" in message and "256 MB" in message
    assert "group" not in refusal("unsupported Unicode escape sequence")
