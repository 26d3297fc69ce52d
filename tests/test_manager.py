"""Job.objects: enqueue, claim, leases, fenced completion, failure, release.

Times are pinned with the ``now`` fixture wherever a statement accepts ``now=``, so every
timestamp the database writes can be compared exactly.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import sys
import threading
import time

import psycopg
import pytest
from django.db import connection, connections, transaction

from django_pgqueue import db, sql
from django_pgqueue.exceptions import InvalidJob
from django_pgqueue.models import Job
from django_pgqueue.sweeper import promote_due, sweep
from django_pgqueue.taskapi import FRAMEWORK
from testproject.demo import tasks
from tests import tasks as test_tasks
from tests.conftest import wait_for

S = dt.timedelta(seconds=1)


def fresh(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def db_clock() -> dt.datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def boom(message: str = "boom") -> ValueError:
    """A raised (so it has a traceback) exception."""
    try:
        raise ValueError(message)
    except ValueError as exc:
        return exc


def claim_one(worker_id: str = "w1", **kwargs) -> Job:
    (job,) = Job.objects.claim(worker_id, limit=1, **kwargs)
    return job


def row_snapshot(job: Job) -> dict:
    """Every column of a job's row, to show a write changed nothing."""
    return Job.objects.filter(pk=job.pk).values().get()


# --- enqueue -------------------------------------------------------------------------


@pytest.mark.django_db
def test_enqueue__is_one_query(django_assert_num_queries):
    with django_assert_num_queries(1):
        Job.objects.enqueue(tasks.add, [1, 2])
    assert Job.objects.count() == 1


@pytest.mark.django_db
def test_enqueue__stores_a_pending_job(job_factory, now):
    job = job_factory(args=[1, 2], kwargs={"x": [1, {"y": None}]}, now=now)
    row = fresh(job)
    assert row.task == "testproject.demo.tasks.add"
    assert row.args == [1, 2]
    assert row.kwargs == {"x": [1, {"y": None}]}
    assert (row.status, row.attempts, row.max_attempts) == ("pending", 0, 5)
    assert (row.queue, row.priority) == ("default", 0)
    assert row.run_at == row.created_at == now
    assert row.lease_owner is None and row.lease_expires_at is None
    assert row.errors == [] and row.result is None


@pytest.mark.django_db
def test_enqueue__accepts_a_dotted_path_to_a_task(job_factory):
    job = job_factory(task="testproject.demo.tasks.add")
    assert fresh(job).task == tasks.add.module_path


@pytest.mark.django_db
def test_enqueue__takes_queue_and_priority_from_the_task(job_factory):
    job = job_factory(task=tasks.add.using(queue_name="mail", priority=7))
    assert (fresh(job).queue, fresh(job).priority) == ("mail", 7)
    override = job_factory(task=tasks.add.using(queue_name="mail"), queue="x", priority=-3)
    assert (fresh(override).queue, fresh(override).priority) == ("x", -3)


@pytest.mark.django_db
def test_enqueue__takes_run_after_from_the_task(job_factory, now):
    job = job_factory(task=tasks.add.using(run_after=now + 60 * S), now=now)
    assert (fresh(job).status, fresh(job).run_at) == ("scheduled", now + 60 * S)
    override = job_factory(task=tasks.add.using(run_after=now + 60 * S), run_at=now, now=now)
    assert (fresh(override).status, fresh(override).run_at) == ("pending", now)


@pytest.mark.django_db
def test_enqueue__run_at_boundary_decides_scheduled_or_pending(job_factory, now):
    later = job_factory(run_at=now + S, now=now)
    due = job_factory(run_at=now, now=now)
    past = job_factory(run_at=now - S, now=now)
    assert fresh(later).status == "scheduled"
    assert fresh(later).run_at == now + S
    assert fresh(due).status == "pending"
    assert fresh(past).status == "pending"
    assert fresh(past).run_at == now - S


@pytest.mark.django_db
def test_enqueue__joins_the_callers_transaction(job_factory):
    class RollbackError(Exception):
        pass

    with pytest.raises(RollbackError), transaction.atomic():
        job_factory()
        assert Job.objects.count() == 1
        raise RollbackError
    assert Job.objects.count() == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.concurrency
def test_enqueue__notifies_listeners_at_commit_only(job_factory, other_connection):
    listener = other_connection(autocommit=True)
    listener.execute("LISTEN pgqueue_job")

    def notifications(timeout: float) -> list[str]:
        return [n.payload for n in listener.notifies(timeout=timeout, stop_after=1)]

    with pytest.raises(RuntimeError), transaction.atomic():
        job_factory(queue="rolled-back")
        raise RuntimeError
    with transaction.atomic():
        job_factory(queue="mail")
        assert notifications(0.2) == []  # not before commit
    assert notifications(5.0) == ["mail"]
    assert notifications(0.2) == []  # and nothing for the rolled-back job


# --- idempotency keys ----------------------------------------------------------------


@pytest.mark.django_db
def test_enqueue__idempotency_key_returns_the_live_job(job_factory):
    first = job_factory(idempotency_key="order-1", args=[1, 1])
    second = job_factory(idempotency_key="order-1", args=[2, 2])
    assert second.id == first.id
    assert Job.objects.count() == 1
    assert fresh(first).args == [1, 1]  # the existing job is not overwritten


@pytest.mark.django_db
def test_enqueue__idempotency_key_matches_running_and_scheduled_jobs(job_factory, now):
    running = job_factory(idempotency_key="r")
    claim_one()
    assert job_factory(idempotency_key="r").id == running.id
    scheduled = job_factory(idempotency_key="s", run_at=now + dt.timedelta(days=3650))
    assert fresh(scheduled).status == "scheduled"
    assert job_factory(idempotency_key="s").id == scheduled.id
    assert Job.objects.count() == 2


@pytest.mark.django_db
def test_enqueue__idempotency_key_is_per_queue(job_factory):
    a = job_factory(idempotency_key="k", queue="a")
    b = job_factory(idempotency_key="k", queue="b")
    assert a.id != b.id
    assert Job.objects.count() == 2


@pytest.mark.django_db
def test_enqueue__idempotency_key_is_free_again_once_the_job_is_done(job_factory):
    first = job_factory(idempotency_key="k")
    job = claim_one()
    assert Job.objects.complete(job, "w1", result=3)
    second = job_factory(idempotency_key="k")
    assert second.id != first.id
    assert fresh(second).status == "pending"
    assert Job.objects.count() == 2


@pytest.mark.django_db
def test_enqueue__idempotency_key_is_free_again_once_the_job_is_dead(job_factory):
    first = job_factory(idempotency_key="k", max_attempts=1)
    assert Job.objects.fail(claim_one(), "w1", boom()) == "dead"
    assert job_factory(idempotency_key="k").id != first.id


