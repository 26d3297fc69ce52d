"""Coroutine jobs on a worker's event loop (``worker/coroutines.py``), with real worker
subprocesses: side by side, and every guarantee a job on a thread slot has (leases,
fenced outcomes, cancellation, timeouts, ``current_job()``, retries, signals, logging,
session checks, SIGTERM, SIGKILL), and the blocked-loop watchdog. Few processes, each
checking several things, to keep the suite short."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection

from django_pgqueue.models import Job
from tests import tasks
from tests.conftest import connect_test_db, wait_for

pytestmark = [pytest.mark.django_db(transaction=True)]

FINAL = ("done", "dead", "cancelled")
TIMEOUT = "django_pgqueue.exceptions.JobTimeout"


def fresh(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def ledger(kind: str) -> list[tuple[int, Any, str]]:
    """(job id, database time, thread name) of the ``demo_execution`` rows of ``kind``."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT job_id, created_at, worker_id FROM demo_execution WHERE kind = %s ORDER BY id",
            [kind],
        )
        return list(cursor.fetchall())


@contextmanager
def sampling(query: str, worker_id: str) -> Iterator[list[tuple[Any, ...]]]:
    """Run ``query`` (with ``%(worker)s``) every 20 ms on a connection of its own while
    the block runs; the rows it ever returned."""
    seen: list[tuple[Any, ...]] = []
    stop = threading.Event()

    def sample() -> None:
        with connect_test_db(autocommit=True) as conn:
            while not stop.wait(0.02):
                seen.extend(conn.execute(query, {"worker": worker_id}).fetchall())

    thread = threading.Thread(target=sample)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join(10)


# Connections of one worker, by role, in pg_stat_activity (its labels end in its id).
CONNECTIONS = """
SELECT split_part(application_name, ' ', 2) AS role, count(*)
FROM pg_stat_activity
WHERE application_name LIKE 'pgqueue %%' AND application_name LIKE '%%' || %(worker)s
GROUP BY 1
"""

# Running jobs whose lease has run out: the heartbeat failed to extend it.
EXPIRED = """
SELECT id FROM pgqueue_job
WHERE status = 'running' AND lease_expires_at < clock_timestamp()
"""


@pytest.mark.slow
def test_coroutines__side_by_side_each_its_own_job_few_connections(job_factory, manage, tmp_path):
    """100 coroutine jobs of 0.5 s on `--concurrency 1 --async-concurrency 100` finish
    within 2 s (database time), each seeing its own ``current_job()``; each makes an
    ORM call, yet the worker holds at most its four own connections, one runner and
    ``PGQUEUE_ASYNC_THREADS`` (4) lanes. With the root logging most projects have, each
    is one line; task_started and task_finished reach a project's handler of Django's
    lines for each."""
    tasks_log = tmp_path / "tasks.log"
    jobs = [job_factory(task=tasks.async_nap, args=[0.5], kwargs={"query": True})]
    jobs += [job_factory(task=tasks.async_nap, args=[0.5]) for _ in range(49)]
    jobs += [
        job_factory(task=tasks.async_nap, args=[0.5], kwargs={"query": True}) for _ in range(50)
    ]
    with sampling(CONNECTIONS, "w-side") as roles:
        worker = manage(
            "pgqueue_worker", "--burst", "--concurrency", "1", "--async-concurrency", "100",
            "--poll-interval", "0.1", "--worker-id", "w-side",
            env={
                "DJANGO_SETTINGS_MODULE": "tests.settings_root_logging",
                "TASKS_LOG_FILE": str(tasks_log),
            },
        )  # fmt: skip
        assert worker.wait(60) == 0, worker.output()
    rows = {j.id: j for j in Job.objects.filter(pk__in=[j.pk for j in jobs])}
    assert {r.status for r in rows.values()} == {"done"}
    assert all(r.result == r.id and r.attempts == 1 for r in rows.values())
    first = min(r.started_at for r in rows.values())
    last = max(r.finished_at for r in rows.values())
    assert (last - first).total_seconds() < 2.0  # one at a time: 50 s
    # Connections: the most of each role seen at once.
    most: dict[str, int] = {}
    for role, count in roles:
        most[role] = max(most.get(role, 0), count)
    assert most.get("async", 0) >= 1 and most["async"] <= 4, most
    assert sum(most.values()) <= 4 + 1 + 4, most
    lanes = {thread for _, _, thread in ledger("nap")}
    assert lanes and all(name.startswith("pgqueue-lane-") for name in lanes), lanes
    output = worker.output()
    for job in jobs:
        lines = [line for line in output.splitlines() if f"job {job.id} " in line]
        assert len(lines) == 1 and "async_nap done in " in lines[0], lines
    written = tasks_log.read_text()
    assert written.count("state=RUNNING") == written.count("state=SUCCESSFUL") == 100


