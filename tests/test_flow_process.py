"""Flow control with real ``manage.py pgqueue_worker`` processes racing, judged by when
the jobs really ran, in the database's clock: each task writes a ``Span`` row (its
body's start and end, ``clock_timestamp()``), and a job's start as a limit counts it is
its lease, ``last_attempted_at``. Each limit is also run with its guard planted away
(``testproject/demo/faults.py``), to show that these checks catch a broken one."""

from __future__ import annotations

import datetime as dt
import json
import signal
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from django.db import connection

from django_pgqueue import flow
from django_pgqueue.models import Job, WorkerProcess
from testkit.private_bouncer import PrivateBouncer, pgbouncer_binary
from testproject.demo import faults
from testproject.demo.fault_tasks import span
from testproject.demo.models import Span

from .conftest import ManagedProcess, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

WORKER = ("pgqueue_worker", "--poll-interval", "0.2", "--concurrency", "4", "-v", "0")
LIMITS = {
    "stripe": {"concurrency": 2},
    "tenant:*": {"concurrency": 1},
    "metered": {"rate": "4/s"},
}


def worker_env(limits: dict[str, Any] | None = None, plant: str = "", **more: Any) -> dict:
    env = {"PGQUEUE_LIMITS": json.dumps(limits or LIMITS), "PGQUEUE_DEMO_PLANT": plant}
    return {**env, **{name: json.dumps(value) for name, value in more.items()}}


def registered(count: int) -> Callable[[], bool]:
    """Whether ``count`` workers have registered (so they LISTEN and claim)."""

    def check() -> bool:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pgqueue_worker")
            return cursor.fetchone()[0] >= count

    return check


def spans() -> dict[str, list[tuple[dt.datetime, dt.datetime]]]:
    """Each key's job bodies (start, end) as the tasks recorded them."""
    found: dict[str, list[tuple[dt.datetime, dt.datetime]]] = defaultdict(list)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT j.concurrency_key, s.started_at, s.finished_at "
            "FROM demo_span AS s JOIN pgqueue_job AS j ON j.id = s.job_id"
        )
        for key, start, end in cursor.fetchall():
            found[key].append((start, end))
    return found


def most_at_once(intervals: Iterable[tuple[dt.datetime, dt.datetime]]) -> int:
    """The most intervals that overlap at any instant (an end before a start at the
    same instant: touching is not overlapping)."""
    intervals = list(intervals)
    events = sorted(
        [(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals],
        key=lambda event: (event[0], event[1]),
    )
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


def lease_starts(key: str) -> list[dt.datetime]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT last_attempted_at FROM pgqueue_job WHERE concurrency_key = %s ORDER BY 1",
            [key],
        )
        return [row[0] for row in cursor.fetchall()]


def all_done(count: int) -> Callable[[], bool]:
    return lambda: Job.objects.filter(status="done").count() == count


def stop(*workers: ManagedProcess) -> None:
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(30) == 0, worker.output()


#: The queues the limited keys' jobs take turns in (a budget spans queues).
QUEUES = ("default", "other")
#: A fleet as deployments run one: a worker of every queue, and one of each queue
#: (whose claims see other heads of the line than the first's).
FLEET = ((), ("--queue", "default"), ("--queue", "other"))


def stripe_jobs() -> list[dict[str, Any]]:
    return [
        {"task": span, "args": [0.02], "concurrency_key": "stripe", "queue": QUEUES[n % 2]}
        for n in range(40)
    ]