def enqueue_key_on(conn: psycopg.Connection, key: str) -> int:
    """JOB_ENQUEUE on a raw connection (its transaction left open); returns the id."""
    params = {
        "backend": "default",
        "task": "testproject.demo.tasks.add",
        "queue": "default",
        "priority": 0,
        "run_at": None,
        "max_attempts": 5,
        "idempotency_key": key,
        "concurrency_key": "",
        "soft_time_limit": None,
        "time_limit": None,
        "tags": [],
        "channel": "pgqueue_job",
        "now": None,
        "args": "[1, 2]",
        "kwargs": "{}",
        "trace_context": None,
    }
    cursor = psycopg.ClientCursor(conn)
    cursor.execute(sql.JOB_ENQUEUE, params)
    return cursor.fetchone()[0]


@pytest.mark.django_db(transaction=True)
@pytest.mark.concurrency
@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_enqueue__racing_the_same_idempotency_key(other_connection, outcome):
    """A second enqueue waits for the first one's transaction: after its commit it
    returns that job; after its rollback it inserts its own."""
    first = other_connection()
    first_id = enqueue_key_on(first, "race")
    got: list[Job] = []

    def second() -> None:
        try:
            got.append(Job.objects.enqueue(tasks.add, [1, 2], idempotency_key="race"))
        finally:
            connections.close_all()

    thread = threading.Thread(target=second)
    thread.start()
    watcher = other_connection(autocommit=True)
    wait_for(
        lambda: watcher.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND query LIKE '%INSERT INTO pgqueue_job%'"
        ).fetchone()[0],
        timeout=10,
    )
    getattr(first, outcome)()
    thread.join(10)
    (job,) = got
    assert Job.objects.count() == 1
    if outcome == "commit":
        assert job.id == first_id
    else:
        assert job.id != first_id
        assert Job.objects.get().id == job.id


# --- enqueue validation: every bad input is rejected before any query ------------------

NOT_A_TASK = "testproject.demo.tasks.not_a_task"
BAD_INPUTS = {
    "task_object": ({"task": 42}, f"task must be a {FRAMEWORK}.Task or its dotted path, not int"),
    "task_function": ({"task": tasks.not_a_task}, "not function"),
    "task_missing_attr": (
        {"task": "testproject.demo.tasks.nope"},
        "task 'testproject.demo.tasks.nope' does not import",
    ),
    "task_missing_module": (
        {"task": "no_such_pkg.mod.fn"},
        "'no_such_pkg.mod.fn' does not import",
    ),
    "task_plain_function_path": (
        {"task": NOT_A_TASK},
        f"task '{NOT_A_TASK}' is a function, not a {FRAMEWORK}.Task",
    ),
    # A worker loads a task by its module path; this one's path names a plain function.
    "task_object_path_not_a_task": (
        {"task": test_tasks.renamed},
        f"task 'tests.tasks._renamed' is a function, not a {FRAMEWORK}.Task",
    ),
    "args_dict": ({"args": {"a": 1}}, "args must be a list or tuple, not dict"),
    "args_object": ({"args": [object()]}, "args[0] is a object, which is not JSON"),
    "args_set": ({"args": [1, {1, 2}]}, "args[1] is a set"),
    "args_bytes": ({"args": [b"x"]}, "args[0] is a bytes"),
    "args_nan": ({"args": [float("nan")]}, "args[0] is nan: JSON has no NaN or Infinity"),
    "args_infinity": ({"args": [[float("inf")]]}, "args[0][0] is inf"),
    "args_negative_infinity": ({"args": [float("-inf")]}, "args[0] is -inf"),
    "args_nul": ({"args": ["a\x00b"]}, "args[0] contains a NUL character"),
    "args_lone_surrogate": ({"args": ["a\ud800"]}, "args[0] contains a lone surrogate '\\ud800'"),
    "kwargs_lone_surrogate_key": (
        {"kwargs": {"\udfff": 1}},
        "kwargs key '\\udfff' contains a lone surrogate",
    ),
    "kwargs_not_dict": ({"kwargs": [1]}, "kwargs must be a dict, not list"),
    "kwargs_int_key": ({"kwargs": {1: "x"}}, "kwargs has a non-string key 1"),
    "kwargs_nested_key": ({"kwargs": {"a": {None: 1}}}, "kwargs['a'] has a non-string key None"),
    "kwargs_nul_key": ({"kwargs": {"a\x00": 1}}, "kwargs has a key with a NUL character"),
    "kwargs_nul_value": ({"kwargs": {"a": ["\x00"]}}, "kwargs['a'][0] contains a NUL"),
    "kwargs_datetime": ({"kwargs": {"at": dt.datetime(2030, 1, 1)}}, "is a datetime"),
    "priority_high": ({"priority": 101}, "priority 101 is out of range -100..100"),
    "priority_low": ({"priority": -101}, "priority -101 is out of range -100..100"),
    "priority_str": ({"priority": "5"}, "priority must be an int, not '5'"),
    "priority_float": ({"priority": 1.5}, "priority must be an int, not 1.5"),
    "priority_bool": ({"priority": True}, "priority must be an int, not True"),
    "queue_empty": ({"queue": ""}, "queue name '' is invalid"),
    "queue_65_chars": ({"queue": "q" * 65}, f"queue name '{'q' * 65}' is invalid"),
    "queue_space": ({"queue": "two words"}, "queue name 'two words' is invalid"),
    "queue_sql": (
        {"queue": '"; drop table pgqueue_job; --'},
        "queue name '\"; drop table pgqueue_job; --' is invalid",
    ),
    "queue_not_str": ({"queue": 7}, "queue name 7 is invalid"),
    "run_at_naive": (
        {"run_at": dt.datetime(2030, 1, 1, 12)},
        "run_at 2030-01-01T12:00:00 is naive: give it a timezone",
    ),
    "run_at_str": ({"run_at": "2030-01-01"}, "run_at must be a datetime, not str"),
    "max_attempts_zero": ({"max_attempts": 0}, "max_attempts must be an int >= 1, not 0"),
    "max_attempts_negative": ({"max_attempts": -2}, "max_attempts must be an int >= 1, not -2"),
    "max_attempts_bool": ({"max_attempts": True}, "max_attempts must be an int >= 1, not True"),
    # Over the integer column: a DataError that aborted the caller's transaction.
    "max_attempts_over_int4": (
        {"max_attempts": 2**31},
        "max_attempts 2147483648 is over the largest allowed, 2147483647",
    ),
    "key_too_long": ({"idempotency_key": "k" * 256}, "at most 255 characters"),
    "key_empty": ({"idempotency_key": ""}, "idempotency_key must be a non-empty str"),
    "key_not_str": ({"idempotency_key": 5}, "idempotency_key must be a non-empty str"),
    "key_nul": ({"idempotency_key": "a\x00"}, "idempotency_key contains a NUL character"),
    # psycopg raised a bare UnicodeEncodeError while sending it.
    "key_lone_surrogate": (
        {"idempotency_key": "a\ud800"},
        "idempotency_key contains a lone surrogate '\\ud800'",
    ),
    # Over the varchar(64) column: a DataError that aborted the caller's transaction.
    "backend_100_chars": (
        {"backend": "x" * 100},
        f"backend '{'x' * 76}... is 100 characters: a TASKS alias of 1 to 64 characters is needed",
    ),
    # NOT NULL column: an IntegrityError that aborted the caller's transaction.
    "backend_list": (
        {"backend": ["default"]},
        "backend must be a str naming a TASKS alias, not list",
    ),
    "backend_int": ({"backend": 7}, "backend must be a str naming a TASKS alias, not int 7"),
    "backend_empty": ({"backend": ""}, "backend '' is 0 characters"),
    # Accepted and stored before: its TaskResult could never be read back.
    "backend_unknown": (
        {"backend": "nope"},
        "backend 'nope' is not an alias in settings.TASKS (configured: 'default', 'second')",
    ),
    "backend_nul": ({"backend": "de\x00fault"}, "backend contains a NUL character"),
    "backend_lone_surrogate": ({"backend": "\udc80"}, "backend contains a lone surrogate"),
    # Past Python's int-to-str digit limit the JSON encoder raised a bare ValueError.
    "args_huge_int": ({"args": [10**5000]}, "args[0] is an int of more than 4300 digits"),
    "args_huge_negative_int": ({"args": [1, -(10**5000)]}, "args[1] is an int of more than"),
    "kwargs_nested_huge_int": (
        {"kwargs": {"a": [{"b": 10**5000}]}},
        "kwargs['a'][0]['b'] is an int of more than 4300 digits: too large to store as JSON",
    ),
    "kwargs_huge_int_key": (
        {"kwargs": {10**5000: 1}},
        "kwargs has a non-string key an int of 16610 bits",
    ),
    "priority_huge_int": ({"priority": 10**5000}, "priority an int of 16610 bits is out of"),
    "max_attempts_huge_int": ({"max_attempts": 10**5000}, "max_attempts an int of 16610 bits"),
    "queue_huge_int": ({"queue": 10**5000}, "queue name an int of 16610 bits is invalid"),
    "key_huge_int": ({"idempotency_key": 10**5000}, "not an int of 16610 bits"),
}