@pytest.mark.slow
def test_coroutines__every_guarantee_on_the_loop(job_factory, manage):
    """One worker with a 1 s lease and a sweeper that takes back any expired lease:
    coroutine jobs longer than the lease keep it (the heartbeat, on its own thread,
    extends it, also while one coroutine blocks the loop, which the watchdog names);
    a cancellation reaches the coroutine within a second (NOTIFY); a timeout cancels
    and is retried; a session leak fails its job and the lane goes on clean; a
    transactional coroutine runs on a thread slot inside its transaction; SIGTERM lets
    the running coroutines finish."""
    env = {"PGQUEUE_RETRY_BACKOFF_BASE": "0"}
    long = [job_factory(task=tasks.async_nap, args=[2.5]) for _ in range(2)]
    blocker = job_factory(task=tasks.async_block, args=[1.5])
    leaks = job_factory(task=tasks.async_leaks, args=[])
    cancelled = job_factory(task=tasks.async_until_cancelled, args=[])
    tx = job_factory(task=tasks.async_transactional, args=[])
    sweeper = manage("pgqueue_sweep", "--loop", "--interval", "0.2", env=env)
    with sampling(EXPIRED, "w-all") as expired:
        worker = manage(
            "pgqueue_worker", "--concurrency", "1", "--async-concurrency", "10",
            "--lease-seconds", "1", "--poll-interval", "0.1", "--worker-id", "w-all",
            env=env,
        )  # fmt: skip
        wait_for(lambda: ledger("start"), timeout=30)
        Job.objects.cancel([cancelled.id])
        after_leak = job_factory(task=tasks.async_nap, args=[0.1], kwargs={"query": True})
        # Once the loop runs freely again (a blocked loop delays a timeout, and the
        # heartbeat stops extending a lease at its timeout):
        wait_for(lambda: fresh(blocker).status == "done", timeout=30)
        overrun = job_factory(task=tasks.async_overrun, args=[])
        everything = [*long, blocker, overrun, leaks, cancelled, tx, after_leak]
        wait_for(lambda: all(fresh(j).status in FINAL for j in everything), timeout=60)
    assert expired == [], "a running coroutine job's lease ran out"
    for job in [*long, blocker, after_leak]:
        row = fresh(job)
        assert (row.status, row.attempts, row.errors) == ("done", 1, []), row.errors
    # Cancellation: CancelledError in the coroutine within a second of the request.
    row = fresh(cancelled)
    assert row.status == "cancelled"
    ((_, cancelled_at, _),) = ledger("cancelled")
    assert (cancelled_at - row.cancel_requested_at).total_seconds() < 1.0
    # Timeout: cancelled at 0.5 s, retried, dead after its two attempts.
    row = fresh(overrun)
    assert (row.status, row.attempts) == ("dead", 2)
    assert [e["exception_class_path"] for e in row.errors] == [TIMEOUT, TIMEOUT]
    # A leak fails its job; the next job on the lane runs on a clean connection.
    row = fresh(leaks)
    assert row.status == "dead"
    assert row.errors[-1]["exception_class_path"] == "django_pgqueue.exceptions.TransactionLeak"
    assert "SET search_path" in row.errors[-1]["traceback"]
    # Transactional: on the thread slot, inside the job's transaction.
    row = fresh(tx)
    assert row.status == "done"
    assert row.result["atomic"] is True and row.result["thread"].startswith("pgqueue-runner")
    output = worker.output()
    assert "event loop blocked for " in output and f"job {blocker.id} " in output, output
    assert "in async_block)" in output and "event loop ran again after" in output, output
    # SIGTERM: the running coroutines finish, the worker exits 0.
    draining = [job_factory(task=tasks.async_nap, args=[1.0]) for _ in range(5)]
    wait_for(lambda: all(fresh(j).status == "running" for j in draining), timeout=30)
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output()
    assert all((fresh(j).status, fresh(j).attempts) == ("done", 1) for j in draining)
    sweeper.signal(signal.SIGTERM)
    assert sweeper.wait(30) == 0