def tenant_jobs() -> list[dict[str, Any]]:
    return [
        {
            "task": span,
            "args": [0.05],
            "concurrency_key": f"tenant:{n % 4}",
            "queue": QUEUES[n // 4 % 2],
        }
        for n in range(24)
    ]


def metered_jobs() -> list[dict[str, Any]]:
    return [{"task": span, "args": [0.01], "concurrency_key": "metered"} for _ in range(12)]


def run_bursts(*bursts: list[dict[str, Any]]) -> None:
    """Enqueue each burst in one bulk call (one NOTIFY wakes every worker at once: their
    claims race), and wait until it is done before the next."""
    total = 0
    for jobs in bursts:
        total += int(Job.objects.bulk_enqueue(jobs))
        wait_for(all_done(total), timeout=60)


@pytest.mark.parametrize(
    "plant",
    ["slow_claim", "slow_claim,no_budget_lock,no_rate_window"],
    ids=["guarded", "planted"],
)
def test_flow_process__limits_hold_across_three_workers(manage, plant):
    """Three workers of 4 slots (one of every queue, one of each of the two queues the
    limited keys' jobs are in): ``stripe`` (concurrency 2) never runs more than 2 jobs
    and does run 2; each ``tenant:*`` key runs one at a time while tenants run side by
    side; ``metered`` (4/s) starts 12 jobs over at least 2 s, never 5 within a second.
    Each claim's transaction is held 30 ms longer (``slow_claim``, as on a loaded
    server), so the workers' claims overlap. Planted (no budget lock, no rate window):
    the same checks fail."""
    # Polling every 20 ms: a worker whose claim found the key full tries again while
    # another worker's slots free, racing that worker's next claim.
    workers = [
        manage(*WORKER, *queues, "--poll-interval", "0.02", env=worker_env(plant=plant))
        for queues in FLEET
    ]
    wait_for(registered(3), timeout=30)
    # One key at a time (every claim then races for the same budgets), twice.
    run_bursts(stripe_jobs(), tenant_jobs() + metered_jobs(), stripe_jobs(), tenant_jobs())
    stop(*workers)
    ran = spans()
    stripe = most_at_once(ran["stripe"])
    tenants = {key: most_at_once(ran[key]) for key in ran if key.startswith("tenant:")}
    side_by_side = most_at_once(
        interval for key in tenants for interval in ran[key]
    )  # tenants together
    starts = lease_starts("metered")
    spread = (starts[-1] - starts[0]).total_seconds()
    fifth = min((starts[i + 4] - starts[i]).total_seconds() for i in range(len(starts) - 4))
    if "no_budget_lock" not in plant:
        assert stripe == 2, ran["stripe"]
        assert set(tenants.values()) == {1}, tenants
        assert side_by_side >= 2, "tenants never ran side by side"
        assert spread >= 2.0, starts
        assert fifth >= 1.0, starts  # any 5 starts span a second: at most 4 in a window
    else:
        # The guards are what the checks see: without them, both fail.
        assert stripe > 2 or max(tenants.values()) > 1, (stripe, tenants)
        assert spread < 2.0 and fifth < 1.0, starts


def claimed_within(job_id: int, seconds: float) -> bool:
    """Whether a worker claims job ``job_id`` within ``seconds`` (a bounded watch for
    something that must not happen)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if Job.objects.get(pk=job_id).attempts:
            return True
        time.sleep(0.05)
    return False


def leased_order(queue: str) -> list[str]:
    """The keys of ``queue``'s jobs in the order they were leased."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT concurrency_key FROM pgqueue_job "
            "WHERE queue = %s AND last_attempted_at IS NOT NULL "
            "ORDER BY last_attempted_at, id",
            [queue],
        )
        return [row[0] for row in cursor.fetchall()]


@pytest.mark.parametrize("plant", ["", "unfair,ignore_pauses"], ids=["guarded", "planted"])
def test_flow_process__fair_turns_and_paused_queues(manage, plant):
    """A fair queue lets 10 jobs of a small key through 300 of a big one enqueued before
    them (all leased before the big key's 40th job); a paused queue is not worked while
    the worker drains the rest, a queue paused while it runs is not claimed from, and a
    resumed one is worked at once. Planted (fair queues claimed like others, pauses
    never heard of): the checks fail."""
    add = "testproject.demo.tasks.add"
    Job.objects.bulk_enqueue(
        [
            {"task": add, "args": [n, 1], "queue": "fair", "concurrency_key": "big"}
            for n in range(300)
        ]
        + [
            {"task": add, "args": [n, 2], "queue": "fair", "concurrency_key": "small"}
            for n in range(10)
        ]
        + [{"task": add, "args": [n, 3], "queue": "held"} for n in range(5)]
    )
    Job.objects.pause_queue("held")
    worker = manage(
        *WORKER,
        "--concurrency",
        "2",
        env=worker_env({}, plant=plant, PGQUEUE_FAIR_QUEUES=["fair"]),
    )
    wait_for(lambda: Job.objects.filter(queue="fair", status="done").count() == 310, timeout=60)
    order = leased_order("fair")
    small_done_by = max(i for i, key in enumerate(order) if key == "small")
    held_claimed = Job.objects.filter(queue="held", attempts__gt=0).count()
    # Paused while the worker runs: once the second a worker may take to hear of a
    # pause has passed, a job enqueued in that queue is not claimed.
    Job.objects.pause_queue("later")
    time.sleep(flow.REFRESH_SECONDS + 0.1)
    late = Job.objects.enqueue(add, [1, 1], queue="later")
    later_claimed = claimed_within(late.pk, 1.0)
    if not plant:
        assert small_done_by < 50, order[:60]
        assert held_claimed == 0
        assert not later_claimed
        assert Job.objects.resume_queue("held") and Job.objects.resume_queue("later")
        resumed = Job.objects.filter(queue__in=["held", "later"], status="done")
        wait_for(lambda: resumed.count() == 6, timeout=5)
    else:
        assert small_done_by > 250, order[:60]
        assert held_claimed == 5 and later_claimed
    stop(worker)