@pytest.mark.django_db
@pytest.mark.parametrize(("overrides", "message"), BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_enqueue__rejects_bad_input_before_writing(
    job_factory, django_assert_num_queries, overrides, message
):
    with django_assert_num_queries(0), pytest.raises(InvalidJob, match=re.escape(message)):
        job_factory(**overrides)
    assert Job.objects.count() == 0


@pytest.mark.django_db
@pytest.mark.parametrize(
    "backend",
    ["x" * 100, ["default"], 3, "nope", "a\x00", "\ud800"],
    ids=["long", "list", "int", "unknown", "nul", "surrogate"],
)
def test_enqueue__bad_backend_leaves_the_callers_transaction_usable(job_factory, backend):
    with transaction.atomic():
        kept = job_factory()
        with pytest.raises(InvalidJob, match="backend"):
            job_factory(backend=backend)
        assert job_factory().id > kept.id  # the transaction still works
    assert Job.objects.count() == 2


@pytest.mark.django_db
def test_enqueue__backend_must_be_a_pgqueue_backend(job_factory, settings):
    settings.TASKS = {
        "default": {"BACKEND": "django_pgqueue.backend.PgQueueBackend"},
        "other": {"BACKEND": "django_pgqueue.backend.PgQueueBackend"},
        "now": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"},
        "gone": {"BACKEND": "no_such_module.Backend"},
    }
    assert job_factory(backend="other").backend == "other"
    with pytest.raises(InvalidJob, match="backend 'now' is 'django.tasks.backends.immediate"):
        job_factory(backend="now")
    with pytest.raises(InvalidJob, match="backend 'gone' is 'no_such_module.Backend' in"):
        job_factory(backend="gone")
    assert Job.objects.count() == 1


def test_enqueue__largest_int_python_writes_is_accepted(job_factory):
    limit = sys.get_int_max_str_digits()
    job = job_factory(args=[10 ** (limit - 1), -(10 ** (limit - 1))])
    assert fresh(job).args == [10 ** (limit - 1), -(10 ** (limit - 1))]


@pytest.mark.django_db
def test_enqueue__rejects_payload_over_the_limit(job_factory, settings):
    settings.PGQUEUE_MAX_PAYLOAD_BYTES = 100
    job_factory(args=["x" * 40], kwargs={"y": "z" * 40})  # 44 + 48 bytes: fits
    with pytest.raises(InvalidJob, match=r"payload is 101 bytes, over the limit of 100"):
        job_factory(args=["x" * 40], kwargs={"y": "z" * 49})
    assert Job.objects.count() == 1


@pytest.mark.django_db
def test_enqueue__non_ascii_text_round_trips(job_factory):
    text = "caf\u00e9 \U0001f600 \u65e5\u672c"  # accented, outside the BMP, CJK
    job = job_factory(args=[text], kwargs={text: [text]})
    assert (fresh(job).args, fresh(job).kwargs) == ([text], {text: [text]})


@pytest.mark.django_db
def test_enqueue__largest_key_and_queue_are_accepted(job_factory):
    job = job_factory(idempotency_key="k" * 255, queue="Q_.-9" + "q" * 59)
    assert len(fresh(job).queue) == 64


# --- claim ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_claim__is_one_query(job_factory, django_assert_num_queries):
    for _ in range(3):
        job_factory()
    with django_assert_num_queries(1):
        jobs = Job.objects.claim("w1", limit=2)
    assert len(jobs) == 2


@pytest.mark.django_db
def test_claim__jobs_are_the_rows_the_orm_reads(job_factory):
    """Claimed jobs are built without RawQuerySet: every field must still come back as
    the ORM reads it (JSON decoded once, times aware, the instance bound to its db)."""
    job_factory(args=[{"a": [1, 2]}, "x"], kwargs={"k": None}, idempotency_key="key-1")
    (claimed,) = Job.objects.claim("w1", limit=1)
    row = Job.objects.get(pk=claimed.pk)
    for field in Job._meta.concrete_fields:
        assert getattr(claimed, field.attname) == getattr(row, field.attname), field.name
    assert claimed.args == [{"a": [1, 2]}, "x"]
    assert claimed.kwargs == {"k": None}
    assert claimed.last_attempted_at.tzinfo is not None
    # psycopg's own timestamp loader (the claim's) gives Django's very tzinfo.
    assert claimed.created_at.tzinfo is row.created_at.tzinfo
    assert (claimed._state.adding, claimed._state.db) == (False, "default")
    assert claimed == row and hash(claimed) == hash(row)
    claimed.refresh_from_db()  # a usable instance
    assert claimed.status == "running"


@pytest.mark.django_db
def test_claim__times_match_the_orm_without_use_tz(job_factory, settings):
    """psycopg's own timestamp loader is used only where it gives Django's value (UTC
    sessions): without USE_TZ, Django's loader (naive datetimes) is kept."""
    settings.USE_TZ = False  # Django resets the connection's time zone for this
    job_factory()
    (claimed,) = Job.objects.claim("w1", limit=1)
    row = Job.objects.get(pk=claimed.pk)
    for name in ("created_at", "run_at", "started_at", "last_attempted_at"):
        assert getattr(claimed, name) == getattr(row, name), name
        assert getattr(claimed, name).tzinfo is None, name


@pytest.mark.django_db
def test_claim__is_planned_for_its_parameters_every_time(job_factory):
    """The claim is never a prepared statement: its generic plan (one plan for any
    LIMIT and position) sorts the whole backlog. Other statements on the same
    connection are prepared (enqueue sets the connection's threshold)."""
    for _ in range(12):
        job_factory()
        Job.objects.claim("w1", limit=1)
        Job.objects.claim("w1", limit=1, after=(0, 0))
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        statements = [row[0] for row in cursor.fetchall()]
    assert any("INSERT INTO pgqueue_job" in text for text in statements)
    assert not [text for text in statements if "SET status = 'running'" in text]


@pytest.mark.django_db(transaction=True)
def test_claim__prepared_with_a_generic_plan_on_a_claim_connection(job_factory):
    """A worker's claim connection (its set-up rules out the plans a generic plan could
    go wrong with) prepares the claims and plans each once."""
    from django_pgqueue.reconnect import close_connection
    from django_pgqueue.worker.connections import configure_session

    configure_session("default", "claim", "w-generic")
    try:
        for _ in range(8):
            job_factory()
            assert len(Job.objects.claim("w1", limit=5)) == 1
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                "WHERE statement LIKE %s",
                ["%SET status = 'running'%"],
            )
            counts = cursor.fetchall()
    finally:
        close_connection("default")  # the next test gets an ordinary connection
    assert [(generic > 0, custom) for generic, custom in counts] == [(True, 0)]


