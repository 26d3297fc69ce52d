"""Flow control in one process, on real PostgreSQL: limit specs and keys checked, every
enqueue path storing the key, claimers on their own connections racing under limits
(and the same race with the budget lock planted away), the claim jumping over a full
key and a paused backlog, fair turns, rate windows at their boundary, limits and pauses
changed at run time, and what pgqueue_status, the dashboard, the metrics, the admin and
pgqueue_queue show of it."""

from __future__ import annotations

import datetime as dt
import io
import json
import re
import threading
from collections import Counter
from typing import Any

import pytest
from django.core import checks
from django.core.management import call_command
from django.db import connection, connections
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_pgqueue import bulk, flow, sql, sweeper
from django_pgqueue.exceptions import InvalidJob
from django_pgqueue.models import Job, Limit, Queue, RateWindow
from django_pgqueue.periodic import enqueue_due
from django_pgqueue.taskapi import InvalidTask, task, task_enqueued
from django_pgqueue.worker.listener import Listener
from django_pgqueue.worker.state import WorkerState
from django_pgqueue.workflows import chain, group, step
from testproject.demo import faults

from .conftest import connect_test_db, wait_for

ADD = "testproject.demo.tasks.add"
S = dt.timedelta(seconds=1)

pytestmark = pytest.mark.django_db(transaction=True)


@task(concurrency_key=lambda tenant, **_: f"tenant:{tenant}")
def per_tenant(tenant: int, n: int = 0) -> int:
    return n


@task(concurrency_key="stripe")
def charge(n: int = 0) -> int:
    return n


@task(concurrency_key=lambda n: n)
def numbered(n: int) -> int:
    """Its key callable returns an int: no key."""
    return n


def view(limits: dict[str, Any] | None = None, **more: Any) -> flow.FlowView:
    return flow.FlowView(
        limits=tuple(flow.parse_limit(k, v) for k, v in (limits or {}).items()), **more
    )


def running_by_key() -> Counter[str]:
    return Counter(Job.objects.filter(status="running").values_list("concurrency_key", flat=True))


@override_settings(
    PGQUEUE_LIMITS={
        "Queue:emails": {"concurrency": 1},
        " queue:mail": {"concurrency": 1},
        "queue:search": {"concurrency": 1},
        "queue_stats": {"concurrency": 1},
    }
)
def test_flow__a_key_that_reads_like_a_queue_budget_is_warned_of():
    """ "Queue:emails" is a valid exact key that limits no queue: warned (W063), the
    others (a real queue budget, a plain key) not (issue 28 item 18)."""
    from django_pgqueue.checks import check_flow

    warned = [m for m in check_flow() if m.id == "pgqueue.W063"]
    assert [m.level for m in warned] == [checks.WARNING, checks.WARNING]
    assert "'Queue:emails'" in warned[0].msg and "'queue:emails'" in warned[0].msg
    assert "' queue:mail'" in warned[1].msg and "'queue:mail'" in warned[1].msg
    assert flow.declared()["Queue:emails"]  # still an exact key: nothing refused