def lease_expired(job_id: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT lease_expires_at < clock_timestamp() FROM pgqueue_job WHERE id = %s",
            [job_id],
        )
        return bool(cursor.fetchone()[0])


@pytest.mark.parametrize("plant", ["", "expired_lease_frees_slot"], ids=["guarded", "planted"])
def test_flow_process__a_killed_workers_slot_comes_back_when_its_lease_is_rescued(manage, plant):
    """``solo`` (concurrency 1): a worker SIGKILLed while running its job keeps the slot
    held, even past the lease's expiry (the worker might only be stalled, still
    running it), until the sweeper rescues the job; then the next job of the key runs.
    Planted (an expired lease frees its slot): the next job starts before the rescue."""
    limits = {"solo": {"concurrency": 1}}
    env = worker_env(limits, plant=plant)
    if plant:  # the rewritten usage function, under the name planted claims call
        with connection.cursor() as cursor:
            cursor.execute(faults.planted_function(plant))
    first = Job.objects.enqueue(span, [30], concurrency_key="solo", max_attempts=1)
    doomed = manage(*WORKER, "--lease-seconds", "1", "--worker-id", "doomed", env=env)
    wait_for(lambda: Job.objects.get(pk=first.pk).lease_owner == "doomed", timeout=30)
    wait_for(lambda: Span.objects.filter(job_id=first.pk).exists(), timeout=10)
    doomed.signal(signal.SIGKILL)
    assert doomed.wait() == -signal.SIGKILL
    second = Job.objects.enqueue(span, [0.01], concurrency_key="solo")
    rescuer = manage(*WORKER, "--lease-seconds", "1", "--worker-id", "rescuer", env=env)
    wait_for(lambda: WorkerProcess.objects.filter(pk="rescuer").exists(), timeout=30)
    wait_for(lambda: lease_expired(first.pk), timeout=10)
    claimed_early = claimed_within(second.pk, 1.5)
    if plant:
        assert claimed_early
        stop(rescuer)
        return
    assert not claimed_early
    sweep = manage("pgqueue_sweep", env=env)
    assert sweep.wait() == 0, sweep.output()
    assert "dead=1" in sweep.output(), sweep.output()  # its last attempt: a dead letter
    wait_for(lambda: Job.objects.get(pk=second.pk).status == "done", timeout=10)
    rescued, ran = Job.objects.get(pk=first.pk), Job.objects.get(pk=second.pk)
    assert rescued.status == "dead"
    assert ran.last_attempted_at > rescued.finished_at  # started once the slot came back
    stop(rescuer)


@pytest.mark.skipif(
    pgbouncer_binary() is None,
    reason="pgbouncer is not installed (bash .ci/install-pgbouncer installs Debian's)",
)
def test_flow_process__limits_hold_through_pgbouncer_in_transaction_mode(manage):
    """The limits test's fleet (its claims held 30 ms longer) behind a PgBouncer in
    transaction pooling mode (a claim's budget locks are transaction-level, and the
    function it reads their use with keeps no session state): the same bounds hold."""
    s = connection.settings_dict
    options = s.get("OPTIONS") or {}
    with PrivateBouncer(
        server_host=str(s.get("HOST") or options.get("host") or "127.0.0.1"),
        server_port=str(s.get("PORT") or options.get("port") or "5432"),
        user=s.get("USER") or "postgres",
        password=s.get("PASSWORD") or "",
        pool_size=8,
    ) as bouncer:
        env = {
            **worker_env(plant="slow_claim"),
            "DATABASE_URL": bouncer.url(s["NAME"]),
            "DATABASE_POOLED": "1",
        }
        workers = [
            manage(*WORKER, *queues, "--poll-interval", "0.02", env=env) for queues in FLEET
        ]
        wait_for(registered(3), timeout=30)
        run_bursts(stripe_jobs(), tenant_jobs() + metered_jobs())
        stop(*workers)
        for worker in workers:
            assert "database error" not in worker.output(), worker.output()
    ran = spans()
    assert most_at_once(ran["stripe"]) == 2, ran["stripe"]
    assert {most_at_once(ran[key]) for key in ran if key.startswith("tenant:")} == {1}
    starts = lease_starts("metered")
    assert (starts[-1] - starts[0]).total_seconds() >= 2.0, starts
    assert min((starts[i + 4] - starts[i]).total_seconds() for i in range(8)) >= 1.0