@pytest.mark.django_db
def test_claim__init_signals_are_sent_when_received(job_factory):
    """Without receivers of pre_init/post_init the claim skips Model.__init__; with one,
    the jobs are built by Model.from_db, which sends them."""
    from django.db.models.signals import post_init

    made = job_factory()
    seen: list[int] = []

    def receiver(sender: type, instance: Job, **kwargs: object) -> None:
        seen.append(instance.pk)

    post_init.connect(receiver, sender=Job)
    try:
        (claimed,) = Job.objects.claim("w1", limit=1)
    finally:
        post_init.disconnect(receiver, sender=Job)
    assert seen == [made.pk] and claimed.pk == made.pk


@pytest.mark.django_db
def test_jobs__extra_returned_columns_become_attributes():
    made = Job.objects.enqueue(tasks.add, [1, 2])
    (job,) = db.jobs(
        Job,
        "default",
        "SELECT *, 'x' AS extra FROM pgqueue_job WHERE id = %(id)s",
        {"id": made.id},
    )
    assert job.extra == "x"
    assert (job.id, job.args, job.errors) == (made.id, [1, 2], [])


@pytest.mark.django_db
def test_jobs__columns_in_another_order_and_json_as_json_loads_reads_it():
    """The row builder takes columns in any order, and reads each JSON value as
    ``json.loads`` does (its fast path for PostgreSQL's own jsonb text included)."""
    values = [[], {}, [1, {"a": [None, True, 1.5, "\u00e9\n"]}], {"k": {}}, "s", 12, None]
    made = Job.objects.enqueue(tasks.add, values, {"nested": values})
    (job,) = db.jobs(
        Job,
        "default",
        "SELECT kwargs, 'x' AS extra, * FROM pgqueue_job WHERE id = %(id)s",
        {"id": made.id},
    )
    assert (job.args, job.kwargs, job.errors, job.extra) == (values, {"nested": values}, [], "x")
    for text in ("[]", "{}", "[1, 2]", '{"a": "b"}', "null", "1e400", '"x"', "[] ", " 1"):
        assert db.load_json(text) == json.loads(text)
    for bad in ("", "[1,", "[] x"):
        with pytest.raises(json.JSONDecodeError):
            db.load_json(bad)
    assert db.load_json("[]") is not db.load_json("[]")  # a new list each time


@pytest.mark.django_db
def test_claim__empty_queue_returns_nothing(db):
    assert Job.objects.claim("w1", limit=5) == []


@pytest.mark.django_db
def test_claim__orders_by_priority_then_id(job_factory):
    made = [job_factory(priority=p) for p in (0, 10, -5, 10, 0)]
    low0, high1, neg, high2, low1 = (j.id for j in made)
    # One at a time, so the database's order is shown, not a sort in Python.
    order = [claim_one().id for _ in made]
    assert order == [high1, high2, low0, low1, neg]


@pytest.mark.django_db
def test_claim__limit_takes_the_highest_priorities_first(job_factory):
    made = [job_factory(priority=p) for p in (1, 2, 3, 4)]
    claimed = Job.objects.claim("w1", limit=2)
    assert [j.id for j in claimed] == [made[3].id, made[2].id]


@pytest.mark.django_db
def test_claim__queue_filter(job_factory):
    a = job_factory(queue="a")
    b = job_factory(queue="b", priority=50)
    c = job_factory(queue="c")
    assert [j.id for j in Job.objects.claim("w1", limit=5, queues=["a", "c"])] == [a.id, c.id]
    assert Job.objects.claim("w1", limit=5, queues=["missing"]) == []
    assert Job.objects.claim("w1", limit=5, queues=[]) == []
    assert fresh(b).status == "pending"


@pytest.mark.django_db
def test_claim__sets_lease_and_charges_the_attempt(job_factory, now):
    job = job_factory(now=now)
    claimed = claim_one("w1", lease_seconds=30, now=now)
    assert claimed.id == job.id
    row = fresh(job)
    assert (row.status, row.lease_owner, row.attempts) == ("running", "w1", 1)
    assert row.lease_expires_at == now + 30 * S
    assert row.started_at == row.last_attempted_at == now
    # The returned object carries what the fenced writes need.
    assert (claimed.attempts, claimed.lease_owner) == (1, "w1")


@pytest.mark.django_db
def test_claim__default_lease_comes_from_settings(job_factory, now, settings):
    settings.PGQUEUE_LEASE_SECONDS = 42
    job_factory()
    assert claim_one(now=now).lease_expires_at == now + 42 * S


@pytest.mark.django_db(transaction=True)
def test_claim__uses_the_database_clock(job_factory):
    job_factory()
    before = db_clock()
    claimed = claim_one(lease_seconds=60)
    after = db_clock()
    # clock_timestamp() at the statement, not the transaction start or Python's clock.
    assert before + 60 * S <= claimed.lease_expires_at <= after + 60 * S
    assert before <= claimed.started_at <= after


