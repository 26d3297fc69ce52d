"""Durable steps in-process, on real PostgreSQL: ``run_step`` and ``arun_step`` (plain
and transactional), their checks and fence, cursors and durable sleeps. The runs
through real worker processes, killed mid-step, are in test_steps_process.py."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
from io import StringIO
from typing import Any

import psycopg
import pytest
from asgiref.sync import sync_to_async
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.test import override_settings
from django.urls import reverse

from django_pgqueue import InvalidStep, LeaseLost, Snooze, chain, step
from django_pgqueue.models import Job, JobStep
from django_pgqueue.sweeper import sweep
from django_pgqueue.tasks import CancelFlag, CurrentJob, RunningJob
from django_pgqueue.testing import run_jobs
from testproject.demo.models import Execution
from tests import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def claim(job: Job) -> Job:
    (claimed,) = Job.objects.claim("w1", limit=1)
    assert claimed.id == job.id
    return claimed


def run_of(job: Job, worker_id: str = "w1", transactional: bool = False) -> CurrentJob:
    """What ``current_job()`` gives a run of the claimed ``job``."""
    return RunningJob(job, worker_id, transactional, CancelFlag(), "default").current()


def again(job: Job) -> Job:
    """The job given back and claimed again: a later run, at a new attempt."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE pgqueue_job SET status = 'pending', lease_owner = NULL WHERE id = %s",
            [job.id],
        )
    return claim(job)


def counter() -> tuple[list[Any], Any]:
    calls: list[Any] = []

    def fn(*args: Any, **kwargs: Any) -> Any:
        calls.append((args, kwargs))
        return {"args": list(args), **kwargs}

    return calls, fn


def stored(job: Job) -> list[tuple[str, str, Any, int]]:
    return [(s.kind, s.name, s.value, s.attempt) for s in JobStep.objects.filter(job_id=job.id)]


def test_steps__a_step_runs_once_and_later_runs_get_its_value(job_factory):
    job = claim(job_factory())
    calls, fn = counter()
    first = run_of(job)
    assert first.run_step("load", fn, 1, (2, 3), name="x") == {"args": [1, [2, 3]], "name": "x"}
    assert len(calls) == 1
    later = run_of(again(job))
    assert later.attempt == 2
    assert later.run_step("load", fn, 1, (2, 3), name="x") == {"args": [1, [2, 3]], "name": "x"}
    assert later.run_step("next", fn, 4) == {"args": [4]}
    assert len(calls) == 2
    for value in ("text", None, 1.5, [], True):
        assert later.run_step(f"scalar {value!r}", lambda v=value: v) == value
    assert [run_of(again(job)).run_step(f"scalar {v!r}", fn) for v in ("text", None)] == [
        "text",
        None,
    ]
    assert stored(job)[:2] == [
        ("step", "load", {"args": [1, [2, 3]], "name": "x"}, 1),
        ("step", "next", {"args": [4]}, 2),
    ]
    step = job.steps.first()
    assert step is not None
    assert step.size == len('{"args":[1,[2,3]],"name":"x"}')


def test_steps__an_exception_propagates_and_records_nothing(job_factory):
    job = claim(job_factory())

    def boom() -> None:
        raise KeyError("nope")

    with pytest.raises(KeyError):
        run_of(job).run_step("boom", boom)
    assert stored(job) == []
    assert run_of(again(job)).run_step("boom", lambda: 7) == 7


@pytest.mark.parametrize(
    ("name", "message"),
    [("", "non-empty str"), ("  ", "non-empty str"), (3, "not 3"), ("x" * 201, "at most 200")],
)
def test_steps__a_bad_name_is_refused(job_factory, name, message):
    job = claim(job_factory())
    calls, fn = counter()
    with pytest.raises(InvalidStep, match=message):
        run_of(job).run_step(name, fn)
    assert calls == [] and stored(job) == []


def test_steps__a_name_twice_in_one_run_a_bad_or_big_value_are_refused(job_factory):
    job = claim(job_factory())
    run = run_of(job)
    run.run_step("a", lambda: 1)
    with pytest.raises(InvalidStep, match="step 'a' was already run in this run"):
        run.run_step("a", lambda: 2)
    with pytest.raises(InvalidStep, match="step 'obj' not recorded: its value must be JSON"):
        run.run_step("obj", lambda: {"at": object()})
    with (
        override_settings(PGQUEUE_MAX_RESULT_BYTES=1000),
        pytest.raises(InvalidStep, match=r"step 'big' not recorded: its value is 2002 bytes"),
    ):
        run.run_step("big", lambda: "x" * 2000)
    assert stored(job) == [("step", "a", 1, 1)]


