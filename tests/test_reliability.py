"""Faults against real worker processes and real PostgreSQL (catalogue: reliability.md).

Each test injects one fault (SIGSTOP past the lease, SIGKILL by a poison pill, a
terminated backend, a lock that stalls the heartbeat, SIGTERM mid-job) and then checks
the oracle: no job lost or stuck, fenced writes from zombies, and the ``Execution``
ledger (one row per execution) showing exactly-once effects for transactional tasks.
Waits are on conditions with deadlines, never bare sleeps.
"""

from __future__ import annotations

import re
import signal
import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from django_pgqueue import sql
from django_pgqueue.models import Job
from django_pgqueue.sweeper import sweep
from django_pgqueue.taskapi import FRAMEWORK
from django_pgqueue.tasks import PgQueueTask, current_job
from django_pgqueue.worker import Worker
from testproject.demo import fault_tasks
from testproject.demo.models import Execution

from .conftest import ManagedProcess, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

FAST = ("--lease-seconds", "1", "--poll-interval", "0.1")


def job(job_id: int) -> Job:
    return Job.objects.get(pk=job_id)


def ledger(job_id: int) -> list[tuple[str, int]]:
    """(kind, attempt) of every recorded execution of a job."""
    return list(
        Execution.objects.filter(job_id=job_id).order_by("id").values_list("kind", "attempt")
    )


def sweep_until(condition: Callable[[], Any], timeout: float = 20.0) -> Any:
    """Run the sweeper (in this process) until ``condition()`` holds."""

    def swept() -> Any:
        sweep()
        return condition()

    return wait_for(swept, timeout=timeout, interval=0.1)


def in_log(proc: ManagedProcess, text: str, count: int = 1) -> bool:
    return proc.output().count(text) >= count