@pytest.mark.slow
def test_coroutines__cut_short_by_the_grace_period_or_sigkill_are_recovered(job_factory, manage):
    """Coroutine jobs still running when a worker's grace period ends are cancelled with
    nothing recorded (the worker exits 0, also with a lane thread stuck in one's sync
    call); those of a SIGKILLed worker just stop. Either
    way the sweeper takes them back at lease expiry, and another worker finishes them
    (their second attempt)."""
    flags = ("--concurrency", "1", "--async-concurrency", "5", "--lease-seconds", "1")
    graced = [job_factory(task=tasks.async_nap, args=[30], max_attempts=3) for _ in range(4)]
    # One whose sync call holds its lane: the worker exits anyway.
    graced.append(job_factory(task=tasks.async_stuck_on_lane, args=[60], max_attempts=3))
    first = manage("pgqueue_worker", *flags, "--grace-seconds", "0.3", "--worker-id", "w-a")
    wait_for(lambda: all(fresh(j).status == "running" for j in graced), timeout=30)
    killed = [job_factory(task=tasks.async_nap, args=[30], max_attempts=3) for _ in range(5)]
    second = manage("pgqueue_worker", *flags, "--worker-id", "w-b")
    wait_for(lambda: all(fresh(j).status == "running" for j in killed), timeout=30)
    assert {fresh(j).lease_owner for j in killed} == {"w-b"}
    first.signal(signal.SIGTERM)
    assert first.wait(15) == 0, first.output()  # (not held up by the stuck lane's 60 s)
    assert first.output().count("cancelled, nothing recorded") == 5
    second.signal(signal.SIGKILL)
    second.wait(10)
    everything = [*graced, *killed]
    assert all((fresh(j).status, fresh(j).errors) == ("running", []) for j in everything)
    Job.objects.filter(pk__in=[j.pk for j in everything]).update(args=[0.1])  # (shorter now)
    sweeper = manage("pgqueue_sweep", "--loop", "--interval", "0.2")
    wait_for(lambda: all(fresh(j).status == "pending" for j in everything), timeout=30)
    sweeper.signal(signal.SIGTERM)
    assert sweeper.wait(30) == 0
    third = manage("pgqueue_worker", "--burst", "--async-concurrency", "10")
    assert third.wait(60) == 0, third.output()
    for job in everything:
        row = fresh(job)
        assert (row.status, row.attempts) == ("done", 2)
        assert row.errors[0]["exception_class_path"].endswith("LeaseExpired")


@pytest.mark.slow
def test_coroutines__sys_exit_or_keyboard_interrupt_is_the_jobs_failure(job_factory, manage):
    """Issue 28 item 13: a coroutine task raising SystemExit (a library calling
    ``sys.exit()``) or KeyboardInterrupt fails its own job, as in a plain task; asyncio
    re-raises both out of the loop, which used to kill the loop thread and the worker,
    leaving the loop's other jobs running until their leases expired."""
    naps = [job_factory(task=tasks.async_nap, args=[1.0]) for _ in range(3)]
    exits = job_factory(task=tasks.async_exits, args=["exit", 0.2])
    interrupts = job_factory(task=tasks.async_exits, args=["interrupt", 0.3])
    worker = manage(
        "pgqueue_worker", "--concurrency", "1", "--async-concurrency", "10",
        "--poll-interval", "0.1", "--worker-id", "w-exit",
    )  # fmt: skip
    everything = [*naps, exits, interrupts]
    wait_for(lambda: all(fresh(j).status in FINAL for j in everything), timeout=30)
    for job, kind in [(exits, "SystemExit"), (interrupts, "KeyboardInterrupt")]:
        row = fresh(job)
        assert (row.status, row.attempts) == ("dead", 1), row.errors
        assert row.errors[-1]["exception_class_path"] == f"builtins.{kind}"
    assert all((fresh(j).status, fresh(j).attempts) == ("done", 1) for j in naps)
    # The worker still runs, and its loop takes new coroutine jobs.
    after = job_factory(task=tasks.async_nap, args=[0.1])
    wait_for(lambda: fresh(after).status == "done", timeout=30)
    assert worker.popen.poll() is None, worker.output()
    assert "event loop thread died" not in worker.output()
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output()