@pytest.mark.django_db
def test_claim__ignores_scheduled_running_done_and_dead_jobs(job_factory, now):
    job_factory(run_at=now + 60 * S, now=now)  # scheduled
    job_factory(max_attempts=1)
    Job.objects.fail(claim_one(), "w1", boom())  # dead
    job_factory()
    Job.objects.complete(claim_one(), "w1")  # done
    job_factory()
    claim_one()  # running
    # Even with the clock far past run_at: scheduled jobs need promotion first.
    assert Job.objects.claim("w2", limit=10, now=now + dt.timedelta(days=1)) == []


@pytest.mark.django_db
def test_claim__started_at_keeps_the_first_attempt(job_factory, now):
    job_factory(now=now)
    job = claim_one(now=now)
    Job.objects.fail(job, "w1", boom(), now=now + S)
    promote_due("default", now=now + dt.timedelta(hours=1))
    again = claim_one(now=now + dt.timedelta(hours=2))
    assert again.attempts == 2
    assert again.started_at == now
    assert again.last_attempted_at == now + dt.timedelta(hours=2)


# --- claim under concurrency (real second connections) --------------------------------


def claim_on(conn: psycopg.Connection, worker_id: str, limit: int) -> list[int]:
    """Run JOB_CLAIM on a raw psycopg connection, bound client-side like Django does."""
    cursor = psycopg.ClientCursor(conn)
    params = {"worker_id": worker_id, "limit": limit, "queues": None}
    cursor.execute(sql.JOB_CLAIM, {**params, "lease_seconds": 60, "now": None})
    return sorted(row[0] for row in cursor.fetchall())


@pytest.mark.django_db(transaction=True)
@pytest.mark.concurrency
def test_claim__concurrent_claims_get_disjoint_jobs_without_waiting(job_factory, other_connection):
    ids = {job_factory().id for _ in range(6)}
    holder = other_connection()  # autocommit off: the claim's locks stay held
    held = claim_on(holder, "w1", 3)
    assert len(held) == 3

    # Plain FOR UPDATE on those rows would wait: the locks really are held...
    blocked = other_connection(autocommit=True)
    blocked.execute("SET lock_timeout = '100ms'")
    with pytest.raises(psycopg.errors.LockNotAvailable):
        blocked.execute("SELECT id FROM pgqueue_job WHERE id = ANY(%s) FOR UPDATE", [held])

    # ...yet a second claimer skips them and returns the others at once.
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '100ms'")
            cursor.execute("SET LOCAL statement_timeout = '2s'")
        started = time.monotonic()
        other = Job.objects.claim("w2", limit=6)
        elapsed = time.monotonic() - started
    assert elapsed < 1.0
    assert {j.id for j in other} == ids - set(held)
    holder.commit()
    owners = dict(Job.objects.values_list("id", "lease_owner"))
    assert owners == {i: ("w1" if i in held else "w2") for i in ids}


@pytest.mark.django_db(transaction=True)
@pytest.mark.concurrency
def test_claim__racing_workers_never_share_a_job(job_factory):
    """Four threads (four connections) claim in a loop until the queue is empty."""
    ids = {job_factory().id for _ in range(200)}
    claimed: dict[str, list[int]] = {}
    start = threading.Barrier(4)

    def work(worker_id: str) -> None:
        mine: list[int] = []
        try:
            start.wait()
            while batch := Job.objects.claim(worker_id, limit=5):
                mine += [j.id for j in batch]
        finally:
            claimed[worker_id] = mine
            connections.close_all()

    threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    every = [i for mine in claimed.values() for i in mine]
    assert len(claimed) == 4
    assert sorted(every) == sorted(ids)  # each job claimed exactly once
    assert Job.objects.filter(status="running", attempts=1).count() == 200


# --- extend_leases -------------------------------------------------------------------


@pytest.mark.django_db
def test_extend_leases__owner_extends(job_factory, now):
    job_factory()
    job = claim_one("w1", lease_seconds=10, now=now)
    owned = Job.objects.extend_leases("w1", [job], lease_seconds=60, now=now + 5 * S)
    assert owned == {job.id}
    assert fresh(job).lease_expires_at == now + 65 * S


@pytest.mark.django_db
def test_extend_leases__non_owner_extends_nothing(job_factory, now):
    job_factory()
    job = claim_one("w1", lease_seconds=10, now=now)
    before = row_snapshot(job)
    assert Job.objects.extend_leases("w2", [job], lease_seconds=60, now=now) == set()
    assert Job.objects.extend_leases("w2", [job.id], lease_seconds=60, now=now) == set()
    assert row_snapshot(job) == before


@pytest.mark.django_db
def test_extend_leases__stale_attempt_extends_nothing(job_factory, now):
    job_factory()
    first = claim_one("w1", lease_seconds=10, now=now)
    sweep(now=now + 11 * S)  # lease expired and taken back
    second = claim_one("w1", lease_seconds=10, now=now + 12 * S)
    assert second.attempts == 2
    # Same worker id, older attempt: the job it holds is not the one running now.
    assert Job.objects.extend_leases("w1", [first], now=now + 13 * S) == set()
    assert Job.objects.extend_leases("w1", [second], now=now + 13 * S) == {second.id}


@pytest.mark.django_db
def test_extend_leases__reports_only_the_leases_still_owned(job_factory, now):
    job_factory()
    job_factory()
    kept, lost = Job.objects.claim("w1", limit=2, lease_seconds=10, now=now)
    Job.objects.complete(lost, "w1")
    assert Job.objects.extend_leases("w1", [kept, lost], now=now) == {kept.id}


@pytest.mark.django_db
def test_extend_leases__nothing_given_is_no_query(django_assert_num_queries):
    with django_assert_num_queries(0):
        assert Job.objects.extend_leases("w1", []) == set()


# --- complete: fenced ----------------------------------------------------------------


@pytest.mark.django_db
def test_complete__stores_result_and_finishes(job_factory, now):
    job_factory()
    job = claim_one(now=now)
    assert Job.objects.complete(job, "w1", result={"sum": 3}, now=now + S) is True
    row = fresh(job)
    assert (row.status, row.result) == ("done", {"sum": 3})
    assert row.finished_at == now + S
    assert row.lease_expires_at is None
    assert Job.objects.complete(job, "w1") is False  # only once


@pytest.mark.django_db
def test_complete__late_worker_cannot_complete_a_reclaimed_job(job_factory, now):
    job_factory()
    stale = claim_one("A", lease_seconds=10, now=now)
    result = sweep(now=now + 11 * S)
    assert result.recovered == 1
    current = claim_one("B", lease_seconds=10, now=now + 12 * S)
    assert current.id == stale.id
    before = row_snapshot(current)
    assert (before["status"], before["lease_owner"], before["attempts"]) == ("running", "B", 2)

    assert Job.objects.complete(stale, "A", result="late") is False
    assert Job.objects.fail(stale, "A", boom()) is None
    assert Job.objects.release(stale, "A") is False
    assert Job.objects.extend_leases("A", [stale]) == set()
    assert row_snapshot(current) == before

    assert Job.objects.complete(current, "B", result="on time") is True
    assert fresh(current).result == "on time"