def backends(prefix: str) -> list[int]:
    """Server pids of this test database's connections labelled ``prefix...``."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name LIKE %s",
            [prefix + "%"],
        )
        return [row[0] for row in cursor.fetchall()]


def terminate(pids: list[int]) -> None:
    with connection.cursor() as cursor:
        for pid in pids:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])


# --- task options and context -------------------------------------------------------


def test_task_options__kept_by_using_and_stored_on_the_job() -> None:
    assert isinstance(fault_tasks.ledger_tx, PgQueueTask)
    moved = fault_tasks.ledger_tx.using(priority=7, queue_name="other")
    assert (moved.transactional, moved.priority, moved.queue_name) == (True, 7, "other")
    result = fault_tasks.poison.enqueue()
    assert job(int(result.id)).max_attempts == 3  # @task(max_attempts=3)
    assert Job.objects.enqueue(fault_tasks.poison).max_attempts == 3  # the manager too
    assert Job.objects.enqueue(fault_tasks.poison, max_attempts=7).max_attempts == 7


def test_current_job__exposes_id_attempt_and_idempotency_key() -> None:
    enqueued = Job.objects.enqueue(
        "testproject.demo.fault_tasks.ledger_plain", [5], idempotency_key="order-5"
    )
    seen: list[Any] = []
    original = fault_tasks.record

    def spy(kind: str) -> int:
        seen.append(current_job())
        return original(kind)

    fault_tasks.record = spy  # the task looks the helper up at call time
    try:
        Worker(burst=True, worker_id="w-ctx").run()
    finally:
        fault_tasks.record = original
    info = seen[0]
    assert (info.id, info.attempt, info.idempotency_key) == (enqueued.id, 1, "order-5")
    assert (info.worker_id, info.transactional) == ("w-ctx", False)
    assert current_job() is None  # reset after the job


# --- transactional completion -------------------------------------------------------


def test_transactional__effect_commits_with_completion() -> None:
    result = fault_tasks.ledger_tx.enqueue(n=3)
    failing = Job.objects.enqueue("testproject.demo.fault_tasks.leak_transaction")
    stats = Worker(burst=True, worker_id="w-tx").run()
    done = job(int(result.id))
    assert (done.status, done.result, done.attempts) == ("done", 3, 1)
    assert ledger(done.id) == [("tx", 1)]
    assert stats.done == 1
    # C34: a task that leaves atomic() open fails; its write is rolled back with the
    # discarded connection, and the worker carried on.
    leaked = job(failing.id)
    assert leaked.status == "scheduled"
    assert leaked.errors[-1]["exception_class_path"].endswith("TransactionLeak")
    assert ledger(leaked.id) == []


def test_transactional__failure_rolls_back_effect(monkeypatch: pytest.MonkeyPatch) -> None:
    """An exception after the task wrote something: nothing stays, the failure is
    recorded (outside the rolled-back transaction) and a retry is scheduled."""
    enqueued = Job.objects.enqueue("testproject.demo.fault_tasks.ledger_tx", [1])
    original = fault_tasks.record

    def write_then_raise(kind: str) -> int:
        original(kind)
        raise RuntimeError("after the write")

    monkeypatch.setattr(fault_tasks, "record", write_then_raise)
    Worker(burst=True, worker_id="w-txfail").run()
    failed = job(enqueued.id)
    assert failed.status == "scheduled"
    assert "after the write" in failed.errors[-1]["traceback"]
    assert ledger(failed.id) == []


def test_transactional__child_jobs_roll_back_with_the_failure() -> None:
    """C40: a transactional task that enqueues a child and then raises leaves neither
    its effect nor the child (enqueue joins the task's transaction)."""
    parent = Job.objects.enqueue("testproject.demo.fault_tasks.enqueue_child_then_raise")
    Worker(burst=True, worker_id="w-child").run()
    assert job(parent.id).status == "scheduled"
    assert Job.objects.count() == 1
    assert ledger(parent.id) == []


def test_transactional__on_commit_error_after_commit_keeps_job_done() -> None:
    """C36: an on_commit callback that raises after the commit does not turn a
    committed job into a failure, and the worker carries on."""
    enqueued = Job.objects.enqueue("testproject.demo.fault_tasks.on_commit_raises")
    after = Job.objects.enqueue("testproject.demo.fault_tasks.ledger_plain", [2])
    stats = Worker(burst=True, worker_id="w-oncommit").run()
    assert (job(enqueued.id).status, job(enqueued.id).errors) == ("done", [])
    assert ledger(enqueued.id) == [("tx", 1)]
    assert job(after.id).status == "done"
    assert stats.done == 2


def test_worker__task_raising_system_exit_fails_and_worker_carries_on() -> None:
    """C32: a BaseException from a task is that job's failure; the runner survives."""
    exiting = Job.objects.enqueue("testproject.demo.fault_tasks.system_exit")
    after = Job.objects.enqueue("testproject.demo.fault_tasks.ledger_plain", [3])
    Worker(burst=True, worker_id="w-exit", concurrency=1).run()
    failed = job(exiting.id)
    assert failed.status == "scheduled"
    assert failed.errors[-1]["exception_class_path"] == "builtins.SystemExit"
    assert job(after.id).status == "done"


def test_worker__row_naming_a_non_task_callable_is_dead_without_calling_it() -> None:
    """C88: a row written behind the API's back, naming ``os.system``, is dead-lettered
    as an unknown task; nothing is called."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgqueue_job (backend, queue, task, args, kwargs, priority, status,"
            " attempts, max_attempts, errors) VALUES ('default', 'default', 'os.system',"
            " '[\"touch /tmp/pgqueue-pwned\"]', '{}', 0, 'pending', 0, 5, '[]')"
            " RETURNING id"
        )
        (job_id,) = cursor.fetchone()
    Worker(burst=True, worker_id="w-rce").run()
    dead = job(job_id)
    assert (dead.status, dead.attempts) == ("dead", 1)
    assert dead.errors[-1]["exception_class_path"].endswith("TaskNotFound")
    assert f"not a {FRAMEWORK}.Task" in dead.errors[-1]["traceback"]


# --- connections left dirty by a task ---------------------------------------------

LEAK_KINDS = fault_tasks.LEAK_KINDS


def probes_around(leaking: Job) -> tuple[Job, Job]:
    """Session probes that run on the same runner right before and after ``leaking``
    (with one runner and one job per claim, priorities order them)."""
    before = Job.objects.enqueue(fault_tasks.session_probe, priority=leaking.priority + 1)
    after = Job.objects.enqueue(fault_tasks.session_probe, priority=leaking.priority - 1)
    return before, after


@pytest.mark.parametrize("kind", LEAK_KINDS)
def test_runner__task_leaving_its_connection_dirty_fails_and_the_next_job_gets_a_clean_one(
    kind: str,
) -> None:
    """Defect: the leak check read only Django's flags, so a raw BEGIN, the driver's
    autocommit turned off or session state (SET ROLE, search_path, an advisory lock, a
    WITH HOLD cursor, PREPARE, LISTEN, a temporary table) passed it and reached the
    next job on that connection. Now the attempt fails with TransactionLeak (writes in
    the leaked transaction rolled back) and the next job gets a clean session."""
    leaking = Job.objects.enqueue(fault_tasks.leak, kwargs={"kind": kind}, priority=5)
    before, after = probes_around(leaking)
    stats = Worker(burst=True, worker_id="w-leak", concurrency=1, batch_size=1).run()
    failed = job(leaking.id)
    assert (failed.status, failed.attempts) == ("scheduled", 1)
    assert failed.errors[-1]["exception_class_path"].endswith("TransactionLeak")
    assert ledger(leaking.id) == [("plain", 1)]  # what it wrote in the leaked tx is gone
    assert job(before.id).status == job(after.id).status == "done"
    assert job(after.id).result == job(before.id).result
    assert job(after.id).result["in_transaction"] is False
    assert (stats.done, stats.failed) == (2, 1)


def test_runner__task_that_reconnects_is_no_leak_and_the_next_job_gets_a_clean_connection() -> (
    None
):
    """A connection the task replaced has no baseline to compare with: it is dropped
    (so the next job starts clean) without failing a task that did nothing wrong."""
    task = Job.objects.enqueue(fault_tasks.reconnect, priority=5)
    before, after = probes_around(task)
    Worker(burst=True, worker_id="w-leak", concurrency=1, batch_size=1).run()
    assert job(task.id).status == "done"
    assert ledger(task.id) == [("plain", 1)]
    assert job(after.id).result == job(before.id).result


def test_runner__session_check_off_still_catches_transactions(settings: Any) -> None:
    """``PGQUEUE_CHECK_SESSION_STATE = False`` skips the one server-side statement, so
    session state goes unseen, but an open transaction is still caught for free."""
    settings.PGQUEUE_CHECK_SESSION_STATE = False
    unseen = Job.objects.enqueue(
        fault_tasks.leak, kwargs={"kind": "statement_timeout"}, priority=6
    )
    begin = Job.objects.enqueue(fault_tasks.leak, kwargs={"kind": "raw_begin"}, priority=5)
    Worker(burst=True, worker_id="w-leak", concurrency=1, batch_size=1).run()
    assert job(unseen.id).status == "done"
    assert job(begin.id).errors[-1]["exception_class_path"].endswith("TransactionLeak")


@pytest.mark.parametrize("kind", ["begin", "raw_begin", "autocommit_off", "advisory_lock"])
def test_runner__task_leaking_then_raising_records_its_own_error_outside_the_leak(
    kind: str,
) -> None:
    """Defect: a task that leaked a raw transaction and then raised had its failure
    written inside that transaction (lost when the connection closed). Now the
    connection is discarded first: the failure is committed, with the task's error."""
    leaking = Job.objects.enqueue(
        fault_tasks.leak, kwargs={"kind": kind, "then_raise": True}, priority=5
    )
    before, after = probes_around(leaking)
    Worker(burst=True, worker_id="w-leak", concurrency=1, batch_size=1).run()
    failed = job(leaking.id)
    assert (failed.status, failed.attempts) == ("scheduled", 1)
    assert failed.errors[-1]["exception_class_path"] == "builtins.RuntimeError"
    assert job(after.id).result == job(before.id).result


@pytest.mark.parametrize(
    ("kind", "status", "effects"),
    [
        ("advisory_lock", "done", [("tx", 1)]),
        ("hold_cursor", "done", [("tx", 1)]),
        ("statement_timeout", "done", [("tx", 1)]),
        # The role applies to the completion in the same transaction: it is refused,
        # so the effect rolls back, and the SET with it (nothing left to discard).
        ("set_role", "scheduled", []),
    ],
)
def test_runner__transactional_task_leaving_session_state_has_its_connection_discarded(
    kind: str, status: str, effects: list[tuple[str, int]], caplog: pytest.LogCaptureFixture
) -> None:
    """A transactional task's effect and completion commit together (or not); session
    state it left beyond the transaction is dropped with the connection, and said so."""
    leaking = Job.objects.enqueue(fault_tasks.leak_tx, kwargs={"kind": kind}, priority=5)
    before, after = probes_around(leaking)
    Worker(burst=True, worker_id="w-leak", concurrency=1, batch_size=1).run()
    assert job(leaking.id).status == status
    assert ledger(leaking.id) == effects
    assert job(after.id).result == job(before.id).result
    assert ("the connection was discarded" in caplog.text) == (status == "done")


#: Session changes the worker resets (fault_tasks.SESSION_CHANGES), and a PREPARE under
#: psycopg's own prefix, which it fails as a leak.
SESSION_ITEMS = [*fault_tasks.SESSION_CHANGES, "_pg3_prepare"]


@pytest.mark.parametrize("item", SESSION_ITEMS)
def test_runner__session_change_does_not_reach_the_next_job(item: str) -> None:
    """Defect: settings outside the compared list (extra_float_digits made the next job
    read 1.23456789 as 1.0, client_encoding LATIN1 made it fail, work_mem, a custom
    setting, ...), setseed() and a PREPARE named like psycopg's own (_pg3_*) passed the
    check and reached the next job on that connection. Now a setting is reset to the
    connection's own, the generator reseeded, and the PREPARE fails the attempt."""
    if item == "_pg3_prepare":
        changing = Job.objects.enqueue(
            fault_tasks.change_session, ["PREPARE _pg3_leak AS SELECT 1"], priority=5
        )
    else:
        sql_text = fault_tasks.SESSION_CHANGES[item]
        changing = Job.objects.enqueue(fault_tasks.change_session, [sql_text], priority=5)
    name = "work_mem" if item == "_pg3_prepare" else item
    before = Job.objects.enqueue(fault_tasks.session_sample, [name], priority=6)
    after = Job.objects.enqueue(fault_tasks.session_sample, [name], priority=4)
    Worker(burst=True, worker_id="w-leak", concurrency=1, batch_size=1).run()
    changed = job(changing.id)
    seen, clean = job(after.id).result, job(before.id).result
    assert job(after.id).status == "done", job(after.id).errors
    assert (seen["float"], seen["text"], seen["prepared"]) == (1.23456789, "naïve", 0)
    if item == "_pg3_prepare":
        assert changed.status == "scheduled"
        assert "prepared statements" in changed.errors[-1]["traceback"]
        return
    assert changed.status == "done", changed.errors
    if item == "random":
        with connection.cursor() as cursor:
            cursor.execute("SELECT setseed(0.5)")
            cursor.execute("SELECT random()")
            (seeded,) = cursor.fetchone()
        assert seen["random"] != seeded
    elif item == "app.tenant":
        assert seen["setting"] in (None, "")  # as after RESET: defined, empty
    else:
        assert seen["setting"] == clean["setting"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["begin", "raw_begin", "autocommit_off"])
def test_worker__leaked_raw_transaction_holds_no_lock_and_hides_no_later_write(
    manage: Callable[..., ManagedProcess], kind: str
) -> None:
    """Defect, in a live worker: after a task leaked a transaction Django did not see,
    later jobs were marked done by the completer while their writes sat uncommitted in
    that transaction, and transactional jobs failed, their rows locked by an idle in
    transaction backend. Now, while the worker still runs, every done job's effect is
    committed and no runner backend is left in a transaction."""
    leaking = Job.objects.enqueue(fault_tasks.leak, kwargs={"kind": kind}, priority=5)
    later = [Job.objects.enqueue(fault_tasks.ledger_plain, [n]) for n in range(3)]
    later.append(Job.objects.enqueue(fault_tasks.ledger_tx, [9]))
    worker = manage("pgqueue_worker", *FAST, "--concurrency", "1")
    wait_for(lambda: all(job(j.id).status == "done" for j in later))
    assert all(ledger(j.id) for j in later)  # committed: visible from another connection
    assert job(leaking.id).errors[-1]["exception_class_path"].endswith("TransactionLeak")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name LIKE 'pgqueue runner%%' AND state LIKE 'idle in%%'"
        )
        assert cursor.fetchone()[0] == 0
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0