def test_steps__a_worker_that_lost_the_job_records_nothing(job_factory):
    job = claim(job_factory())
    with pytest.raises(LeaseLost, match="step 'late' not recorded"):
        run_of(job, worker_id="w2").run_step("late", lambda: 1)
    stale = run_of(job)
    again(job)  # the attempt moved on: the old run is fenced out
    with pytest.raises(LeaseLost):
        stale.run_step("late", lambda: 1)
    assert stored(job) == []


def write_execution(job: Job, kind: str) -> int:
    return Execution.objects.create(job_id=job.id, attempt=1, kind=kind, worker_id="w1").id


def test_steps__a_transactional_step_commits_its_writes_with_the_record(job_factory):
    job = claim(job_factory())
    run_of(job).run_step("tx", write_execution, job, "tx", transactional=True)
    assert Execution.objects.filter(job_id=job.id).count() == 1
    assert run_of(again(job)).run_step("tx", write_execution, job, "tx", transactional=True)
    assert Execution.objects.filter(job_id=job.id).count() == 1


def test_steps__a_transactional_step_whose_lease_was_taken_back_rolls_back(
    job_factory, other_connection
):
    """The lease is taken back (another worker claims the job, as after a rescue) while
    ``fn`` runs: the fenced record finds no row, and ``fn``'s write rolls back."""
    job = claim(job_factory())
    rescuer = other_connection(autocommit=True)

    def taken_back() -> int:
        row = write_execution(job, "tx")
        rescuer.execute(
            "UPDATE pgqueue_job SET lease_owner = 'w2', attempts = attempts + 1 WHERE id = %s",
            [job.id],
        )
        return row

    with pytest.raises(LeaseLost, match="step 'tx' not recorded"):
        run_of(job).run_step("tx", taken_back, transactional=True)
    assert Execution.objects.filter(job_id=job.id).count() == 0
    assert stored(job) == []


def test_steps__a_write_holds_off_a_rescue_until_its_transaction_commits(
    job_factory, other_connection
):
    """A step's write locks the job's row FOR SHARE until its transaction ends: a
    rescue (an UPDATE of the row) cannot slip in between the record and the commit."""
    job = claim(job_factory())
    cur = run_of(job).cursor("pos")
    rescuer = other_connection(autocommit=True)
    rescuer.execute("SET lock_timeout = '200ms'")
    take = "UPDATE pgqueue_job SET lease_owner = 'w2' WHERE id = %s"
    with transaction.atomic():
        cur.save(1)
        with pytest.raises(psycopg.errors.LockNotAvailable):
            rescuer.execute(take, [job.id])
    rescuer.execute(take, [job.id])


async def close_thread_connections() -> None:
    """Close the connection of the thread sync_to_async ran on (else it outlives the
    test and the test database cannot be dropped)."""
    await sync_to_async(connections.close_all, thread_sensitive=True)()


def test_steps__arun_step_awaits_coroutines_and_runs_plain_functions(job_factory):
    job = claim(job_factory())
    calls: list[int] = []

    async def fetch(n: int) -> list[int]:
        calls.append(n)
        await asyncio.sleep(0)
        return [n, n]

    async def main(run: CurrentJob) -> tuple[Any, ...]:
        a = await run.arun_step("fetch", fetch, 3)
        b = await run.arun_step("plain", lambda: calls.append(0) or "p")
        c = await run.arun_step("tx", write_execution, job, "tx", transactional=True)
        with pytest.raises(InvalidStep, match="plain function"):
            await run.arun_step("tx2", fetch, 1, transactional=True)
        with pytest.raises(InvalidStep, match="already run"):
            await run.arun_step("fetch", fetch, 3)
        await close_thread_connections()
        return a, b, c

    first = asyncio.run(main(run_of(job)))
    assert first[:2] == ([3, 3], "p") and calls == [3, 0]
    later = run_of(again(job))

    async def resumed() -> tuple[Any, ...]:
        values = (
            await later.arun_step("fetch", fetch, 3),
            await later.arun_step("plain", lambda: calls.append(9) or "q"),
            await later.arun_step("tx", write_execution, job, "tx", transactional=True),
        )
        await close_thread_connections()
        return values

    assert asyncio.run(resumed()) == first
    assert calls == [3, 0]
    assert Execution.objects.filter(job_id=job.id).count() == 1