# --- in process: the claim's sizing, the loop's slots, planted faults -------------------


def span(jobs: list[Job]) -> float:
    """Seconds from the first job's start to the last one's end (database time)."""
    rows = Job.objects.filter(pk__in=[j.pk for j in jobs])
    first = min(r.started_at for r in rows)
    return (max(r.finished_at for r in rows) - first).total_seconds()


@pytest.mark.parametrize("async_concurrency", [10, 0])
def test_loop__coroutine_jobs_overlap_only_on_the_loop(job_factory, run_worker, async_concurrency):
    """The measure the subprocess test relies on, with its planted fault: on the loop
    five jobs of 0.2 s overlap; without it (0: the thread slot) they run one by one."""
    jobs = [job_factory(task=tasks.async_nap, args=[0.2]) for _ in range(5)]
    worker = run_worker(concurrency=1, async_concurrency=async_concurrency)
    assert worker.stats.done == 5
    if async_concurrency:
        assert span(jobs) < 0.5
    else:
        assert span(jobs) >= 1.0


@pytest.mark.parametrize("async_concurrency", [10, 0])
def test_loop__sys_exit_in_a_coroutine_fails_its_job_on_the_loop_or_a_thread(
    job_factory, run_worker, async_concurrency
):
    """The in-process side of the subprocess test: on the loop (10) or on a thread slot
    (0), SystemExit and KeyboardInterrupt from a coroutine are its job's failure, and
    the worker goes on with the next coroutine job."""
    exits = job_factory(task=tasks.async_exits, args=["exit"])
    interrupts = job_factory(task=tasks.async_exits, args=["interrupt"])
    after = job_factory(task=tasks.async_nap, args=[0.05])
    worker = run_worker(concurrency=1, async_concurrency=async_concurrency)
    paths = [fresh(j).errors[-1]["exception_class_path"] for j in (exits, interrupts)]
    assert paths == ["builtins.SystemExit", "builtins.KeyboardInterrupt"]
    assert (fresh(exits).status, fresh(interrupts).status) == ("dead", "dead")
    assert fresh(after).status == "done"
    assert worker.stats.done == 1


def test_loop__jobs_over_its_slots_wait_and_are_released_at_stop(job_factory, settings):
    """A coroutine job claimed over the loop's slots (the one a full loop may take
    while plain jobs were claimed lately) waits, leased, for a slot; at stop it is
    released, attempt not charged, while the running ones finish; the fourth job is
    never claimed."""
    from django_pgqueue.worker import Worker

    settings.PGQUEUE_COMPLETION_FLUSH_INTERVAL = 0.0
    jobs = [
        job_factory(task=tasks.async_nap, args=[0.5], kwargs={"query": True}) for _ in range(4)
    ]
    worker = Worker(concurrency=1, async_concurrency=2, batch_size=4, poll_interval=0.1)
    worker._sizer.claimed(plain=1, coroutine=0)  # as if a thread job had been claimed
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_for(lambda: len(ledger("nap")) == 2, timeout=20)
        wait_for(lambda: Job.objects.filter(status="running").count() == 3, timeout=20)
    finally:
        worker.stop()
        thread.join(20)
    assert not thread.is_alive()
    rows = sorted(fresh(j).status for j in jobs)
    assert rows == ["done", "done", "pending", "pending"]
    assert {fresh(j).attempts for j in jobs if fresh(j).status == "pending"} == {0}
    assert worker.stats.released == 1 and len(ledger("nap")) == 2


def test_worker__claim_is_sized_for_both_sides():
    """The worker asks its ClaimSizer (tests/test_claimer.py has the policy)."""
    from django_pgqueue.worker import Worker

    worker = Worker(concurrency=2, async_concurrency=100)
    assert worker._claim_total(2, 100) == 2  # as a thread worker
    assert worker._claim_total(2, 1) == 1  # never more than the loop has room for
    assert worker._claim_total(0, 100) == 0  # nor than the threads have
    worker._sizer.claimed(plain=0, coroutine=1)
    assert worker._claim_total(0, 100) == 1  # one plain job may wait for a thread
    worker._jobs.put(Job(id=1))
    assert worker._claim_total(0, 100) == 0  # one does
    assert Worker(concurrency=2, async_concurrency=0)._claim_total(2, 0) == 2