def test_flow__limit_specs_are_parsed_and_bad_ones_named():
    spec = flow.parse_limit("tenant:*", {"concurrency": 2, "rate": "10/m"})
    assert (spec.prefix, spec.concurrency, spec.rate, spec.describe()) == (
        True,
        2,
        (10, 60.0),
        "concurrency 2, rate 10/m",
    )
    assert spec.matches("tenant:7") and not spec.matches("tenants") and not spec.matches("")
    assert flow.parse_limit("queue:emails", {"rate": "5/h"}).queue == "emails"
    bad = [
        ("stripe", {"concurrency": 0}, "concurrency must be an int from 1"),
        ("stripe", {"concurrency": True}, "concurrency must be an int"),
        ("stripe", {"rate": "0/s"}, "R must be from 1"),
        ("stripe", {"rate": "4/d"}, 'rate must be "R/s", "R/m" or "R/h"'),
        ("stripe", {"rate": 4}, "rate must be"),
        ("stripe", {}, "neither"),
        ("stripe", {"concurency": 2}, "unknown 'concurency'"),
        ("stripe", 2, "must be a dict"),
        ("ten*ant", {"concurrency": 1}, "a '*' may only end a key"),
        ("queue:bad name", {"concurrency": 1}, "is no queue name"),
        ("", {"concurrency": 1}, "non-empty str"),
        ("tenant:\ud800", {"concurrency": 1}, "contains a lone surrogate '\\ud800'"),
    ]
    for key, value, message in bad:
        with pytest.raises(ValueError, match=re.escape(message)):
            flow.parse_limit(key, value)
    with override_settings(
        PGQUEUE_LIMITS={"stripe": {"rate": "x"}, "ok": {"concurrency": 1}},
        PGQUEUE_FAIR_QUEUES=["fine", "bad name"],
    ):
        found = {
            m.id: m.msg for m in checks.run_checks() if m.id in ("pgqueue.E063", "pgqueue.E064")
        }
        assert "limit 'stripe'" in found["pgqueue.E063"]
        assert "'bad name' is no queue name" in found["pgqueue.E064"]
    # Issue 28 item 18: a key no claim could send; a generator the check would use up.
    with override_settings(
        PGQUEUE_LIMITS={"\ud800": {"concurrency": 1}},
        PGQUEUE_FAIR_QUEUES=(name for name in ["mail"]),
    ):
        found = {
            m.id: m.msg for m in checks.run_checks() if m.id in ("pgqueue.E063", "pgqueue.E064")
        }
        assert "lone surrogate" in found["pgqueue.E063"]
        assert "must be a list of queue names, not <generator" in found["pgqueue.E064"]


def test_flow__bad_concurrency_keys_are_refused_and_leave_no_row():
    def boom(*args: Any, **kwargs: Any) -> str:
        raise KeyError("tenant")

    for key, message in [
        (42, "concurrency_key must be a non-empty str"),
        ("", "non-empty str"),
        ("x" * 256, "at most 255"),
        ("queue:emails", "starts with 'queue:'"),
        ("tenant:*", "ends with '*'"),
        ("a\x00b", "NUL"),
    ]:
        with pytest.raises(InvalidJob, match=re.escape(message)):
            Job.objects.enqueue(ADD, [1, 2], concurrency_key=key)
    with pytest.raises(InvalidJob, match=r"callable .*boom of .* raised KeyError"):
        Job.objects.enqueue(ADD, [1, 2], concurrency_key=boom)
    with pytest.raises(InvalidJob, match="returned None"):
        Job.objects.enqueue(ADD, [1, 2], concurrency_key=lambda *a: None)
    with pytest.raises(InvalidJob, match="job #1: concurrency_key must be"):
        Job.objects.bulk_enqueue(
            [{"task": ADD, "args": [1, 2]}, {"task": ADD, "args": [1, 2], "concurrency_key": 7}]
        )
    with pytest.raises(InvalidJob, match=r"job #0: concurrency_key callable .* must be"):
        bulk.enqueue_many(numbered, [((1,), {})])
    with pytest.raises(InvalidTask, match="starts with 'queue:'"):
        task(concurrency_key="queue:x")(lambda: None)
    assert Job.objects.count() == 0