@pytest.mark.slow
@pytest.mark.parametrize(
    ("task", "ledger_after"),
    [
        # Transactional: the zombie's effect rolls back with its fenced-out completion.
        ("slow_tx", [("tx", 2)]),
        # Ordinary: at-least-once, the zombie's effect stays (documented), the row
        # does not change.
        ("slow_plain", [("plain", 2), ("plain", 1)]),
    ],
)
def test_lease_lost__zombie_completion_is_fenced(
    manage: Callable[..., ManagedProcess], task: str, ledger_after: list[tuple[str, int]]
) -> None:
    """C2/C3: a worker paused past its lease resumes after another worker finished the
    job; its completion changes nothing."""
    enqueued = Job.objects.enqueue(f"testproject.demo.fault_tasks.{task}", [1.5])
    zombie = manage("pgqueue_worker", *FAST, "--worker-id", "zombie")
    wait_for(lambda: job(enqueued.id).status == "running")
    wait_for(lambda: backends("pgqueue runner"))  # the task started (not just claimed)
    zombie.signal(signal.SIGSTOP)
    sweep_until(lambda: job(enqueued.id).status == "pending")
    rescuer = manage("pgqueue_worker", *FAST, "--worker-id", "rescuer")
    wait_for(lambda: job(enqueued.id).status == "done")
    zombie.signal(signal.SIGCONT)
    # The zombie's own attempt ends: fenced completion (plain) or rolled back (tx).
    wait_for(lambda: in_log(zombie, "lease lost before") or in_log(zombie, "lease lost while"))
    finished = job(enqueued.id)
    assert finished.attempts == 2
    assert finished.errors[0]["worker_id"] == "zombie"
    assert finished.errors[0]["exception_class_path"].endswith("LeaseExpired")
    assert sorted(ledger(enqueued.id)) == sorted(ledger_after)
    assert Job.objects.get(pk=enqueued.id).status == "done"
    for proc in (zombie, rescuer):
        proc.signal(signal.SIGTERM)
        assert proc.wait() == 0