def test_loop__a_coroutine_backlog_fills_the_loop_a_claim_at_a_time(job_factory, run_worker):
    """Once the worker knows its coroutine task, it claims by kind: the loop's room of
    those jobs per claim, not its free threads plus one (2 here). Jobs leased by one
    statement share its ``last_attempted_at`` (the database's now), so the distinct
    values count the claims: 90 jobs for a loop of 30 take a handful, not 45."""
    jobs = [job_factory(task=tasks.async_nap, args=[0.05]) for _ in range(90)]
    worker = run_worker(concurrency=1, async_concurrency=30, timeout=60)
    assert worker.stats.done == 90
    claims = (
        Job.objects.filter(pk__in=[j.pk for j in jobs])
        .values("last_attempted_at")
        .distinct()
        .count()
    )
    assert claims <= 20, claims  # (48 when claims were bounded by the threads)


@pytest.mark.parametrize("how", ["swallow", "translate"])
def test_loop__past_the_grace_period_nothing_is_recorded_whatever_the_job_does(
    job_factory, tmp_path, how
):
    """Shutdown cancels the coroutine jobs still running after the grace period and
    records nothing (their leases expire): also for a job that catches that
    cancellation and returns, or raises another error, though its coroutine now runs
    inside the job's own asyncio task (``EventLoop._call_here``)."""
    from django_pgqueue.worker import Worker

    marker = tmp_path / "started"
    job = job_factory(
        task=tasks.async_shrugs_off_cancel, args=[str(marker), 30.0], kwargs={"how": how}
    )
    worker = Worker(concurrency=1, async_concurrency=4, grace_seconds=0.3, poll_interval=0.1)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_for(marker.exists, timeout=20)
    finally:
        worker.stop()
        thread.join(30)
    assert not thread.is_alive()
    row = fresh(job)
    assert (row.status, row.attempts, row.errors, row.result) == ("running", 1, [], None)


def test_loop__a_coroutine_task_met_late_never_overfills_the_loop(job_factory, run_worker):
    """A claim by kind counts the jobs of a task the worker has not met yet against both
    sides' room: here 50 jobs of a second coroutine task come after 50 of the first, on
    a loop of 50 beside 4 threads, and the loop never holds more than its room plus one
    (it held 55 when they were counted as plain jobs)."""
    from django_pgqueue.worker import loop as loop_module

    held: list[tuple[int, int]] = []
    route = loop_module.Worker._route

    def counted(self: Any, jobs: list[Job]) -> None:
        route(self, jobs)
        with self._state.lock:
            on_loop = sum(1 for h in self._state.held.values() if h.on_loop and not h.completing)
        held.append((on_loop, self.async_concurrency + self._sizer.loop_ahead))

    jobs = [job_factory(task=tasks.async_nap, args=[1.0]) for _ in range(50)]
    jobs += [job_factory(task=tasks.async_other_nap, args=[1.0]) for _ in range(50)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(loop_module.Worker, "_route", counted)
        worker = run_worker(concurrency=4, async_concurrency=50, timeout=60)
    assert worker.stats.done == 100
    assert held and all(on_loop <= room + 1 for on_loop, room in held), held


def test_loop__a_coroutine_only_line_is_claimed_from_the_position(job_factory, run_worker):
    """On a line of coroutine jobs alone, the candidates a claim by kind passes over are
    its tail, after the last job it leased: its position still sees them, so claims that
    take jobs go on resuming rather than reading the line from its head (whose dead
    entries the position exists to skip); 10 of 11 started at the head when every
    pass-over rescanned. (Once the line is empty, a burst worker looks from the head
    before it exits: those claims take nothing and are not counted.)"""
    from django_pgqueue.worker import position

    claims: list[tuple[bool, int]] = []
    claimed = position.ClaimPosition.claimed

    def counted(self: Any, after: object, jobs: list[Job]) -> None:
        claims.append((after is None, len(jobs)))
        claimed(self, after, jobs)

    for _ in range(300):
        job_factory(task=tasks.async_nap, args=[0.0])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(position.ClaimPosition, "claimed", counted)
        worker = run_worker(concurrency=2, async_concurrency=20, timeout=60)
    assert worker.stats.done == 300
    taking = [from_head for from_head, n in claims if n]
    assert len(taking) >= 10 and sum(taking) <= 2, claims