def test_flow__every_enqueue_path_stores_the_key(now, monkeypatch):
    assert charge.enqueue().id and per_tenant.enqueue(3).id
    Job.objects.enqueue(ADD, [1, 2], concurrency_key="api")
    Job.objects.enqueue(charge, [1], concurrency_key="override")  # the call wins
    Job.objects.enqueue(charge, [2], idempotency_key="k", unique_for=60)  # keys.py
    Job.objects.bulk_enqueue(
        [
            {"task": per_tenant, "args": [5]},  # the task's callable, per job
            {"task": ADD, "args": [1, 1], "concurrency_key": "copy"},  # COPY
            {"task": ADD, "args": [1, 1], "concurrency_key": "dedupe", "idempotency_key": "d"},
            {"task": ADD, "args": [1, 1]},  # none
        ]
    )
    bulk.enqueue_many(per_tenant, [((6,), {}), ((7,), {}, {"concurrency_key": "own"})])
    # With a task_enqueued receiver, bulk jobs are written with ids first (both ways).
    heard: list[Any] = []
    receiver = lambda sender, task_result, **kw: heard.append(task_result)  # noqa: E731
    task_enqueued.connect(receiver)
    try:
        Job.objects.bulk_enqueue(
            [
                {"task": ADD, "args": [1, 1], "concurrency_key": "ids"},
                {
                    "task": ADD,
                    "args": [1, 1],
                    "concurrency_key": "ids-key",
                    "idempotency_key": "i",
                },
            ]
        )
    finally:
        task_enqueued.disconnect(receiver)
    assert len(heard) == 2
    # Workflows: a chain's steps (one statement), a dependant (depends_on), and a group
    # larger than a COPY batch (each step's key from the task's callable).
    first, _ = chain(step(per_tenant, 11), step(charge)).enqueue()
    Job.objects.enqueue(per_tenant, [12], depends_on=[first])
    monkeypatch.setattr(bulk, "DEFAULT_BATCH_SIZE", 2)  # COPYed, two steps a batch
    group(step(per_tenant, 13), step(per_tenant, 14), step(charge)).enqueue()
    with override_settings(
        PGQUEUE_PERIODIC={
            "tick": {"task": f"{__name__}.per_tenant", "cron": "* * * * *", "args": [9]}
        }
    ):
        enqueue_due(using="default", now=now)  # a new entry waits for its next tick
        enqueue_due(using="default", now=now + 61 * S)
    keys = sorted(Job.objects.values_list("concurrency_key", flat=True))
    assert keys == sorted(
        [
            "stripe", "tenant:3", "api", "override", "stripe", "tenant:5", "copy", "dedupe",
            "", "tenant:6", "own", "ids", "ids-key", "tenant:11", "stripe", "tenant:12",
            "tenant:13", "tenant:14", "stripe", "tenant:9",
        ]
    )  # fmt: skip