def test_steps__a_transactional_task_just_calls_its_steps(job_factory):
    job = claim(job_factory())
    run = run_of(job, transactional=True)
    assert run.run_step("a", lambda: (1, 2)) == [1, 2]
    assert stored(job) == []
    with pytest.raises(RuntimeError, match="not available in a transactional task"):
        run.cursor("c")
    with pytest.raises(RuntimeError, match="not available in a transactional task"):
        run.sleep(1)


# --- cursors -----------------------------------------------------------------------


def test_steps__a_cursor_keeps_the_last_saved_value_for_later_runs(job_factory):
    job = claim(job_factory())
    cur = run_of(job).cursor("rows")
    assert cur.value is None
    cur.save(10)
    cur.save({"after": 20})
    assert cur.value == {"after": 20}
    with pytest.raises(InvalidStep, match="cursor 'rows' not recorded"):
        cur.save({1, 2})
    later = run_of(again(job))
    assert later.cursor("rows").value == {"after": 20}
    assert later.cursor("rows") is later.cursor("rows")
    assert later.cursor("other").value is None
    with pytest.raises(InvalidStep, match="cursor name"):
        later.cursor("")
    stale = run_of(job)  # the first run's attempt, fenced out
    with pytest.raises(LeaseLost):
        stale.cursor("rows").save(99)
    assert stored(job) == [("cursor", "rows", {"after": 20}, 1)]


def test_steps__a_cursor_saved_in_a_transactional_step_rolls_back_with_it(job_factory):
    job = claim(job_factory())
    run = run_of(job)
    cur = run.cursor("pos")
    cur.save(1)

    def chunk() -> None:
        write_execution(job, "chunk")
        cur.save(2)
        raise RuntimeError("the chunk failed after its save")

    with pytest.raises(RuntimeError):
        run.run_step("chunk", chunk, transactional=True)
    assert stored(job) == [("cursor", "pos", 1, 1)]
    assert Execution.objects.filter(job_id=job.id).count() == 0


def test_steps__a_cursor_save_after_the_lease_was_taken_back_rolls_back(
    job_factory, other_connection
):
    job = claim(job_factory())
    cur = run_of(job).cursor("pos")
    rescuer = other_connection(autocommit=True)
    with pytest.raises(LeaseLost), transaction.atomic():
        write_execution(job, "chunk")
        rescuer.execute("UPDATE pgqueue_job SET lease_owner = 'w2' WHERE id = %s", [job.id])
        cur.save(2)
    assert stored(job) == []
    assert Execution.objects.filter(job_id=job.id).count() == 0


# --- durable sleep -----------------------------------------------------------------


def db_now() -> dt.datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def test_steps__sleep_records_its_end_and_snoozes_until_then(job_factory):
    job = claim(job_factory())
    run = run_of(job)
    before = db_now()
    with pytest.raises(Snooze) as snoozed:
        run.sleep(dt.timedelta(seconds=2))
    assert 1.9 < snoozed.value.seconds <= 2
    ((kind, name, value, attempt),) = stored(job)
    assert (kind, name, attempt) == ("sleep", "sleep 1", 1)
    end = dt.datetime.fromisoformat(value["until"])
    assert dt.timedelta(seconds=2) <= end - before < dt.timedelta(seconds=3)
    # Run again early (a requeue): it sleeps what is left; once past, it goes on.
    with pytest.raises(Snooze) as left:
        run_of(again(job)).sleep(2)
    assert 0 < left.value.seconds < 2
    JobStep.objects.filter(job_id=job.id).update(
        value={"until": (before - dt.timedelta(seconds=1)).isoformat()}
    )
    later = run_of(again(job))
    later.sleep(2)  # passed
    with pytest.raises(Snooze):
        later.sleep(0.5)  # the run's second sleep is a step of its own
    assert [s[1] for s in stored(job)] == ["sleep 1", "sleep 2"]


def test_steps__sleep_until_and_bad_sleeps(job_factory):
    job = claim(job_factory())
    run = run_of(job)
    for bad in (-1, float("nan"), "2", True):
        with pytest.raises(InvalidStep, match="finite number >= 0"):
            run.sleep(bad)
    with pytest.raises(InvalidStep, match="aware datetime"):
        run.sleep_until(dt.datetime(2030, 1, 1))  # noqa: DTZ001 - the point
    with pytest.raises(Snooze) as snoozed:
        run.sleep_until(db_now() + dt.timedelta(seconds=30))
    assert 29 < snoozed.value.seconds <= 30
    with pytest.raises(Snooze) as left:
        run_of(again(job)).sleep(0)  # the run's first sleep is the recorded one
    assert 28 < left.value.seconds <= 30
    other = claim(job_factory())
    with pytest.raises(LeaseLost, match="'sleep 1' not recorded"):
        run_of(other, worker_id="w9").sleep(1)