@pytest.mark.slow
def test_lease_lost__prefetched_job_is_not_run_by_the_paused_worker(
    manage: Callable[..., ManagedProcess],
) -> None:
    """C2: a worker paused past its leases holds a prefetched job it has not started;
    once resumed, its heartbeat finds both leases gone, so it does not run that job
    on the stale attempt (no duplicate effect); it claims it afresh instead."""
    # Still sleeping when resumed, so the heartbeat surely runs before the runner frees.
    running = Job.objects.enqueue("testproject.demo.fault_tasks.slow_plain", [5.0])
    worker = manage("pgqueue_worker", *FAST, "--batch-size", "2")
    wait_for(lambda: backends("pgqueue runner"))
    # Higher priority: after the pause it is claimed (and run) before the slow job.
    prefetched = Job.objects.enqueue("testproject.demo.fault_tasks.ledger_plain", [1], priority=10)
    wait_for(lambda: job(prefetched.id).status == "running")
    worker.signal(signal.SIGSTOP)
    sweep_until(lambda: job(running.id).status == job(prefetched.id).status == "pending")
    worker.signal(signal.SIGCONT)
    wait_for(lambda: in_log(worker, "lease lost before the task started"))
    wait_for(lambda: job(prefetched.id).status == "done")
    assert ledger(prefetched.id) == [("plain", 2)]  # only the fresh attempt ran


# --- lease safety -------------------------------------------------------------------