@pytest.mark.django_db
def test_complete__same_worker_older_attempt_is_fenced_out(job_factory, now):
    job_factory()
    stale = claim_one("A", lease_seconds=10, now=now)
    sweep(now=now + 11 * S)
    current = claim_one("A", lease_seconds=10, now=now + 12 * S)
    assert Job.objects.complete(stale, "A") is False
    assert fresh(current).status == "running"


@pytest.mark.django_db
def test_complete__same_worker_run_before_a_requeue_is_fenced_out(job_factory, now):
    """Requeue resets attempts, so the same worker claiming the job again holds the
    same (owner, attempt) as its run that died: that run, finishing late, must still
    change nothing."""
    job_factory(max_attempts=1)
    stale = claim_one("A", lease_seconds=10, now=now)
    assert sweep(now=now + 11 * S).dead == 1
    assert Job.objects.requeue_dead([stale.id], now=now + 12 * S) == [stale.id]
    current = claim_one("A", lease_seconds=10, now=now + 13 * S)
    assert (current.lease_owner, current.attempts) == (stale.lease_owner, stale.attempts)
    before = row_snapshot(current)

    assert Job.objects.complete(stale, "A", result="late") is False
    assert Job.objects.fail(stale, "A", boom()) is None
    assert Job.objects.release(stale, "A") is False
    assert Job.objects.extend_leases("A", [stale], now=now + 14 * S) == set()
    assert row_snapshot(current) == before

    assert Job.objects.extend_leases("A", [current], now=now + 14 * S) == {current.id}
    assert Job.objects.complete(current, "A", result="on time") is True
    assert fresh(current).result == "on time"


@pytest.mark.django_db
def test_complete__rejects_a_non_json_result_without_writing(job_factory):
    job_factory()
    job = claim_one()
    with pytest.raises(InvalidJob, match="return value is nan: JSON has no NaN"):
        Job.objects.complete(job, "w1", result=float("nan"))
    assert fresh(job).status == "running"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("value", "message"),
    [("a\x00b", "return value contains a NUL"), (["\ud800"], "lone surrogate")],
    ids=["nul", "lone_surrogate"],
)
def test_complete__rejects_a_result_jsonb_cannot_store(job_factory, value, message):
    """Refused as InvalidJob before the write, not as a DataError from the database."""
    job_factory()
    job = claim_one()
    with pytest.raises(InvalidJob, match=message):
        Job.objects.complete(job, "w1", result=value)
    assert fresh(job).status == "running"


@pytest.mark.django_db
def test_complete__int_keys_become_strings_like_json(job_factory):
    job_factory()
    job = claim_one()
    assert Job.objects.complete(job, "w1", result={1: "one"})
    assert fresh(job).result == {"1": "one"}


# --- fail: backoff, errors, dead-lettering --------------------------------------------


def fail_attempt(job_id: int, at: dt.datetime, exc: BaseException | None = None) -> str | None:
    """Promote (if needed), claim and fail the job once at a pinned time."""
    promote_due("default", now=at)
    job = claim_one("w1", now=at)
    assert job.id == job_id
    return Job.objects.fail(job, "w1", exc or boom(f"attempt {job.attempts}"), now=at)


@pytest.mark.django_db
def test_fail__schedules_a_retry_with_backoff_within_bounds(job_factory, now, settings):
    settings.PGQUEUE_RETRY_BACKOFF_BASE = 2.0
    settings.PGQUEUE_RETRY_BACKOFF_MAX = 3600.0
    job = job_factory()
    assert fail_attempt(job.id, now) == "scheduled"
    row = fresh(job)
    # base * 2**(attempt-1) with +-25% jitter: 1.5 s .. 2.5 s after the first failure.
    assert now + 1.5 * S <= row.run_at <= now + 2.5 * S
    assert row.finished_at is None and row.lease_expires_at is None
    later = now + dt.timedelta(hours=1)
    assert fail_attempt(job.id, later) == "scheduled"
    assert later + 3 * S <= fresh(job).run_at <= later + 5 * S  # doubled


@pytest.mark.django_db
def test_fail__backoff_is_capped(job_factory, now, settings):
    settings.PGQUEUE_RETRY_BACKOFF_BASE = 10.0
    settings.PGQUEUE_RETRY_BACKOFF_MAX = 12.0
    job = job_factory()
    fail_attempt(job.id, now)
    later = now + dt.timedelta(hours=1)
    fail_attempt(job.id, later)  # 20 s +-25% would be 15..25 s: capped at 12
    assert fresh(job).run_at == later + 12 * S


@pytest.mark.django_db
def test_fail__retry_is_not_claimable_until_promoted(job_factory, now):
    job = job_factory()
    fail_attempt(job.id, now)
    assert Job.objects.claim("w1", limit=1, now=now + dt.timedelta(days=1)) == []
    assert promote_due("default", now=now + S) == 0  # backoff not over yet
    assert promote_due("default", now=now + dt.timedelta(minutes=1)) == 1
    assert fresh(job).status == "pending"


@pytest.mark.django_db
def test_fail__keeps_class_path_and_traceback(job_factory, now):
    job = job_factory()
    fail_attempt(job.id, now, boom("the reason"))
    (error,) = fresh(job).errors
    assert error["exception_class_path"] == "builtins.ValueError"
    assert error["traceback"].startswith("Traceback (most recent call last):")
    assert "ValueError: the reason" in error["traceback"]
    assert (error["worker_id"], error["attempt"]) == ("w1", 1)


@pytest.mark.django_db
def test_fail__message_with_nul_or_lone_surrogate_is_stored_escaped(job_factory, now):
    job = job_factory()
    assert fail_attempt(job.id, now, boom("bad \x00 and \udc80 here")) == "scheduled"
    (error,) = fresh(job).errors
    assert "ValueError: bad \\x00 and \\udc80 here" in error["traceback"]


@pytest.mark.django_db
def test_fail__errors_are_bounded_to_keep_errors(job_factory, now, settings):
    settings.PGQUEUE_KEEP_ERRORS = 2
    job = job_factory(max_attempts=5)
    for hour in range(3):
        fail_attempt(job.id, now + dt.timedelta(hours=hour))
    errors = fresh(job).errors
    assert [e["attempt"] for e in errors] == [2, 3]  # the newest two, oldest first
    assert "attempt 3" in errors[-1]["traceback"]


@pytest.mark.django_db
def test_fail__last_attempt_is_dead(job_factory, now):
    job = job_factory(max_attempts=2)
    assert fail_attempt(job.id, now) == "scheduled"
    assert fail_attempt(job.id, now + dt.timedelta(hours=1)) == "dead"
    row = fresh(job)
    assert (row.status, row.attempts, len(row.errors)) == ("dead", 2, 2)
    assert row.finished_at == now + dt.timedelta(hours=1)
    assert row.lease_expires_at is None
    # Dead is final: nothing promotes or claims it.
    assert sweep(now=now + dt.timedelta(days=30)).promoted == 0
    assert Job.objects.claim("w1", limit=1) == []


