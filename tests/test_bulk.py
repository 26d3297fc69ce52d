"""bulk.py: COPY first, dedupe by INSERT ... ON CONFLICT, all or nothing, lazy, one NOTIFY."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import logging
import random
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import DatabaseError, connection, transaction
from django.test import override_settings

from django_pgqueue import BulkResult, InvalidJob, enqueue_many, sql, validation
from django_pgqueue.conf import settings
from django_pgqueue.models import Job
from django_pgqueue.taskapi import DUMMY_BACKEND, FRAMEWORK, InvalidTask
from testproject.demo import fault_tasks
from testproject.demo import tasks as demo
from tests.tasks import renamed

ADD = "testproject.demo.tasks.add"
PGQUEUE = "django_pgqueue.backend.PgQueueBackend"
#: Two PgQueueBackend aliases: a job's backend must be one of settings.TASKS.
TWO_BACKENDS = {"default": {"BACKEND": PGQUEUE}, "other": {"BACKEND": PGQUEUE}}


def add_jobs(count: int, **extra: Any) -> Iterator[dict[str, Any]]:
    return ({"task": ADD, "args": [i, 1], **extra} for i in range(count))


def backend_pid() -> int:
    connection.ensure_connection()
    return connection.connection.info.backend_pid


# --- what is stored ----------------------------------------------------------------


@pytest.mark.django_db
@override_settings(TASKS=TWO_BACKENDS)
def test_bulk_enqueue__stores_jobs_with_enqueue_defaults(now):
    future, past = now + dt.timedelta(hours=1), now - dt.timedelta(hours=1)
    created = Job.objects.bulk_enqueue(
        [
            {"task": ADD, "args": [1, 2]},
            {"task": demo.add.using(queue_name="fast", priority=9), "args": (3, 4)},
            {"task": ADD, "kwargs": {"a": 1, "b": 2}, "queue": "q", "priority": -5},
            {"task": ADD, "args": [5, 6], "run_at": future, "max_attempts": 2},
            {"task": ADD, "args": [7, 8], "run_at": past, "backend": "other"},
        ],
        now=now,
    )
    assert created == 5 and isinstance(created, int)
    rows = list(Job.objects.order_by("id"))
    assert [(j.queue, j.priority, j.status, j.max_attempts, j.backend) for j in rows] == [
        ("default", 0, "pending", settings.MAX_ATTEMPTS, "default"),
        ("fast", 9, "pending", settings.MAX_ATTEMPTS, "default"),
        ("q", -5, "pending", settings.MAX_ATTEMPTS, "default"),
        ("default", 0, "scheduled", 2, "default"),
        ("default", 0, "pending", settings.MAX_ATTEMPTS, "other"),
    ]
    assert [(j.args, j.kwargs) for j in rows] == [
        ([1, 2], {}),
        ([3, 4], {}),
        ([], {"a": 1, "b": 2}),
        ([5, 6], {}),
        ([7, 8], {}),
    ]
    assert [j.run_at for j in rows] == [now, now, now, future, past]
    assert {j.created_at for j in rows} == {now}
    assert {(j.task, j.attempts, j.idempotency_key) for j in rows} == {(ADD, 0, None)}
    assert all(j.errors == [] and j.lease_owner is None for j in rows)


@pytest.mark.django_db
def test_bulk_enqueue__matches_enqueue_column_for_column(now):
    single = Job.objects.enqueue(
        demo.add, [1, 2], {"x": [1.5, None]}, queue="q1", priority=3, now=now
    )
    Job.objects.bulk_enqueue(
        [{"task": demo.add, "args": [1, 2], "kwargs": {"x": [1.5, None]}, "queue": "q1",
          "priority": 3}],
        now=now,
    )  # fmt: skip
    bulk = Job.objects.exclude(pk=single.pk).get()
    fields = [f.attname for f in Job._meta.concrete_fields if f.attname != "id"]
    single.refresh_from_db()
    assert {f: getattr(bulk, f) for f in fields} == {f: getattr(single, f) for f in fields}


@pytest.mark.django_db
def test_bulk_enqueue__uses_the_database_clock_when_not_pinned():
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        (before,) = cursor.fetchone()
    Job.objects.bulk_enqueue([{"task": ADD, "run_at": before + dt.timedelta(minutes=5)}])
    job = Job.objects.get()
    # The stamp is the server's clock read during the call, not the client's.
    assert before <= job.created_at < job.run_at
    assert job.status == "scheduled"


@pytest.mark.django_db
def test_bulk_enqueue__empty_input_creates_nothing():
    result = Job.objects.bulk_enqueue([])
    assert (result, result.skipped) == (0, 0)
    assert not Job.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("batch_size", [0, -1, 2.5, True, None])
def test_bulk_enqueue__batch_size_must_be_a_positive_int(batch_size):
    with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
        Job.objects.bulk_enqueue(add_jobs(3), batch_size=batch_size)


# --- COPY first, streaming -----------------------------------------------------------


@pytest.mark.concurrency
@pytest.mark.django_db(transaction=True)
def test_bulk_enqueue__server_runs_copy_or_insert_on_conflict_per_batch(other_connection):
    """The server itself reports what our connection ran for each batch."""
    pid = backend_pid()
    observer = other_connection(autocommit=True)
    seen: dict[int, str] = {}

    def jobs() -> Iterator[dict[str, Any]]:
        for i in range(40):
            if i in (15, 25, 35):  # the batch before this one has been written
                row = observer.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", [pid])
                seen[i] = " ".join(row.fetchone()[0].split())
            key = f"k{i}" if 10 <= i < 20 else None  # only batch 10..19 holds keys
            yield {"task": ADD, "args": [i, 0], "idempotency_key": key}

    assert Job.objects.bulk_enqueue(jobs(), batch_size=10) == 40
    copy_statement = " ".join(sql.JOB_BULK_COPY.split())
    # The INSERT's values are bound client-side, so compare the text before the first.
    insert_prefix = " ".join(sql.JOB_BULK_INSERT_DEDUPE.split()).split("%(")[0]
    assert seen[15] == copy_statement  # jobs 0..9
    assert seen[25].startswith(insert_prefix)  # jobs 10..19 hold keys
    assert seen[35] == copy_statement  # jobs 20..29


@pytest.mark.django_db
def test_bulk_enqueue__generator_is_consumed_lazily():
    pulled = 0
    seen_in_table: dict[int, int] = {}

    def endless() -> Iterator[dict[str, Any]]:
        nonlocal pulled
        for i in itertools.count():
            pulled += 1
            if i in (5, 15):
                # Between batches the connection is free: earlier batches are written.
                seen_in_table[i] = Job.objects.count()
            yield {"task": ADD, "args": [i, 0], "priority": 500 if i == 25 else 0}

    with pytest.raises(InvalidJob, match=r"^job #25: priority 500 is out of range"):
        Job.objects.bulk_enqueue(endless(), batch_size=10)
    assert pulled == 26  # nothing read ahead of the bad job, nothing materialised
    assert seen_in_table == {5: 0, 15: 10}
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_bulk_enqueue__jobs_may_come_from_a_queryset_iterator():
    """A server-side cursor on the same connection is read between COPY batches."""
    Job.objects.bulk_enqueue(add_jobs(25, queue="source"))
    source = Job.objects.filter(queue="source").order_by("id").iterator(chunk_size=4)
    created = Job.objects.bulk_enqueue(
        ({"task": ADD, "args": job.args, "queue": "copy"} for job in source), batch_size=6
    )
    assert created == 25
    copied = Job.objects.filter(queue="copy").order_by("id").values_list("args", flat=True)
    assert list(copied) == [[i, 1] for i in range(25)]


# --- atomic, every error surfaced ---------------------------------------------------


@pytest.mark.django_db
def test_bulk_enqueue__bad_job_in_10000_leaves_the_table_unchanged(job_factory):
    existing = job_factory()

    def jobs() -> Iterator[dict[str, Any]]:
        for i in range(10_000):
            yield {"task": ADD, "args": [i, 1], "priority": 500 if i == 5123 else 0}

    with pytest.raises(InvalidJob) as info:
        Job.objects.bulk_enqueue(jobs())  # default batch: jobs 0..4999 were already sent
    assert str(info.value) == "job #5123: priority 500 is out of range -100..100"
    assert list(Job.objects.values_list("id", flat=True)) == [existing.id]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("job", "reason"),
    [
        ({"task": ADD, "args": [object()]}, "args[0] is a object, which is not JSON"),
        ({"task": ADD, "kwargs": {"v": float("nan")}}, "kwargs['v'] is nan: JSON has no NaN"),
        ({"task": ADD, "args": [{"k": {1: 2}}]}, "args[0]['k'] has a non-string key 1"),
        ({"task": ADD, "args": ["a\x00b"]}, "args[0] contains a NUL character"),
        ({"task": "testproject.demo.tasks.nope"}, "task 'testproject.demo.tasks.nope' does"),
        (
            {"task": "testproject.demo.tasks.not_a_task"},
            "task 'testproject.demo.tasks.not_a_task' is a function",
        ),
        ({"task": renamed}, "task 'tests.tasks._renamed' is a function, not a django"),
        ({"task": ADD, "queue": "bad queue"}, "queue name 'bad queue' is invalid"),
        ({"task": ADD, "queue": ["q"]}, "queue name ['q'] is invalid"),
        ({"task": ADD, "run_at": dt.datetime(2030, 1, 1)}, "run_at 2030-01-01T00:00:00 is naive"),
        ({"task": ADD, "max_attempts": 0}, "max_attempts must be an int >= 1, not 0"),
        # Binary COPY wrapped it around to a negative (or, at 2**32 + 3, to 3).
        ({"task": ADD, "max_attempts": 2**31}, "max_attempts 2147483648 is over the largest"),
        ({"task": ADD, "idempotency_key": ""}, "idempotency_key must be a non-empty str"),
        ({"task": ADD, "backend": 3}, "backend must be a str naming a TASKS alias, not int 3"),
        ({"task": ADD, "backend": ["default"]}, "backend must be a str naming a TASKS alias"),
        ({"task": ADD, "backend": "x" * 100}, "backend 'xxxxxxxx"),
        ({"task": ADD, "backend": "nope"}, "backend 'nope' is not an alias in settings.TASKS"),
        ({"task": ADD, "backend": "de\x00fault"}, "backend contains a NUL character"),
        ({"task": ADD, "backend": "\ud800"}, "backend contains a lone surrogate '\\ud800'"),
        ({"task": ADD, "args": [[10**5000]]}, "args[0][0] is an int of more than 4300 digits"),
        ({"task": ADD, "kwargs": {"n": -(10**5000)}}, "kwargs['n'] is an int of more than"),
        ({"task": ADD, "priority": 10**5000}, "priority an int of 16610 bits is out of range"),
        ({"task": ADD, "queue_name": "q"}, "unknown key 'queue_name'"),
        ({"args": [1, 2]}, "task is required"),
        ([ADD, [1, 2]], "a job must be a mapping of enqueue() arguments, not list"),
    ],
)
def test_bulk_enqueue__error_names_the_job_and_the_reason(job, reason):
    jobs = [*add_jobs(7), job, *add_jobs(3)]
    with pytest.raises(InvalidJob) as info:
        Job.objects.bulk_enqueue(jobs, batch_size=4)
    assert str(info.value).startswith(f"job #7: {reason}")
    assert not Job.objects.exists()


def refuse_kwargs_boom() -> None:
    """Make the server refuse any inserted job whose kwargs hold "boom" (a trigger,
    dropped with the test's transaction)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            CREATE FUNCTION pg_temp.refuse_boom() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.kwargs ? 'boom' THEN RAISE EXCEPTION 'refused job %', NEW.args; END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER refuse_boom BEFORE INSERT ON pgqueue_job
                FOR EACH ROW EXECUTE FUNCTION pg_temp.refuse_boom();
            """
        )


@pytest.mark.django_db
@pytest.mark.parametrize("keyed", [False, True], ids=["copy", "insert"])
def test_bulk_enqueue__database_error_mid_batch_surfaces_and_rolls_back(job_factory, keyed):
    """An error the server raises while storing row 17 is raised, not swallowed."""
    existing = job_factory()
    refuse_kwargs_boom()
    jobs = (
        {
            "task": ADD,
            "args": [i, 0],
            "kwargs": {"boom": 1} if i == 17 else {},
            "idempotency_key": f"k{i}" if keyed else None,
        }
        for i in range(30)
    )
    with pytest.raises(DatabaseError, match=r"refused job \[17, 0\]") as info:
        Job.objects.bulk_enqueue(jobs, batch_size=10)
    assert "while writing jobs #10..#19" in info.value.__notes__
    assert list(Job.objects.values_list("id", flat=True)) == [existing.id]


@pytest.mark.django_db
def test_bulk_enqueue__both_errors_are_reported_when_a_bad_job_follows_a_failed_copy():
    """Batch 0..9 is being COPYed (and refused) while job #12 fails validation."""
    refuse_kwargs_boom()
    jobs = [
        {"task": ADD, "args": [i, 0], "kwargs": {"boom": 1} if i == 3 else {}} for i in range(12)
    ]
    jobs.append({"task": ADD, "priority": 101})
    with pytest.raises(InvalidJob, match=r"^job #12: priority 101") as info:
        Job.objects.bulk_enqueue(jobs, batch_size=10)
    (note,) = info.value.__notes__
    assert note.startswith("writing an earlier batch failed too:")
    assert "refused job [3, 0]" in note
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_bulk_enqueue__failure_inside_a_transaction_keeps_the_callers_work(job_factory):
    with transaction.atomic():
        mine = job_factory()
        with pytest.raises(InvalidJob, match="job #2: "):
            Job.objects.bulk_enqueue([*add_jobs(2), {"task": ADD, "priority": "high"}])
        # Only the bulk call's savepoint was rolled back.
        assert Job.objects.bulk_enqueue(add_jobs(3)) == 3
    assert Job.objects.count() == 4
    assert Job.objects.filter(pk=mine.pk).exists()


@pytest.mark.concurrency
@pytest.mark.django_db(transaction=True)
def test_bulk_enqueue__caller_rollback_removes_jobs_and_wake_ups(other_connection):
    listener = other_connection(autocommit=True)
    listener.execute(f"LISTEN {settings.NOTIFY_CHANNEL}")

    class RollbackError(Exception):
        pass

    with pytest.raises(RollbackError), transaction.atomic():
        assert Job.objects.bulk_enqueue(add_jobs(200, queue="lost")) == 200
        raise RollbackError
    assert not Job.objects.exists()
    # One committed call with 1,000 jobs in two queues: one wake-up per queue, and the
    # rolled-back call's wake-up never arrives (notifications come in commit order).
    jobs = [{"task": ADD, "args": [i, 0], "queue": f"q{i % 2}"} for i in range(1000)]
    assert Job.objects.bulk_enqueue(jobs, batch_size=300) == 1000
    Job.objects.bulk_enqueue([{"task": ADD, "queue": "marker"}])
    payloads: list[str] = []
    for notify in listener.notifies(timeout=10):
        payloads.append(notify.payload)
        if notify.payload == "marker":
            break
    assert payloads == ["q0", "q1", "marker"]


# --- idempotency keys --------------------------------------------------------------


@pytest.mark.django_db
def test_bulk_enqueue__skips_keys_live_in_the_table_or_earlier_in_the_call(job_factory, caplog):
    live = job_factory(idempotency_key="a")
    finished = job_factory(idempotency_key="b")
    Job.objects.filter(pk=finished.pk).update(status="done")  # a done job frees its key
    jobs = [
        {"task": ADD, "args": [1, 0], "idempotency_key": "a"},  # live in the table: skip
        {"task": ADD, "args": [2, 0], "idempotency_key": "b"},  # only a done job: insert
        {"task": ADD, "args": [3, 0], "idempotency_key": "c"},  # new: insert
        {"task": ADD, "args": [4, 0], "idempotency_key": "c"},  # earlier in call: skip
        {"task": ADD, "args": [5, 0], "idempotency_key": "a", "queue": "other"},  # insert
        {"task": ADD, "args": [6, 0]},
        {"task": ADD, "args": [7, 0]},
    ]
    with caplog.at_level(logging.INFO, logger="django_pgqueue.bulk"):
        result = Job.objects.bulk_enqueue(jobs)
    assert (result, result.skipped) == (5, 2)
    assert repr(result) == "BulkResult(created=5, skipped=2)"
    assert "5 jobs created, 2 skipped" in caplog.text
    new = Job.objects.exclude(pk__in=[live.pk, finished.pk]).order_by("id")
    assert [(j.args[0], j.idempotency_key, j.queue) for j in new] == [
        (2, "b", "default"),
        (3, "c", "default"),  # the first of the two "c" jobs wins
        (5, "a", "other"),
        (6, None, "default"),
        (7, None, "default"),
    ]


@pytest.mark.django_db
def test_bulk_enqueue__mixed_batches_keep_input_order():
    jobs = [
        {"task": ADD, "args": [i, 0], "idempotency_key": f"k{i}" if i % 7 == 3 else None}
        for i in range(40)
    ]
    assert Job.objects.bulk_enqueue(jobs, batch_size=6) == 40
    ordered = Job.objects.order_by("id").values_list("args", flat=True)
    assert [args[0] for args in ordered] == list(range(40))


# --- the Tasks framework helper -----------------------------------------------------


@pytest.mark.django_db
def test_enqueue_many__honours_task_using(now):
    run_after = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    task = demo.add.using(queue_name="bulkq", priority=7, run_after=run_after)
    created = enqueue_many(task, [((i, i), {}) for i in range(5)] + [([1], {"b": 2})])
    assert isinstance(created, BulkResult) and created == 6
    rows = list(Job.objects.order_by("id"))
    assert {(j.task, j.queue, j.priority, j.status, j.backend) for j in rows} == {
        (ADD, "bulkq", 7, "scheduled", "default")
    }
    assert {j.run_at for j in rows} == {run_after}
    assert [(j.args, j.kwargs) for j in rows][-2:] == [([4, 4], {}), ([1], {"b": 2})]


@pytest.mark.django_db
def test_enqueue_many__uses_the_backend_alias_and_its_options():
    backends = {
        "default": {"BACKEND": "django_pgqueue.backend.PgQueueBackend"},
        "other": {
            "BACKEND": "django_pgqueue.backend.PgQueueBackend",
            "QUEUES": ["only"],
            "OPTIONS": {"MAX_ATTEMPTS": 2},
        },
    }
    with override_settings(TASKS=backends):
        task = demo.add.using(backend="other", queue_name="only")
        assert enqueue_many(task, [((1, 2), None)]) == 1
        with pytest.raises(InvalidTask, match="Queue 'default' is not valid"):
            enqueue_many(demo.add.using(backend="other"), [((1, 2), {})])
    job = Job.objects.get()
    assert (job.backend, job.queue, job.max_attempts) == ("other", "only", 2)


@pytest.mark.django_db
def test_enqueue_many__uses_the_tasks_own_max_attempts():
    assert enqueue_many(fault_tasks.poison, [((), {})] * 3) == 3
    assert set(Job.objects.values_list("max_attempts", flat=True)) == {3}


@pytest.mark.django_db
def test_bulk_enqueue__task_object_brings_its_own_max_attempts():
    """As enqueue(): a PgQueueTask's max_attempts is the default for its jobs."""
    Job.objects.bulk_enqueue([{"task": fault_tasks.poison}, {"task": fault_tasks.poison}])
    Job.objects.bulk_enqueue([{"task": fault_tasks.poison, "max_attempts": 7}])
    assert sorted(Job.objects.values_list("max_attempts", flat=True)) == [3, 3, 7]
    assert Job.objects.enqueue(fault_tasks.poison).max_attempts == 3


@pytest.mark.django_db
def test_enqueue_many__bad_call_names_its_position():
    with pytest.raises(InvalidJob, match=r"^job #2: expected an \(args, kwargs\) pair"):
        enqueue_many(demo.add, [((1, 2), {}), ((3, 4), {}), (5, 6, 7)])
    with pytest.raises(InvalidJob, match=r"^job #1: kwargs must be a dict, not list"):
        enqueue_many(demo.add, [((1, 2), {}), ((3, 4), [5])])
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_enqueue_many__refuses_a_plain_function_or_another_backend():
    dummy = {"default": {"BACKEND": DUMMY_BACKEND}}
    with override_settings(TASKS=dummy), pytest.raises(InvalidTask, match="PgQueueBackend"):
        enqueue_many(demo.add, [((1, 2), {})])
    with pytest.raises(InvalidTask, match=f"needs a {FRAMEWORK}.Task, not function"):
        enqueue_many(demo.not_a_task, [((), {})])


# --- end to end ---------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_bulk_enqueue__jobs_are_claimed_and_run_by_a_real_worker(manage):
    assert enqueue_many(demo.add, (((i, i), {}) for i in range(300)), batch_size=64) == 300
    worker = manage("pgqueue_worker", "--burst", "--concurrency", "2", "--batch-size", "50")
    assert worker.wait(60) == 0, worker.output()
    done = Job.objects.filter(status="done").values_list("args", "result")
    assert sorted(done) == sorted(([i, i], 2 * i) for i in range(300))


# --- validation.payload's fast path (shared with enqueue()) -------------------------


def reference_payload(args: Any, kwargs: Any) -> tuple[str, str]:
    """validation.payload as it was before its fast path: walk everything, then dump."""
    validation._check_json(list(args), "args")
    validation._check_json(kwargs, "kwargs")
    return (
        json.dumps(list(args), allow_nan=False, separators=(",", ":")),
        json.dumps(kwargs, allow_nan=False, separators=(",", ":")),
    )


def random_value(rng: random.Random, depth: int = 0) -> Any:
    leaves = [
        None, True, False, 0, -7, 2**70, 1.5, float("nan"), float("inf"), "", "plain",
        "a\x00b", "\\u0000", "{", "}{", "é✓", "\n\t\"", object(), {1, 2}, b"bytes",
    ]  # fmt: skip
    if depth > 3 or rng.random() < 0.5:
        return rng.choice(leaves)
    if rng.random() < 0.5:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    keys = ["k", "{", "k\x00", 1, True, None, 2.5, "é"]
    return {rng.choice(keys): random_value(rng, depth + 1) for _ in range(rng.randrange(4))}


def test_payload__fast_path_agrees_with_the_full_walk():
    rng = random.Random(20261129)
    for _ in range(3000):
        args = [random_value(rng) for _ in range(rng.randrange(3))]
        kwargs = {rng.choice(["a", "b", "{", "a\x00"]): random_value(rng)}
        try:
            expected: Any = reference_payload(args, kwargs)
        except InvalidJob as exc:
            expected = str(exc)
        try:
            got: Any = validation.payload(args, kwargs, max_bytes=10**6)
        except InvalidJob as exc:
            got = str(exc)
        assert got == expected, (args, kwargs)


@pytest.mark.django_db
def test_bulk_enqueue__task_object_brings_its_run_after():
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    Job.objects.bulk_enqueue(
        [{"task": demo.add.using(run_after=later), "args": [1, 2]}, {"task": demo.add}]
    )
    rows = sorted(Job.objects.values_list("status", "run_at"), key=lambda r: r[0])
    assert rows[0][0] == "pending"
    assert rows[1] == ("scheduled", later)


@pytest.mark.django_db
def test_bulk_enqueue__plain_jobs_still_need_a_default_backend():
    # A job of only task, args and kwargs takes the fast path; its default backend
    # alias is checked all the same, and nothing is stored.
    tasks = {"other": {"BACKEND": "django_pgqueue.backend.PgQueueBackend"}}
    with override_settings(TASKS=tasks), pytest.raises(InvalidJob, match="job #0: backend"):
        Job.objects.bulk_enqueue([{"task": "testproject.demo.tasks.add", "args": [1, 2]}])
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_bulk_enqueue__plain_jobs_get_every_default(now):
    Job.objects.bulk_enqueue([{"task": "testproject.demo.tasks.add", "args": (1, 2)}], now=now)
    job = Job.objects.get()
    assert (job.backend, job.queue, job.priority, job.status) == (
        "default",
        "default",
        0,
        "pending",
    )
    assert (job.args, job.kwargs, job.max_attempts, job.run_at) == ([1, 2], {}, 5, now)
    assert (job.idempotency_key, job.errors, job.created_at) == (None, [], now)