@pytest.mark.slow
def test_heartbeat__stops_extending_after_task_timeout(
    manage: Callable[..., ManagedProcess],
) -> None:
    """C16/C30: ``@task(timeout=1)`` hangs for 3 s: its lease is not extended past the
    timeout, the sweeper takes the job back while it still runs, and what the late
    return of that first attempt writes (a timed-out failure) is fenced out."""
    enqueued = Job.objects.enqueue("testproject.demo.fault_tasks.hang", [3.0])
    worker = manage("pgqueue_worker", *FAST, "--concurrency", "1", "--worker-id", "hung")
    wait_for(lambda: job(enqueued.id).status == "running")
    wait_for(lambda: in_log(worker, "timeout; no longer extending its lease"))
    sweep_until(lambda: job(enqueued.id).status != "running")
    rescued = job(enqueued.id)
    assert rescued.errors[0]["exception_class_path"].endswith("LeaseExpired")
    assert rescued.errors[0]["attempt"] == 1
    wait_for(lambda: in_log(worker, "lease lost before fail was recorded"), timeout=10)
    assert job(enqueued.id).status != "done" or job(enqueued.id).attempts >= 2


def test_heartbeat__job_timeout_setting_applies_to_plain_tasks(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """C16: ``PGQUEUE_JOB_TIMEOUT_SECONDS`` stops extensions for tasks without their own
    ``timeout``: the lease runs out while the task still runs and the sweeper takes
    the job back; the late completion is fenced out."""
    settings.PGQUEUE_JOB_TIMEOUT_SECONDS = 0.3
    enqueued = Job.objects.enqueue("testproject.demo.fault_tasks.slow_plain", [2.0])
    worker = Worker(worker_id="w-timeout", lease_seconds=0.6, poll_interval=0.05, max_jobs=1)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    sweep_until(lambda: job(enqueued.id).errors)  # rescued while the task still runs
    assert job(enqueued.id).errors[0]["worker_id"] == "w-timeout"
    thread.join(10)
    assert not thread.is_alive()
    assert worker.stats.lost == 1 and worker.stats.done == 0
    assert "timeout; no longer extending its lease" in caplog.text
    assert job(enqueued.id).status == "pending"


@pytest.mark.parametrize("writer", ["completer", "transactional", "fail", "release"])
def test_heartbeat__job_finished_between_snapshot_and_extension_is_no_lost_lease(
    writer: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Defect: the heartbeat snapshots the held jobs, then extends their leases; a job
    recorded in between (by the completer, a runner, or a release) is not extended,
    and was logged as "lease lost" with no fault at all. Deterministic: the outcome is
    written from inside the extension call, after the snapshot."""
    from django_pgqueue.backend import PgQueueBackend
    from django_pgqueue.manager import JobManager
    from django_pgqueue.worker.completer import Completer, Completion
    from django_pgqueue.worker.heartbeat import Heartbeat
    from django_pgqueue.worker.outcomes import Reporter
    from django_pgqueue.worker.runner import JobRunner
    from django_pgqueue.worker.state import Held, WorkerState

    task = fault_tasks.ledger_tx if writer == "transactional" else fault_tasks.ledger_plain
    Job.objects.enqueue(task, [1])
    (claimed,) = Job.objects.claim("w-hb", limit=1, lease_seconds=30)
    state = WorkerState(alias="default", worker_id="w-hb", lease_seconds=30)
    state.held[claimed.id] = Held(claimed)
    reporter = Reporter(sender=PgQueueBackend, worker_id="w-hb")
    completer = Completer(state, reporter=reporter, interval=0.0, max_batch=10)
    runner = JobRunner(state, reporter=reporter, completer=completer)
    extend = JobManager.extend_leases

    def finish_then_extend(self: JobManager, *args: Any, **kwargs: Any) -> set[int]:
        if writer == "completer":
            state.held[claimed.id].completing = True  # as the runner does at submit
            result = fault_tasks.ledger_plain.get_result(str(claimed.id))
            completer.flush([Completion(claimed, 1, 0.0, result, None)])
        elif writer == "transactional":
            runner.execute(claimed)  # runs the task and commits its completion
        elif writer == "fail":
            runner._record_failure(claimed, RuntimeError("boom"))
        else:
            runner.release(claimed)
        return extend(self, *args, **kwargs)

    monkeypatch.setattr(JobManager, "extend_leases", finish_then_extend)
    Heartbeat(state).beat()
    assert job(claimed.id).status != "running"  # it did finish during the beat
    assert "lease lost" not in caplog.text
    assert state.stats.lost == 0
    assert not (claimed.id in state.held and state.held[claimed.id].lost)


def test_heartbeat__a_lease_really_taken_back_is_still_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The other side of the fix above: a held job whose lease another worker took is
    marked lost (so a prefetched copy is never started) and logged."""
    from django_pgqueue.worker.heartbeat import Heartbeat
    from django_pgqueue.worker.state import Held, WorkerState

    Job.objects.enqueue(fault_tasks.ledger_plain, [1])
    (claimed,) = Job.objects.claim("w-hb", limit=1, lease_seconds=30)
    Job.objects.filter(pk=claimed.id).update(lease_owner="someone-else")
    state = WorkerState(alias="default", worker_id="w-hb", lease_seconds=30)
    state.held[claimed.id] = Held(claimed)
    Heartbeat(state).beat()
    assert state.held[claimed.id].lost
    assert "lease lost (expired and taken back)" in caplog.text


@pytest.mark.slow
def test_heartbeat__stalled_extension_stops_claiming(
    manage: Callable[..., ManagedProcess], other_connection: Callable[..., Any]
) -> None:
    """C18/C52: a lease extension blocked on a row lock times out (statement_timeout)
    instead of hanging; while it fails the worker claims nothing; then it recovers."""
    running = Job.objects.enqueue("testproject.demo.fault_tasks.slow_plain", [8.0])
    worker = manage(
        "pgqueue_worker", "--lease-seconds", "2", "--poll-interval", "0.1",
        "--concurrency", "2",
    )  # fmt: skip
    wait_for(lambda: job(running.id).status == "running")
    blocker = other_connection()
    blocker.execute("SELECT id FROM pgqueue_job WHERE id = %s FOR UPDATE", [running.id])
    wait_for(lambda: in_log(worker, "heartbeat failed"))
    waiting = Job.objects.enqueue("testproject.demo.fault_tasks.ledger_plain", [1])
    wait_for(lambda: in_log(worker, "heartbeat failed", 3))
    assert job(waiting.id).status == "pending"  # nothing claimed while blind
    blocker.rollback()
    wait_for(lambda: job(waiting.id).status == "done")
    assert job(running.id).lease_owner is not None
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
    assert job(running.id).status == "done"
    assert job(running.id).attempts == 1


def test_heartbeat__thread_death_stops_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """C18: if the lease-extension thread dies the worker stops claiming and reports a
    fatal error (the command exits 3) instead of running jobs nobody extends."""
    worker = Worker(worker_id="w-dead-hb", poll_interval=0.05, lease_seconds=0.3)

    def die() -> None:
        raise SystemExit("heartbeat crashed")

    monkeypatch.setattr(worker._heartbeat, "beat", die)
    monkeypatch.setattr(threading, "excepthook", lambda args: None)
    done = threading.Event()
    runner = threading.Thread(target=lambda: (worker.run(), done.set()), daemon=True)
    runner.start()
    assert done.wait(10)
    assert worker.fatal == "the heartbeat thread died"


# --- sweeper versus completion (River #1302, Solid Queue #589) ------------------------


def expired_claim(worker_id: str) -> Job:
    """A job claimed by ``worker_id`` whose lease already ran out (database clock)."""
    enqueued = Job.objects.enqueue("testproject.demo.fault_tasks.ledger_plain", [1])
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp() - interval '1 hour'")
        (an_hour_ago,) = cursor.fetchone()
    (claimed,) = Job.objects.claim(worker_id, limit=1, lease_seconds=1, now=an_hour_ago)
    assert claimed.id == enqueued.id
    return claimed


@pytest.mark.concurrency
def test_sweep__skips_a_job_whose_completion_is_committing(
    other_connection: Callable[..., Any],
) -> None:
    """C7: the worker's completion holds the row (its transaction not yet committed)
    when the sweeper runs: the sweeper skips it without waiting, the completion
    commits, and the job stays done with no rescue recorded."""
    claimed = expired_claim("w1")
    completing = other_connection()
    completing.execute(
        sql.JOB_COMPLETE,
        {
            "id": claimed.id,
            "worker_id": "w1",
            "attempt": 1,
            "claimed_at": claimed.last_attempted_at,
            "result": "1",
            "channel": "pgqueue_job",
            "now": None,
        },
    )  # inside an open transaction: the row is locked, not yet done
    assert sweep().recovered == 0  # SKIP LOCKED: no wait, no rescue
    completing.commit()
    assert sweep().recovered == 0
    done = job(claimed.id)
    assert (done.status, done.errors, done.attempts) == ("done", [], 1)


@pytest.mark.concurrency
def test_complete__waiting_behind_a_rescue_becomes_a_no_op(
    other_connection: Callable[..., Any],
) -> None:
    """C3/C8: the sweeper's rescue holds the row when the late worker completes: the
    completion waits, then re-checks its fence against the committed rescue and
    changes nothing (False), instead of overwriting the pending job."""
    claimed = expired_claim("w1")
    rescuing = other_connection()
    rows = rescuing.execute(
        sql.JOB_RESCUE_EXPIRED,
        {"now": None, "batch_size": 10, "keep_errors": 10, "channel": "pgqueue_job"},
    ).fetchall()
    assert rows == [(claimed.id, "pending")]  # uncommitted: the row stays locked
    outcome: list[bool] = []

    def late_complete() -> None:
        try:
            outcome.append(Job.objects.complete(claimed, "w1", result=1))
        finally:
            connection.close()

    thread = threading.Thread(target=late_complete)
    thread.start()
    wait_for(lambda: blocked_on_lock())
    assert not outcome  # still waiting for the rescue's lock
    rescuing.commit()
    thread.join(10)
    assert outcome == [False]
    rescued = job(claimed.id)
    assert (rescued.status, rescued.lease_owner, rescued.attempts) == ("pending", None, 1)
    assert rescued.errors[-1]["exception_class_path"].endswith("LeaseExpired")


def blocked_on_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0] > 0


# --- poison pills -------------------------------------------------------------------


@pytest.mark.slow
def test_poison_pill__dead_after_max_attempts_and_fleet_survives(
    manage: Callable[..., ManagedProcess],
) -> None:
    """C13/C14: a job that SIGKILLs its worker is charged at each claim and ends
    ``dead`` after ``max_attempts`` (3) lease expiries; the next worker lives."""
    pill = int(fault_tasks.poison.enqueue().id)
    deaths = 0
    while job(pill).status != "dead":
        assert deaths < 3, "the pill outlived its attempt limit"
        worker = manage("pgqueue_worker", *FAST)
        assert worker.wait() == -signal.SIGKILL
        deaths += 1
        sweep_until(lambda: job(pill).status != "running")
    dead = job(pill)
    assert (deaths, dead.attempts, dead.max_attempts) == (3, 3, 3)
    assert [e["attempt"] for e in dead.errors] == [1, 2, 3]
    assert all(e["exception_class_path"].endswith("LeaseExpired") for e in dead.errors)
    survivor = manage("pgqueue_worker", *FAST)
    healthy = Job.objects.enqueue("testproject.demo.fault_tasks.ledger_plain", [1])
    wait_for(lambda: job(healthy.id).status == "done")
    assert survivor.popen.poll() is None


# --- database faults ----------------------------------------------------------------


@pytest.mark.slow
def test_listener__terminated_listen_connection_reconnects_and_polls(
    manage: Callable[..., ManagedProcess],
) -> None:
    """C44: the LISTEN backend is killed and a job is enqueued at once: the listener
    reconnects, re-LISTENs and wakes the worker to poll, long before its 60 s poll."""
    worker = manage("pgqueue_worker", "--poll-interval", "60", "--lease-seconds", "5")
    listeners = wait_for(lambda: backends("pgqueue listen"))
    wait_for(lambda: backends("pgqueue claim"))
    terminate(listeners)
    enqueued = Job.objects.enqueue("testproject.demo.fault_tasks.ledger_plain", [1])
    wait_for(lambda: job(enqueued.id).status == "done", timeout=15)
    wait_for(lambda: in_log(worker, "LISTEN connection lost"))
    reconnected = wait_for(lambda: backends("pgqueue listen"))
    assert set(reconnected).isdisjoint(listeners)
    # And a NOTIFY on the new LISTEN connection still wakes it.
    second = Job.objects.enqueue("testproject.demo.fault_tasks.ledger_plain", [2])
    wait_for(lambda: job(second.id).status == "done", timeout=15)


@pytest.mark.slow
def test_worker__survives_terminated_backends(manage: Callable[..., ManagedProcess]) -> None:
    """C41/C43: pg_terminate_backend on every connection of a busy worker: jobs are
    failed-and-retried or finished, the worker reconnects, logs one line per error
    (no traceback spam), and every job ends done."""
    worker = manage("pgqueue_worker", *FAST, "--concurrency", "2")
    first = [Job.objects.enqueue("testproject.demo.fault_tasks.slow_plain", [0.5]).id]
    wait_for(lambda: backends("pgqueue runner") and backends("pgqueue heartbeat"))
    terminate(backends("pgqueue "))
    jobs = first + [
        Job.objects.enqueue("testproject.demo.fault_tasks.ledger_plain", [n]).id for n in range(5)
    ]
    terminate(backends("pgqueue claim"))
    sweep_until(lambda: all(job(i).status == "done" for i in jobs), timeout=30)
    assert worker.popen.poll() is None
    records = re.split(r"\n(?=\d{4}-\d\d-\d\d )", worker.output())
    noisy = [r for r in records if "Traceback" in r and "failed after" not in r]
    assert noisy == []  # tracebacks only for the task that failed, not reconnects
    assert any("database error while claiming" in r for r in records)
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0


@pytest.mark.slow
def test_complete__retried_after_the_runner_connection_is_cut(
    manage: Callable[..., ManagedProcess],
) -> None:
    """C19: the runner's connection dies while its task runs (no query of its own), so
    the completion meets a dead connection: it reconnects and retries while the lease
    holds; one success, no failure charged. An ordinary task's completion is written
    by the completer thread, so its connection is cut too."""
    enqueued = Job.objects.enqueue("testproject.demo.tasks.slow", [1.5])
    worker = manage("pgqueue_worker", "--lease-seconds", "3", "--poll-interval", "0.1")
    wait_for(lambda: job(enqueued.id).status == "running")
    terminate(wait_for(lambda: backends("pgqueue runner")))
    terminate(wait_for(lambda: backends("pgqueue completer")))
    wait_for(lambda: job(enqueued.id).status == "done")
    done = job(enqueued.id)
    assert (done.attempts, done.errors, done.result) == (1, [], 1.5)
    assert "could not record complete" in worker.output()  # it met the dead connection
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0


@pytest.mark.slow
def test_runner__connection_cut_while_idle_is_replaced_without_charging_the_next_job(
    manage: Callable[..., ManagedProcess],
) -> None:
    """The runner's connection dies between two jobs (a terminated backend): the next
    task runs once on a fresh connection, with no failure and no extra attempt charged.
    (The narrower race, the backend cut between the runner's labelling and its session
    baseline read, is what JobRunner._prepare_session absorbs; it is timing-bound and
    was seen once in a CI run, as test_complete__retried_after_the_runner_connection_is_cut
    charging an attempt.)"""
    first = Job.objects.enqueue("testproject.demo.tasks.add", [1, 2])
    worker = manage("pgqueue_worker", "--lease-seconds", "3", "--poll-interval", "0.1")
    wait_for(lambda: job(first.id).status == "done")
    terminate(wait_for(lambda: backends("pgqueue runner")))
    wait_for(lambda: not backends("pgqueue runner"))
    second = Job.objects.enqueue("testproject.demo.tasks.add", [3, 4])
    wait_for(lambda: job(second.id).status in ("done", "scheduled", "dead"))
    done = job(second.id)
    assert (done.status, done.attempts, done.errors, done.result) == ("done", 1, [], 7)
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0


# --- graceful shutdown --------------------------------------------------------------


@pytest.mark.slow
def test_shutdown__heartbeat_keeps_leases_until_task_finishes(
    manage: Callable[..., ManagedProcess],
) -> None:
    """C17/C22: after SIGTERM the worker claims nothing new, keeps extending the lease
    of its running task (a sweeper running all along recovers nothing), the task
    finishes once, and the worker exits 0."""
    running = Job.objects.enqueue("testproject.demo.fault_tasks.slow_plain", [3.0])
    worker = manage("pgqueue_worker", *FAST)
    wait_for(lambda: job(running.id).status == "running")
    wait_for(lambda: backends("pgqueue runner"))  # the task started (not just claimed)
    worker.signal(signal.SIGTERM)
    wait_for(lambda: in_log(worker, "SIGTERM received"))
    later = Job.objects.enqueue("testproject.demo.fault_tasks.ledger_plain", [1])
    recovered = 0

    def exited() -> bool:
        nonlocal recovered
        recovered += sweep().recovered
        return worker.popen.poll() is not None

    wait_for(exited, timeout=20, interval=0.1)
    assert worker.popen.returncode == 0
    assert recovered == 0
    done = job(running.id)
    assert (done.status, done.attempts) == ("done", 1)
    assert ledger(running.id) == [("plain", 1)]
    assert job(later.id).status == "pending"


@pytest.mark.slow
def test_shutdown__grace_expiry_leaves_job_to_its_lease(
    manage: Callable[..., ManagedProcess],
) -> None:
    """C23: a task outliving ``--grace-seconds`` is left running; the worker exits 0 at
    once, and the sweeper recovers the job after its lease (that attempt is charged)."""
    running = Job.objects.enqueue("testproject.demo.fault_tasks.slow_plain", [30.0])
    queued = Job.objects.enqueue("testproject.demo.fault_tasks.slow_plain", [30.0])
    worker = manage("pgqueue_worker", *FAST, "--grace-seconds", "0.5", "--batch-size", "2")
    wait_for(lambda: job(running.id).status == "running")
    wait_for(lambda: job(queued.id).status == "running")  # prefetched, not started
    wait_for(lambda: backends("pgqueue runner"))  # the first task started
    worker.signal(signal.SIGTERM)
    assert worker.wait(10) == 0
    assert "still running after the grace period" in worker.output()
    released = job(queued.id)
    assert (released.status, released.attempts) == ("pending", 0)  # not charged
    sweep_until(lambda: job(running.id).status == "pending")
    assert job(running.id).attempts == 1


@pytest.mark.slow
@pytest.mark.parametrize("task", ["marked_sleep", "marked_in_thread"])
def test_shutdown__second_signal_exits_at_once(
    manage: Callable[..., ManagedProcess], task: str
) -> None:
    """C24: the second SIGTERM aborts; the running job is left to its lease. Also a
    coroutine job in a blocking call on the event loop's thread pool: that pool is
    joined when the interpreter exits, so a worker that exited the ordinary way waited
    for the call."""
    # Tasks that say when their body starts: "running" is written at the claim, and a
    # job leased but not started is released at once by the first signal (the worker
    # could then exit 0 before the second came).
    running = Job.objects.enqueue(f"tests.tasks.{task}", [30.0])
    worker = manage("pgqueue_worker", *FAST)
    wait_for(lambda: Execution.objects.filter(job_id=running.id, kind="start").exists())
    worker.signal(signal.SIGTERM)
    wait_for(lambda: in_log(worker, "SIGTERM received"))
    worker.signal(signal.SIGTERM)
    assert worker.wait(10) == 1
    sweep_until(lambda: job(running.id).status == "pending")


@pytest.mark.slow
def test_shutdown__two_signals_at_once_abort_too(manage: Callable[..., ManagedProcess]) -> None:
    """C24: a second signal that comes before the worker acted on the first aborts as
    well: it used to raise in the claim loop, whose clean-up then drained, waiting out
    the running job. (Two kinds of signal, so they cannot merge into one delivery:
    Python runs both handlers back to back, before the claim loop sees the first.)"""
    # A task that says when its body starts: "running" is written at the claim, and a
    # job leased but not started yet is released at once by the first signal, so the
    # worker could exit 0 before a loaded machine delivered the second.
    running = Job.objects.enqueue("tests.tasks.marked_sleep", [30.0])
    worker = manage("pgqueue_worker", *FAST)
    wait_for(lambda: Execution.objects.filter(job_id=running.id, kind="start").exists())
    worker.signal(signal.SIGTERM)
    worker.signal(signal.SIGINT)
    assert worker.wait(10) == 1
    assert in_log(worker, "received again: aborting now")
    sweep_until(lambda: job(running.id).status == "pending")