@pytest.mark.django_db
def test_fail__without_retry_is_dead_at_once(job_factory, now):
    job = job_factory(max_attempts=5)
    claimed = claim_one(now=now)
    assert Job.objects.fail(claimed, "w1", boom(), retry=False, now=now) == "dead"
    assert (fresh(job).status, fresh(job).attempts) == ("dead", 1)


@pytest.mark.django_db
def test_fail__by_non_owner_changes_nothing(job_factory):
    job_factory()
    job = claim_one("w1")
    before = row_snapshot(job)
    assert Job.objects.fail(job, "w2", boom()) is None
    assert row_snapshot(job) == before


# --- release -------------------------------------------------------------------------


@pytest.mark.django_db
def test_release__returns_to_pending_without_charging_the_attempt(job_factory):
    job_factory()
    job = claim_one("w1")
    assert Job.objects.release(job, "w1") is True
    row = fresh(job)
    assert (row.status, row.attempts, row.lease_owner, row.lease_expires_at) == (
        "pending",
        0,
        None,
        None,
    )
    assert claim_one("w2").attempts == 1


@pytest.mark.django_db
def test_release__by_non_owner_changes_nothing(job_factory):
    job_factory()
    job = claim_one("w1")
    before = row_snapshot(job)
    assert Job.objects.release(job, "w2") is False
    assert row_snapshot(job) == before


@pytest.mark.django_db
@pytest.mark.parametrize("limit", [0, -1, 1.5, True])
def test_claim__rejects_a_bad_limit_before_any_query(limit, django_assert_num_queries):
    with django_assert_num_queries(0), pytest.raises(ValueError, match="claim limit"):
        Job.objects.claim("w", limit=limit)


@pytest.mark.django_db
def test_enqueue__rejects_a_payload_that_contains_itself(django_assert_num_queries):
    cyclic: list = [1]
    cyclic.append(cyclic)
    with django_assert_num_queries(0), pytest.raises(InvalidJob, match="contains itself"):
        Job.objects.enqueue(tasks.add, cyclic)
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_enqueue__accepts_a_shared_non_cyclic_value():
    shared = {"a": 1}
    job = Job.objects.enqueue(tasks.add, [[shared, shared]])
    assert Job.objects.get(pk=job.pk).args == [[{"a": 1}, {"a": 1}]]


@pytest.mark.django_db
def test_enqueue__returns_the_job_as_stored(now):
    job = Job.objects.enqueue(
        tasks.add, (1, 2.5), {"z": {"b": [None, True]}, "a": "é"}, queue="q.1",
        priority=-3, max_attempts=2, idempotency_key="k", now=now,
    )  # fmt: skip
    row = Job.objects.get(pk=job.pk)
    fields = [f.attname for f in Job._meta.concrete_fields]
    assert {f: getattr(job, f) for f in fields} == {f: getattr(row, f) for f in fields}
    assert job._state.adding is False and job._state.db == "default"


@pytest.mark.django_db
def test_enqueue__scheduled_job_is_returned_scheduled(now):
    later = now + dt.timedelta(hours=1)
    job = Job.objects.enqueue(tasks.add, [1, 2], run_at=later, now=now)
    assert (job.status, job.run_at, job.created_at) == ("scheduled", later, now)


def prepared_enqueues() -> int:
    """JOB_ENQUEUE statements prepared in this session (psycopg names them _pg3_N)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s",
            ["%INSERT INTO pgqueue_job AS j%"],
        )
        return cursor.fetchone()[0]


@pytest.mark.django_db(transaction=True)
def test_enqueue__is_prepared_by_default():
    connection.close()
    Job.objects.enqueue(tasks.add, [1, 2])
    Job.objects.enqueue(tasks.add, [3, 4], queue="other")
    assert prepared_enqueues() == 1  # one statement, prepared once, run twice
    assert db.prepares("default")


@pytest.mark.django_db(transaction=True)
def test_enqueue__respects_a_prepare_threshold_of_none(monkeypatch):
    options = {**connection.settings_dict["OPTIONS"], "prepare_threshold": None}
    monkeypatch.setitem(connection.settings_dict, "OPTIONS", options)
    connection.close()
    try:
        for n in range(3):
            Job.objects.enqueue(tasks.add, [n, 1])
        assert Job.objects.count() == 3
        assert prepared_enqueues() == 0
        assert not db.prepares("default")
    finally:
        connection.close()  # the next test's connection has the settings' own options


@pytest.mark.django_db
def test_enqueue__times_keep_django_time_zone_after_the_session_changes_its_own():
    """The enqueue's psycopg cursor is kept on the connection (db._kept_cursor); one
    made before a SET TIME ZONE must not read the times after it in the session's zone."""
    first = Job.objects.enqueue(tasks.add, [1, 2])
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL TIME ZONE 'Europe/Paris'")
    second = Job.objects.enqueue(tasks.add, [3, 4])
    assert first.created_at.tzinfo == second.created_at.tzinfo == dt.UTC
    assert second.created_at == Job.objects.get(pk=second.pk).created_at


@pytest.mark.django_db
def test_claim__after_resumes_behind_the_position_in_claim_order(job_factory):
    low, mid1, mid2, mid3 = (job_factory(priority=p) for p in (-5, 0, 0, 0))
    high = job_factory(priority=9)
    # Resuming after mid1: the higher priority first, then mid2, mid3, then lower ones;
    # nothing of the same priority before the position (mid1 itself is not pending, but
    # a job there would be skipped too until the next claim from the head).
    got = Job.objects.claim("w1", limit=10, after=(0, mid1.id))
    assert [j.id for j in got] == [high.id, mid2.id, mid3.id, low.id]
    assert fresh(mid1).status == "pending"
    assert [j.id for j in Job.objects.claim("w1", limit=10)] == [mid1.id]


@pytest.mark.django_db
def test_claim__after_takes_one_position_of_all_queues_or_one_per_queue(job_factory):
    with pytest.raises(ValueError, match="a position per queue"):
        Job.objects.claim("w1", limit=1, queues=["default"], after=(0, 1))
    with pytest.raises(ValueError, match="one position"):
        Job.objects.claim("w1", limit=1, after={"default": (0, 1)})