# --- seen, kept, removed -------------------------------------------------------------


def with_steps(job_factory: Any) -> Job:
    job = claim(job_factory())
    run = run_of(job)
    run.run_step("fetch", lambda: [1, 2, 3])
    run.cursor("rows").save(3)
    return job


def test_steps__status_json_and_the_admin_show_a_running_jobs_steps(job_factory, admin_client):
    job = with_steps(job_factory)
    out = StringIO()
    call_command("pgqueue_status", "--json", stdout=out)
    (running,) = json.loads(out.getvalue())["running"]
    assert (running["id"], running["steps"]) == (job.id, 2)
    assert (running["last_step"]["kind"], running["last_step"]["name"]) == ("cursor", "rows")
    [(name, size)] = [(s.name, s.size) for s in job.steps.filter(kind="step")]
    assert (name, size) == ("fetch", len("[1,2,3]"))
    page = admin_client.get(reverse("admin:django_pgqueue_job_change", args=[job.id]))
    text = page.content.decode()
    assert "Durable steps" in text
    assert re.search(r"<td>step</td><td>fetch</td><td>1</td><td>7</td>", text), text[:3000]
    other = claim(job_factory())
    call_command("pgqueue_status", "--json", stdout=(out := StringIO()))
    by_id = {r["id"]: r for r in json.loads(out.getvalue())["running"]}
    assert (by_id[other.id]["steps"], by_id[other.id]["last_step"]) == (0, None)


def test_steps__deleting_or_pruning_a_job_removes_its_steps(job_factory, settings):
    doomed = with_steps(job_factory)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM pgqueue_job WHERE id = %s", [doomed.id])
    assert not JobStep.objects.filter(job_id=doomed.id).exists()
    pruned = with_steps(job_factory)
    Job.objects.complete(pruned, "w1", result=None)
    settings.PGQUEUE_RETENTION_SECONDS = 0
    assert sweep(now=db_now() + dt.timedelta(seconds=1)).pruned == 1
    assert not JobStep.objects.filter(job_id=pruned.id).exists()


def dead(job: Job) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE pgqueue_job SET status = 'dead', lease_owner = NULL, "
            "finished_at = clock_timestamp() WHERE id = %s",
            [job.id],
        )


def test_steps__a_requeued_dead_letter_keeps_its_steps_unless_from_the_start(
    job_factory, admin_client
):
    other = with_steps(job_factory)  # not dead: the guarded requeue leaves it, and its steps
    job = with_steps(job_factory)
    dead(job)
    assert Job.objects.requeue_dead([job.id]) == [job.id]
    assert JobStep.objects.filter(job_id=job.id).count() == 2
    resumed = run_of(claim(job))
    assert resumed.run_step("fetch", lambda: pytest.fail("ran again")) == [1, 2, 3]
    dead(job)
    response = admin_client.post(
        reverse("admin:django_pgqueue_deadletter_changelist"),
        {"action": "requeue_from_start", "_selected_action": [str(job.id)], "index": "0"},
    )
    assert response.status_code == 302
    assert Job.objects.get(pk=job.pk).status == "pending"
    assert not JobStep.objects.filter(job_id=job.id).exists()
    assert Job.objects.requeue_dead([other.id], from_start=True) == []
    assert JobStep.objects.filter(job_id=other.id).count() == 2


def test_steps__a_chains_jobs_use_steps_like_any_task(tmp_path):
    """A chain's jobs run steps (recorded per job) and pass their results on."""
    ledger = str(tmp_path / "ledger")
    jobs = chain(
        step(tasks.doubled_in_a_step, 1, ledger), step(tasks.doubled_in_a_step, ledger=ledger)
    ).enqueue()
    run_jobs()
    assert [Job.objects.get(pk=j.pk).result for j in jobs] == [2, 4]
    assert [(s.job_id, s.name, s.value) for s in JobStep.objects.order_by("id")] == [
        (jobs[0].id, "double", 2),
        (jobs[1].id, "double", 4),
    ]