def claim_racing(threads: int, rounds: int, limit: int, view_: flow.FlowView) -> Counter[str]:
    """``threads`` claimers, each on its own connection, claim (``limit`` at a time) and
    end their jobs at once, racing; a sampler on another connection records the most
    jobs of each key it ever saw running."""
    most: Counter[str] = Counter()
    done = threading.Event()
    errors: list[BaseException] = []

    def claimer(n: int) -> None:
        try:
            for _ in range(rounds):
                jobs = Job.objects.claim(f"w{n}", limit=limit, flow_view=view_)
                for job in jobs:
                    Job.objects.complete(job, f"w{n}")
        except BaseException as exc:  # re-raised in the test thread
            errors.append(exc)
        finally:
            connections.close_all()

    def sampler() -> None:
        with connect_test_db(autocommit=True) as conn:
            while not done.is_set():
                for key, jobs in conn.execute(
                    "SELECT concurrency_key, count(*) FROM pgqueue_job "
                    "WHERE status = 'running' GROUP BY 1"
                ):
                    most[key] = max(most[key], jobs)

    watching = threading.Thread(target=sampler)
    watching.start()
    workers = [threading.Thread(target=claimer, args=(n,)) for n in range(threads)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join(60)
    done.set()
    watching.join(10)
    if errors:
        raise errors[0]
    return most


@pytest.mark.concurrency
@pytest.mark.parametrize("plant", [None, "no_budget_lock"], ids=["guarded", "planted"])
def test_flow__racing_claimers_never_exceed_a_limit(plant, monkeypatch):
    """Six claimers racing over a key of concurrency 2 and four tenants of 1: the most
    running at any sample stays within the limits and reaches them. With the budget lock
    planted away (each claimer counts while another's claim of the same budget is in
    flight, uncommitted: held 30 ms longer, as on a loaded server) the limits are
    exceeded."""
    Job.objects.bulk_enqueue(
        [{"task": ADD, "args": [n, 1], "concurrency_key": "stripe"} for n in range(150)]
        + [{"task": ADD, "args": [n, 2], "concurrency_key": f"t:{n % 4}"} for n in range(150)]
    )
    if plant:
        # Claims held open 30 ms once counted, so that racing claims overlap.
        for statement, text in faults.rewritten(plant + ",slow_claim").items():
            monkeypatch.setattr(sql.module_of(statement), statement, text)
    limits = view({"stripe": {"concurrency": 2}, "t:*": {"concurrency": 1}})
    most = claim_racing(threads=6, rounds=40, limit=3, view_=limits)
    tenants = max(most[f"t:{n}"] for n in range(4))
    if plant:
        assert most["stripe"] > 2 or tenants > 1, most
    else:
        assert most["stripe"] == 2 and tenants == 1, most


def test_flow__a_claim_from_the_head_resumes_at_the_first_job_it_left():
    """A claim from the head of the line says where the next may start: at the first
    job it read and did not lease (a job its key's limit kept back), never past it; a
    claim started there leases what follows, and the kept-back job once its key has
    room. With a limit and a worker of every queue, the head is read from there, not
    from the start of the claim index."""
    a_ids = [Job.objects.enqueue(ADD, [n, 1], concurrency_key="a").pk for n in range(3)]
    b_ids = [Job.objects.enqueue(ADD, [n, 2], concurrency_key="b").pk for n in range(3)]
    limited = view({"a": {"concurrency": 1}})
    first = Job.objects.claim_flow("w", limit=2, view=limited)
    assert [j.id for j in first.jobs] == [a_ids[0], b_ids[0]]
    assert first.resume == (0, a_ids[1])  # a's second job: kept back, not passed
    second = Job.objects.claim_flow("w", limit=2, view=limited, after=first.resume)
    assert [j.id for j in second.jobs] == b_ids[1:]
    assert second.resume == first.resume
    Job.objects.complete_many([(j, None) for j in first.jobs], "w")  # a has room again
    third = Job.objects.claim_flow("w", limit=2, view=limited, after=second.resume)
    assert [j.id for j in third.jobs] == [a_ids[1]]
    assert third.resume == (0, a_ids[2])
    # Started past a pending job, a claim does not see it (the worker rescans from the
    # head every PGQUEUE_CLAIM_RESCAN_SECONDS, as for its plain claims).
    Job.objects.complete_many([(j, None) for j in third.jobs], "w")
    assert Job.objects.claim_flow("w", limit=2, view=limited, after=(0, a_ids[2] + 1)).jobs == []
    assert [j.id for j in Job.objects.claim_flow("w", limit=2, view=limited).jobs] == [a_ids[2]]


def test_flow__a_claim_that_walked_says_so_and_the_next_starts_with_the_walk():
    """A key at its limit holding the whole head of the line: the claim from the head
    leases its one job and walks the keys for the rest, and says it walked; a claim
    started with the walk (as a worker makes its next one) still keeps the key to its
    limit and takes the others' jobs."""
    Job.objects.bulk_enqueue(
        [{"task": ADD, "args": [n, 1], "concurrency_key": "big"} for n in range(40)]
        + [{"task": ADD, "args": [n, 2], "concurrency_key": "small"} for n in range(3)]
    )
    limited = view({"big": {"concurrency": 1}})
    first = Job.objects.claim_flow("w", limit=3, view=limited)
    assert sorted(j.concurrency_key for j in first.jobs) == ["big", "small", "small"]
    assert first.walked
    second = Job.objects.claim_flow("w", limit=3, view=limited, walk=True)
    assert [j.concurrency_key for j in second.jobs] == ["small"]
    assert running_by_key() == {"big": 1, "small": 3}


def test_flow__a_full_key_and_a_paused_backlog_are_jumped_not_walked():
    """A key at its limit with 3,000 pending jobs ahead, and a paused queue with 3,000
    more: a claim of four takes the small key's jobs and reads a handful of pages, not
    the backlogs (EXPLAIN BUFFERS of both flow statements)."""
    Job.objects.bulk_enqueue(
        [{"task": ADD, "args": [n, 1], "concurrency_key": "big"} for n in range(3000)]
        + [{"task": ADD, "args": [n, 1], "queue": "paused"} for n in range(3000)]
        + [{"task": ADD, "args": [n, 1], "concurrency_key": "small"} for n in range(4)]
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE pgqueue_job")
    limited = view({"big": {"concurrency": 1}}, paused=frozenset({"paused"}))
    assert [j.concurrency_key for j in Job.objects.claim("w", limit=1, flow_view=limited)] == [
        "big"
    ]
    jobs = Job.objects.claim("w", limit=4, flow_view=limited)
    assert [j.concurrency_key for j in jobs] == ["small"] * 4
    assert running_by_key() == {"big": 1, "small": 4}
    params = {
        **limited.params,
        "worker_id": "w",
        "limit": 4,
        "window": 16,
        "max_steps": 80,
        "queues": None,
        "cursors": "{}",
        "lease_seconds": 30,
        "now": None,
    }
    Job.objects.bulk_enqueue([{"task": ADD, "args": [1, 1]} for _ in range(4)])
    for statement in (sql.JOB_CLAIM_LIMITED, sql.JOB_CLAIM_FLOW):
        with connection.cursor() as cursor:
            cursor.execute("SET jit = off")
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement, params)
            plan = cursor.fetchone()[0]
        buffers = plan[0]["Plan"]["Shared Hit Blocks"] + plan[0]["Plan"]["Shared Read Blocks"]
        assert buffers < 400, (statement[:40], buffers)


def test_flow__every_way_a_job_ends_gives_its_slot_back():
    """Under a limit of 1: while a job runs, its key's next job is not claimed; once it
    ends, whichever way (done, done in a batch, failed, released, snoozed, cancelled,
    its lease rescued by the sweeper), the next one is: the slot is the running row."""
    Job.objects.bulk_enqueue(
        [{"task": ADD, "args": [n, 1], "concurrency_key": "one"} for n in range(9)]
    )
    one = view({"one": {"concurrency": 1}})

    def claim() -> list[Job]:
        return Job.objects.claim("w", limit=3, flow_view=one, lease_seconds=30)

    def snooze(job: Job) -> None:
        params = {"id": job.id, "worker_id": "w", "attempt": job.attempts,
                  "claimed_at": job.last_attempted_at, "seconds": 0.0, "now": None,
                  "channel": "pgqueue_job"}  # fmt: skip
        with connection.cursor() as cursor:
            cursor.execute(sql.JOB_SNOOZE, params)

    def rescue(job: Job) -> None:
        past = dt.datetime.now(dt.UTC) - 60 * S  # its worker died a minute ago
        Job.objects.filter(pk=job.pk).update(lease_expires_at=past)
        assert sweeper.rescue_expired("default")[0] == 1

    endings = [
        lambda job: Job.objects.complete(job, "w"),
        lambda job: Job.objects.complete_many([(job, None)], "w"),
        lambda job: Job.objects.fail(job, "w", ValueError("no")),
        lambda job: Job.objects.release(job, "w"),
        snooze,
        lambda job: Job.objects.cancel([job.id]) and Job.objects.complete(job, "w"),
        rescue,
    ]
    (job,) = claim()
    for end in endings:
        assert claim() == []  # the key's slot is taken
        end(job)
        assert Job.objects.get(pk=job.pk).status != "running"
        (job,) = claim()  # and given back
    assert running_by_key() == {"one": 1}


def test_flow__fair_queue_takes_keys_in_turn():
    """In a fair queue, 6 jobs of a small key enqueued behind 500 of a big one are all
    claimed within the first claims of two; in a queue that is not fair, after the big
    one's backlog."""
    for queue in ("fair", "plain"):
        Job.objects.bulk_enqueue(
            [{"task": ADD, "args": [n, 1], "queue": queue, "concurrency_key": "big"}
             for n in range(500)]
            + [{"task": ADD, "args": [n, 1], "queue": queue, "concurrency_key": "small"}
               for n in range(6)]
        )  # fmt: skip
    fair = view(fair=frozenset({"fair"}))
    cursors: dict[str, str] = {}
    order = []
    for _ in range(8):
        claimed = Job.objects.claim_flow("w", limit=2, view=fair, queues=["fair"], cursors=cursors)
        cursors = claimed.cursors
        order += [job.concurrency_key for job in claimed.jobs]
    assert order.count("small") == 6, order
    plain = Job.objects.claim_flow("w", limit=16, view=fair, queues=["plain"])
    assert {job.concurrency_key for job in plain.jobs} == {"big"}


def test_flow__rate_window_slides_by_the_database_clock(now):
    """2 starts a second: at now two, then none until one second has passed since the
    first (a hundredth short: none), then two more; never a calendar window."""
    Job.objects.bulk_enqueue(
        [{"task": ADD, "args": [n, 1], "concurrency_key": "api"} for n in range(6)]
    )
    rated = view({"api": {"rate": "2/s"}})

    def claim(at: dt.datetime) -> int:
        return len(Job.objects.claim_flow("w", limit=4, view=rated, now=at).jobs)

    assert claim(now) == 2
    assert claim(now + 0.5 * S) == 0
    assert claim(now + 0.99 * S) == 0
    assert claim(now + 1 * S) == 2
    assert claim(now + 1.5 * S) == 0
    window = RateWindow.objects.get(name="api", subject="api")
    assert window.starts == [now + S, now + S]
    assert sweeper.prune_rate_windows("default", now=now + 1.5 * S) == 0
    assert sweeper.prune_rate_windows("default", now=now + 2.01 * S) == 1


def test_flow__a_lowered_limit_lets_running_jobs_finish_and_starts_none_until_below():
    Job.objects.bulk_enqueue(
        [{"task": ADD, "args": [n, 1], "concurrency_key": "db"} for n in range(10)]
    )
    with override_settings(PGQUEUE_LIMITS={"db": {"concurrency": 4}}):
        held = Job.objects.claim("w", limit=10, flow_view=Job.objects.flow_view())
        assert len(held) == 4
        Job.objects.set_limit("db", concurrency=2)
        lowered = Job.objects.flow_view()
        assert lowered.key_limits_of("db")[0].concurrency == 2
        assert Job.objects.claim("w", limit=10, flow_view=lowered) == []
        for job in held[:3]:
            Job.objects.complete(job, "w")
        assert len(Job.objects.claim("w", limit=10, flow_view=lowered)) == 1  # 1 ran, 2 may
        Job.objects.set_limit("db")  # no limit on "db", whatever the settings say
        assert Job.objects.flow_view().key_limits_of("db") == []
        assert Job.objects.reset_limit("db") and not Job.objects.reset_limit("db")
        assert Job.objects.flow_view().key_limits_of("db")[0].concurrency == 4
    with pytest.raises(ValueError, match="concurrency must be"):
        Job.objects.set_limit("db", concurrency=-1)
    # Issue 28 item 18: a clear error, not UnicodeEncodeError from the driver.
    with pytest.raises(ValueError, match=re.escape(r"limit key '\ud800' contains a lone")):
        Job.objects.set_limit("\ud800", concurrency=1)
    assert not Limit.objects.exists()


def test_flow__pause_and_resume_are_stored_and_told_to_workers(other_connection):
    listener = other_connection(autocommit=True)
    listener.execute("LISTEN pgqueue_job")
    Job.objects.pause_queue("emails")
    Job.objects.pause_queue("emails")  # again: still paused since the first time
    assert Job.objects.paused_queues() == ["emails"]
    assert Queue.objects.get(name="emails").paused_at is not None
    payloads = [n.payload for n in listener.notifies(timeout=1, stop_after=2)]
    assert payloads == [flow.NOTIFY_PREFIX] * 2
    assert Job.objects.resume_queue("emails") and not Job.objects.resume_queue("emails")
    assert Job.objects.paused_queues() == []
    with pytest.raises(InvalidJob, match="queue name"):
        Job.objects.pause_queue("no spaces")
    # A worker's listener hands a flow notification to its FlowState at once.
    state = WorkerState(alias="default", worker_id="w", lease_seconds=30)
    heard = threading.Event()
    part = Listener(state, queues=["x"], params=connect_params(), flow_changed=heard.set)
    thread = threading.Thread(target=part.run)
    thread.start()
    try:
        wait_for(state.wakeup.is_set, timeout=10)  # connected (it polls once at start)
        Job.objects.pause_queue("x")
        assert heard.wait(5)
    finally:
        state.done.set()
        thread.join(5)


def connect_params() -> dict[str, Any]:
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return params


def test_flow__without_flow_control_the_claim_is_todays_one_statement(job_factory):
    job_factory()
    with CaptureQueriesContext(connection) as queries:
        assert len(Job.objects.claim("w", limit=5)) == 1
    (query,) = queries
    assert query["sql"].split("SELECT id")[0] == sql.JOB_CLAIM.split("SELECT id")[0]
    assert "concurrency_key" not in query["sql"]
    # Only flow control for other queues: still today's statement for these.
    other = view({"queue:mail": {"concurrency": 1}}, paused=frozenset({"x"}))
    assert not other.in_force(["default"]) and other.in_force(None)


def test_flow__status_dashboard_metrics_and_command_show_limits_and_pauses(admin_client):
    Job.objects.bulk_enqueue(
        [{"task": ADD, "args": [n, 1], "concurrency_key": "stripe"} for n in range(5)]
        + [{"task": ADD, "args": [n, 1], "queue": "mail"} for n in range(2)]
    )
    Job.objects.pause_queue("mail")
    limits = {"stripe": {"concurrency": 2, "rate": "9/m"}, "queue:mail": {"concurrency": 1}}
    with override_settings(PGQUEUE_LIMITS=limits):
        Job.objects.claim("w", limit=5, flow_view=Job.objects.flow_view())
        out = io.StringIO()
        call_command("pgqueue_status", "--json", stdout=out)
        status = json.loads(out.getvalue())
        assert status["queues"]["mail"]["paused"] is True
        stripe = next(b for b in status["limits"] if b["limit"] == "stripe")
        assert (stripe["running"], stripe["concurrency"], stripe["started_in_window"]) == (2, 2, 2)
        assert (stripe["pending"], stripe["waiting"], stripe["rate"]) == (3, 3, "9/m")
        mail = next(b for b in status["limits"] if b["limit"] == "queue:mail")
        assert (mail["queue"], mail["pending"], mail["waiting"]) == ("mail", 2, 0)
        out = io.StringIO()
        call_command("pgqueue_status", stdout=out)
        assert re.search(r"stripe\s+stripe\s+2 / 2\s+2 / 9/m\s+3\s+3", out.getvalue())
        assert "mail (paused)" in out.getvalue()
        page = admin_client.get(reverse("admin:django_pgqueue_dashboard_changelist"))
        html = page.content.decode()
        assert 'data-limit="stripe" data-key="stripe"' in html and "paused" in html
        metrics = admin_client.get("/metrics/pgqueue").content.decode()
        assert 'pgqueue_limit_waiting{key="stripe",limit="stripe"} 3.0' in metrics
        assert 'pgqueue_queue_paused{queue="mail"} 1.0' in metrics
    out = io.StringIO()
    call_command("pgqueue_queue", "list", "--json", stdout=out)
    assert json.loads(out.getvalue())["mail"] == {
        "fair": False,
        "paused": True,
        "pending": 2,
        "running": 0,
    }
    call_command("pgqueue_queue", "resume", "mail", stdout=io.StringIO())
    assert Job.objects.paused_queues() == []
    call_command("pgqueue_queue", "pause", "mail", stdout=io.StringIO())
    assert Job.objects.paused_queues() == ["mail"]


def test_flow__admin_pauses_and_resumes_queues_and_sets_limits(admin_client):
    url = reverse("admin:django_pgqueue_queue_add")
    assert admin_client.post(url, {"name": "mail"}).status_code == 302
    assert Job.objects.paused_queues() == ["mail"]
    changelist = reverse("admin:django_pgqueue_queue_changelist")
    admin_client.post(changelist, {"action": "resume", "_selected_action": ["mail"]})
    assert Job.objects.paused_queues() == []
    admin_client.post(changelist, {"action": "pause", "_selected_action": ["mail"]})
    assert Job.objects.paused_queues() == ["mail"]
    add_limit = reverse("admin:django_pgqueue_limit_add")
    page = admin_client.post(add_limit, {"key": "stripe", "concurrency": "0", "rate": ""})
    assert "concurrency must be an int from 1" in page.content.decode()
    admin_client.post(add_limit, {"key": "stripe", "concurrency": "3", "rate": "5/s"})
    assert Job.objects.flow_view().key_limits_of("stripe")[0].rate == (5, 1.0)