@pytest.mark.django_db
def test_claim__queues_after_resume_each_queue_behind_its_own_position(job_factory):
    """A worker of some queues resumes each queue's line where its previous claim of that
    queue ended (higher priorities first, then the rest of that priority, then lower);
    a queue without a position is taken from its head."""
    a_low, a_mid1, a_mid2 = (job_factory(queue="a", priority=p) for p in (-5, 0, 0))
    a_high = job_factory(queue="a", priority=9)
    b1, b2 = job_factory(queue="b", priority=3), job_factory(queue="b", priority=3)
    c1 = job_factory(queue="c", priority=1)
    got = Job.objects.claim(
        "w1", limit=10, queues=["a", "b", "c"], after={"a": (0, a_mid1.id), "b": (3, b1.id)}
    )
    # a: behind mid1 only (mid1 itself waits for a claim from the head); b: behind b1;
    # c: from its head. Across queues, in claim order.
    assert [j.id for j in got] == [a_high.id, b2.id, c1.id, a_mid2.id, a_low.id]
    assert fresh(a_mid1).status == fresh(b1).status == "pending"
    assert {j.id for j in Job.objects.claim("w1", limit=10, queues=["a", "b"])} == {
        a_mid1.id,
        b1.id,
    }


@pytest.mark.django_db
def test_claim__queues_take_the_best_of_each_queue_by_priority(job_factory):
    a1, a2 = job_factory(queue="a", priority=1), job_factory(queue="a", priority=1)
    b1 = job_factory(queue="b", priority=5)
    job_factory(queue="c", priority=99)
    got = Job.objects.claim("w1", limit=2, queues=["a", "b"])
    assert [j.id for j in got] == [b1.id, a1.id]
    # The rows its other branch looked at were not kept locked or claimed.
    assert fresh(a2).status == "pending"
    assert [j.id for j in Job.objects.claim("w2", limit=5, queues=["a"])] == [a2.id]


@pytest.mark.django_db
def test_enqueue__returned_job_matches_the_stored_row_field_by_field(job_factory):
    """The fast path builds the Job from what it sent plus what the database decided;
    every concrete field (columns added later included) must equal the stored row."""
    job = job_factory(idempotency_key="match-1", priority=3)
    stored = Job.objects.get(pk=job.pk)
    for field in Job._meta.concrete_fields:
        assert getattr(job, field.attname) == getattr(stored, field.attname), field.attname


def nested(levels: int, leaf: object = 1) -> object:
    """``leaf`` inside ``levels`` lists."""
    value = leaf
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.django_db
@pytest.mark.parametrize("levels", [500, 501, 1200, 1489])
@pytest.mark.parametrize("where", ["args", "kwargs", "bulk"])
def test_enqueue__refuses_more_than_500_levels_of_nesting(levels, where):
    """The documented limit, on the encoder's fast path too (it takes ~1,500 levels)."""
    value = nested(levels)  # the leaf is inside levels + 1 containers with args' list
    args, kwargs = ([value], None) if where != "kwargs" else ([], {"v": value})
    with pytest.raises(InvalidJob, match="nested more than 500 levels deep"):
        if where == "bulk":
            Job.objects.bulk_enqueue([{"task": tasks.add, "args": args}])
        else:
            Job.objects.enqueue(tasks.add, args, kwargs)
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_enqueue__accepts_500_levels_and_many_brackets_side_by_side():
    deepest = Job.objects.enqueue(tasks.add, [nested(499)])
    wide = Job.objects.enqueue(tasks.add, [[[] for _ in range(2000)], "[[[{{{" * 200])
    assert Job.objects.get(pk=deepest.pk).args == [nested(499)]
    assert len(Job.objects.get(pk=wide.pk).args[0]) == 2000


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (nested(501), "return value is nested more than 500 levels deep"),
        ("x" * 101, "is 103 bytes as JSON, over the limit of 100 (PGQUEUE_MAX_RESULT_BYTES)"),
        ({"a": ["ok", "b\x00"]}, "return value['a'][1] contains a NUL"),
        ({1, 2}, "return value is of type set, which JSON cannot hold"),
        ([1.0, float("inf")], "return value[1] is inf: JSON has no NaN or Infinity"),
    ],
    ids=["deep", "too_big", "nul", "set", "inf"],
)
def test_result_json__refuses_what_jsonb_would_refuse(value, message):
    from django_pgqueue.exceptions import InvalidResult
    from django_pgqueue.validation import result_json

    with pytest.raises(InvalidResult, match=re.escape(message)):
        result_json(value, max_bytes=100 if isinstance(value, str) else 10_000)


def test_result_json__refuses_an_int_numeric_cannot_hold_when_python_would_write_it():
    """With Python's int-to-text limit lifted, an int of more digits than jsonb's numeric
    holds is still refused (the database would answer "value overflows numeric format")."""
    from django_pgqueue.exceptions import InvalidResult
    from django_pgqueue.validation import result_json

    previous = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        with pytest.raises(InvalidResult, match=r"return value\[0\] is an int of more than"):
            result_json([10**140_000], max_bytes=1_000_000)
        assert result_json([10**5000], max_bytes=1_000_000).startswith("[1000")
    finally:
        sys.set_int_max_str_digits(previous)


def test_result_json__keeps_common_values_as_json_writes_them():
    from django_pgqueue.validation import result_json

    value = {"n": 1, "s": "é😀", "l": [None, True, 2.5], "1": {}}
    assert result_json(value) == '{"n":1,"s":"\\u00e9\\ud83d\\ude00","l":[null,true,2.5],"1":{}}'


@pytest.mark.django_db(transaction=True)
def test_cancel__a_running_job_is_announced_on_the_channel(job_factory, other_connection):
    """One NOTIFY per CANCEL_NOTIFY_IDS running ids, after the commit, with a payload no
    queue name has; a pending job needs none (it is cancelled in place)."""
    from django_pgqueue.manager import CANCEL_NOTIFY_IDS, CANCEL_NOTIFY_PREFIX

    listener = other_connection(autocommit=True)
    listener.execute("LISTEN pgqueue_job")
    Job.objects.bulk_enqueue([{"task": tasks.add, "args": [1, 2]}] * (CANCEL_NOTIFY_IDS + 5))
    running = sorted(j.id for j in Job.objects.claim("w1", limit=CANCEL_NOTIFY_IDS + 5))
    pending = job_factory()
    list(listener.notifies(timeout=0.2))  # the enqueues' wake-ups
    with transaction.atomic():
        assert Job.objects.cancel([*running, pending.id]).requested == running
        assert list(listener.notifies(timeout=0.2)) == []  # not before the commit
    payloads = [n.payload for n in listener.notifies(timeout=1.0, stop_after=2)]
    assert all(p.startswith(CANCEL_NOTIFY_PREFIX) for p in payloads)
    named = [int(i) for p in payloads for i in p[len(CANCEL_NOTIFY_PREFIX) :].split(",")]
    assert sorted(named) == running
    assert len(payloads) == 2 and max(len(p) for p in payloads) < 8000


def test_manager__error_entry_is_deprecated_and_still_works():
    """Removed without a deprecation in this release, restored with one."""
    from django_pgqueue.manager import error_entry

    with pytest.warns(DeprecationWarning, match="error_entry"):
        entry = error_entry(ValueError("boom"), worker_id="w1", attempt=2)
    assert entry["exception_class_path"] == "builtins.ValueError"
    assert "ValueError: boom" in entry["traceback"]
    assert (entry["worker_id"], entry["attempt"]) == ("w1", 2)
