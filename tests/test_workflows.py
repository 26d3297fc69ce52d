"""Workflows: chains, groups and depends_on, each dependant released once, by the
statement that finishes its last parent (``sql._RESOLVE``), and the late-dependant race
closed by the re-check after commit and the sweeper's repair."""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from django.db import DatabaseError, connection, transaction
from django.urls import reverse

import django_pgqueue
from django_pgqueue import lifecycle, sql, sweeper, workflows
from django_pgqueue.conf import settings
from django_pgqueue.exceptions import InvalidJob
from django_pgqueue.models import Job, JobDependency
from django_pgqueue.sql.resolve import CASCADE_DEPTH
from django_pgqueue.taskapi import task_backends
from testproject.demo.tasks import add
from tests.conftest import wait_for
from tests.tasks import double, echo, total

pytestmark = pytest.mark.django_db

step, chain, group = django_pgqueue.step, django_pgqueue.chain, django_pgqueue.group


def claim(n: int = 100, worker: str = "w1") -> list[Job]:
    return Job.objects.claim(worker, limit=n)


def finish(jobs: list[Job], result: Callable[[Job], Any], worker: str = "w1") -> list[bool]:
    """Complete ``jobs`` in one batched statement (the completer's path)."""
    return Job.objects.complete_many([(j, result(j)) for j in jobs], worker)


def fresh(job: Job | int) -> Job:
    return Job.objects.get(pk=job if isinstance(job, int) else job.pk)


def edges(job: Job) -> list[tuple[int, str | None, Any]]:
    return [
        (e.parent_id, e.state, e.result)
        for e in JobDependency.objects.filter(job_id=job.id).order_by("position")
    ]


def kill(job: Job, worker: str = "w1") -> str | None:
    """Fail a claimed job for good."""
    return Job.objects.fail(job, worker, RuntimeError("boom"), retry=False)


def invariant_holds() -> None:
    """Every job's parents_left is the number of its unresolved edges, and nothing
    waits on a parent that has finished without a missed-edge mark."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT j.id, j.parents_left, count(e.*) FILTER (WHERE e.state IS NULL)
            FROM pgqueue_job AS j
            LEFT JOIN pgqueue_job_dependency AS e ON e.job_id = j.id
            WHERE j.parents_left IS NOT NULL
            GROUP BY j.id, j.parents_left
            HAVING j.parents_left <> count(e.*) FILTER (WHERE e.state IS NULL)
            """
        )
        assert cursor.fetchall() == []
        cursor.execute(
            """
            SELECT e.job_id, e.parent_id
            FROM pgqueue_job_dependency AS e
            JOIN pgqueue_job AS p ON p.id = e.parent_id
            WHERE e.state IS NULL AND NOT e.repair
              AND p.status IN ('done', 'dead', 'cancelled')
            """
        )
        assert cursor.fetchall() == []


# --- building ------------------------------------------------------------------------


def test_chain__stores_the_first_step_pending_and_the_others_waiting():
    jobs = chain(step(add, 1, 2), step(double), double).enqueue()
    assert [j.status for j in jobs] == ["pending", "waiting", "waiting"]
    assert [j.parents_left for j in jobs] == [None, 1, 1]
    assert [j.parent_results for j in jobs] == [None, "value", "value"]
    assert {j.workflow_id for j in jobs} == {jobs[0].id}
    assert jobs[0].id < jobs[1].id < jobs[2].id
    assert edges(jobs[1]) == [(jobs[0].id, None, None)]
    assert edges(jobs[2]) == [(jobs[1].id, None, None)]
    stored = [fresh(j) for j in jobs]
    for made, read in zip(jobs, stored, strict=True):
        assert {f.attname: getattr(made, f.attname) for f in Job._meta.concrete_fields} == {
            f.attname: getattr(read, f.attname) for f in Job._meta.concrete_fields
        }


def test_group__stores_members_pending_and_the_callback_waiting_for_all():
    jobs = group(*[step(add, i, i) for i in range(4)], then=step(total, 100)).enqueue()
    members, callback = jobs[:-1], jobs[-1]
    assert [j.status for j in members] == ["pending"] * 4
    assert (callback.status, callback.parents_left, callback.parent_results) == (
        "waiting",
        4,
        "list",
    )
    assert [p for p, _, _ in edges(callback)] == [m.id for m in members]


def test_workflow__joins_the_callers_transaction():
    with transaction.atomic():
        chain(step(add, 1, 2), double).enqueue()
        group(step(add, 1, 2), then=total).enqueue()
        transaction.set_rollback(True)
    assert Job.objects.count() == 0
    assert JobDependency.objects.count() == 0


def test_workflow__a_bad_step_writes_nothing_and_names_the_step():
    with pytest.raises(InvalidJob, match=r"step #2: .*JSON"):
        chain(step(add, 1, 2), double, step(double, object())).enqueue()
    with pytest.raises(InvalidJob, match=r"group member #1 must be a step"):
        group(step(add, 1, 2), 5)  # type: ignore[arg-type]
    with pytest.raises(InvalidJob, match="at least one step"):
        chain().enqueue()
    with pytest.raises(InvalidJob, match="on_parent_failure must be one of"):
        chain(step(add, 1, 2), double, on_parent_failure="ignore").enqueue()
    assert Job.objects.count() == 0


@pytest.mark.django_db(databases=["default", "second"], transaction=True)
def test_workflow__steps_of_two_jobs_databases_are_refused():
    with pytest.raises(InvalidJob, match=r"step #1 goes to jobs database 'second'.*'default'"):
        chain(step(add, 1, 2), double.using(backend="second")).enqueue()
    assert Job.objects.count() == 0 and Job.objects.using("second").count() == 0


def test_group__of_more_jobs_than_a_copy_batch():
    n = 5001  # two batches of bulk.DEFAULT_BATCH_SIZE
    jobs = group(*[step(add, i, 1) for i in range(n)], then=total).enqueue()
    assert len(jobs) == n + 1
    assert Job.objects.filter(status="pending").count() == n
    callback = fresh(jobs[-1])
    assert callback.parents_left == n
    assert JobDependency.objects.filter(job_id=callback.id).count() == n


# --- release -------------------------------------------------------------------------


def test_chain__passes_each_result_to_the_next_step_through_both_completion_paths():
    jobs = chain(step(add, 1, 2), step(double), step(double)).enqueue()
    (first,) = claim()
    assert finish([first], lambda j: 3) == [True]  # batched: JOB_COMPLETE_MANY
    second = fresh(jobs[1])
    assert (second.status, second.args, second.parents_left) == ("pending", [3], 0)
    (claimed,) = claim()
    assert Job.objects.complete(claimed, "w1", result=6)  # transactional: JOB_COMPLETE
    third = fresh(jobs[2])
    assert (third.status, third.args) == ("pending", [6])
    assert edges(third) == [(jobs[1].id, "done", 6)]
    invariant_holds()


@pytest.mark.django_db(transaction=True)
def test_release__wakes_workers_of_the_released_jobs_queue_at_commit(other_connection):
    listener = other_connection(autocommit=True)
    listener.execute(f"LISTEN {settings.NOTIFY_CHANNEL}")
    jobs = chain(step(add, 1, 2), step(double.using(queue_name="later"))).enqueue()
    list(listener.notifies(timeout=0.5))  # the enqueue's own wake-up
    (first,) = claim()
    finish([first], lambda j: 3)
    assert fresh(jobs[1]).status == "pending"
    woken = [n.payload for n in listener.notifies(timeout=2, stop_after=1)]
    assert woken == ["release:later"]  # the listener makes the next claim start at the head


def test_release__a_late_completion_releases_nothing_twice():
    jobs = chain(step(add, 1, 2), double).enqueue()
    (first,) = claim()
    assert finish([first], lambda j: 3) == [True]
    # The same attempt written again (a zombie's batch): fenced out, nothing changes.
    assert finish([first], lambda j: 99) == [False]
    assert Job.objects.complete(first, "w1", result=99) is False
    second = fresh(jobs[1])
    assert (second.args, second.parents_left, second.status) == ([3], 0, "pending")


def test_group__callback_gets_the_results_in_member_order_once():
    jobs = group(*[step(add, i, 0) for i in range(6)], then=step(total, 1000)).enqueue()
    callback = jobs[-1]
    claimed = claim()
    # Completed out of order, in three batches and one transactional completion.
    order = [claimed[4], claimed[1]], [claimed[5], claimed[0]], [claimed[3]]
    for batch in order:
        finish(batch, lambda j: j.args[0] * 10)
        assert fresh(callback).status == "waiting"
    assert Job.objects.complete(claimed[2], "w1", result=20)
    released = fresh(callback)
    assert released.status == "pending"
    assert released.args == [[0, 10, 20, 30, 40, 50], 1000]
    assert released.parents_left == 0
    invariant_holds()


def test_group__an_empty_group_runs_its_callback_at_once_with_no_results(run_worker):
    """Issue 28 item 17: cb([], x), as for any group, not cb(x)."""
    (callback,) = group(*[], then=step(echo, 7, tag="album")).enqueue()
    assert (callback.status, callback.args) == ("pending", [[], 7])
    assert (fresh(callback).args, fresh(callback).parents_left) == ([[], 7], None)
    run_worker()
    assert fresh(callback).result == {"args": [[], 7], "kwargs": {"tag": "album"}}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("planted", [False, True], ids=["locking-read", "plain-read-planted"])
def test_group__the_last_two_members_completing_at_once_both_reach_the_callback(
    other_connection, monkeypatch, planted
):
    """Member A's completion is open (not committed) when member B's completes: B's
    statement waits for the callback's row, then sees it at 0 and releases it. A's
    result committed after B's snapshot: B reads it through a row lock. Planted: the
    plain read of the snapshot, which misses it."""
    if planted:
        for name in ("JOB_COMPLETE_MANY_RELEASING",):
            monkeypatch.setattr(
                sql.module_of(name), name, getattr(sql, name).replace("FOR SHARE", "")
            )
    jobs = group(step(add, 1, 0), step(add, 2, 0), then=total).enqueue()
    a, b = claim()
    params = {
        "worker_id": "w1",
        "channel": settings.NOTIFY_CHANNEL,
        "now": None,
    }

    def batch(job: Job, value: int) -> dict[str, Any]:
        return {
            **params,
            "ids": [job.id],
            "attempts": [job.attempts],
            "claimed_at": [job.last_attempted_at],
            "results": [str(value)],
        }

    assert a.has_dependants and b.has_dependants  # a workflow's: released in-statement
    first = other_connection()  # a transaction left open
    statement = sql.JOB_COMPLETE_MANY_RELEASING
    assert first.execute(statement, batch(a, 10)).fetchall() == [(1, "done")]
    second = other_connection(autocommit=True)
    done: list[Any] = []
    thread = threading.Thread(
        target=lambda: done.append(second.execute(statement, batch(b, 20)).fetchall())
    )
    thread.start()
    watcher = other_connection(autocommit=True)
    wait_for(
        lambda: watcher.execute(
            "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'",
            [second.info.backend_pid],
        ).fetchone()
    )
    first.commit()
    thread.join(10)
    assert done == [[(1, "done")]]
    callback = fresh(jobs[-1])
    assert callback.status == "pending"
    if planted:
        assert 10 not in callback.args[0]  # A's result lost: what the row lock prevents
    else:
        assert callback.args == [[10, 20]]


# --- failure -------------------------------------------------------------------------


def test_failure__a_dead_step_cancels_the_rest_of_its_chain_naming_it():
    jobs = chain(step(add, 1, 2), double, double, double).enqueue()
    (first,) = claim()
    assert kill(first) == "dead"
    rest = [fresh(j) for j in jobs[1:]]
    assert [j.status for j in rest] == ["cancelled"] * 3
    assert rest[0].errors[-1]["exception_class_path"] == "django_pgqueue.exceptions.JobCancelled"
    assert f"parent job {jobs[0].id} ended dead" in rest[0].errors[-1]["traceback"]
    assert f"parent job {jobs[1].id} ended cancelled" in rest[1].errors[-1]["traceback"]
    assert all(j.finished_at is not None and j.cancel_requested_at is None for j in rest)
    assert claim() == []
    invariant_holds()


def test_failure__a_dead_member_cancels_the_callback_at_once():
    jobs = group(step(add, 1, 0), step(add, 2, 0), step(add, 3, 0), then=total).enqueue()
    a, b, c = claim()
    finish([a], lambda j: 1)
    kill(b)
    callback = fresh(jobs[-1])
    assert callback.status == "cancelled" and callback.parents_left == 1
    finish([c], lambda j: 3)  # the last member still resolves its edge
    assert fresh(jobs[-1]).status == "cancelled"
    assert edges(jobs[-1]) == [(a.id, "done", 1), (b.id, "dead", None), (c.id, "done", 3)]
    invariant_holds()


def test_failure__on_parent_failure_run_releases_the_callback_with_none_for_the_dead():
    jobs = group(
        step(add, 1, 0), step(add, 2, 0), then=step(total), on_parent_failure="run"
    ).enqueue()
    a, b = claim()
    kill(a)
    assert fresh(jobs[-1]).status == "waiting"
    finish([b], lambda j: 2)
    callback = fresh(jobs[-1])
    assert (callback.status, callback.args) == ("pending", [[None, 2]])
    outcomes = lifecycle.parents("default", callback.id)
    assert [(o.id, o.status, o.result) for o in outcomes] == [
        (a.id, "dead", None),
        (b.id, "done", 2),
    ]
    assert outcomes[0].error["exception_class_path"] == "builtins.RuntimeError"
    assert outcomes[1].error is None


def test_failure__a_chain_with_run_passes_none_after_a_dead_step():
    jobs = chain(step(add, 1, 2), double, on_parent_failure="run").enqueue()
    (first,) = claim()
    kill(first)
    assert (fresh(jobs[1]).status, fresh(jobs[1]).args) == ("pending", [None])


@pytest.mark.parametrize("how", ["expired", "cancel-requested", "snoozed", "released"])
def test_failure__every_other_way_a_parent_ends_reaches_its_dependants(how, now):
    jobs = chain(step(add, 1, 2), double).enqueue()
    (first,) = claim()
    if how == "expired":
        Job.objects.filter(pk=first.pk).update(max_attempts=1)
        sweeper.rescue_expired("default", now=now + dt.timedelta(days=1))
        expected = "dead"
    else:
        Job.objects.cancel([first.id])
        if how == "cancel-requested":
            assert Job.objects.complete_status(first, "w1", result=3) == "cancelled"
        elif how == "released":
            assert Job.objects.release(first, "w1")
        else:
            params = {
                "id": first.id,
                "worker_id": "w1",
                "attempt": first.attempts,
                "claimed_at": first.last_attempted_at,
                "seconds": 5.0,
                "channel": settings.NOTIFY_CHANNEL,
                "now": None,
            }
            with connection.cursor() as cursor:
                cursor.execute(sql.JOB_SNOOZE, params)
        expected = "cancelled"
    assert fresh(first).status == expected
    dependant = fresh(jobs[1])
    assert dependant.status == "cancelled"
    assert f"parent job {first.id} ended {expected}" in dependant.errors[-1]["traceback"]


def test_cancel__a_waiting_job_is_cancelled_with_what_waits_on_it():
    jobs = chain(step(add, 1, 2), double, double).enqueue()
    result = Job.objects.cancel([jobs[1].id])
    assert result.cancelled == [jobs[1].id]
    assert [fresh(j).status for j in jobs] == ["pending", "cancelled", "cancelled"]
    assert fresh(jobs[1]).cancel_requested_at is not None  # asked for: never restored
    (first,) = claim()
    finish([first], lambda j: 3)  # its edge resolves; nothing is released
    assert fresh(jobs[1]).status == "cancelled"
    invariant_holds()


def test_cancel__a_pending_parent_cancels_its_dependants():
    jobs = group(step(add, 1, 0), step(add, 2, 0), then=total).enqueue()
    Job.objects.cancel([jobs[0].id])
    assert fresh(jobs[-1]).status == "cancelled"
    assert "ended cancelled" in fresh(jobs[-1]).errors[-1]["traceback"]


def test_cascade__deeper_than_one_statement_goes_is_finished_by_the_sweeper():
    length = CASCADE_DEPTH + 20
    jobs = chain(step(add, 1, 2), *[double] * length).enqueue()
    (first,) = claim()
    kill(first)
    statuses = [fresh(j).status for j in jobs[1:]]
    assert statuses[:CASCADE_DEPTH] == ["cancelled"] * CASCADE_DEPTH
    assert set(statuses[CASCADE_DEPTH:]) == {"waiting"}
    result = sweeper.sweep()
    assert result.repaired >= 1
    assert {fresh(j).status for j in jobs[1:]} == {"cancelled"}
    invariant_holds()


# --- requeue ---------------------------------------------------------------------------


def test_requeue__a_dead_parent_makes_what_its_death_cancelled_wait_again():
    jobs = chain(step(add, 1, 2), double, double).enqueue()
    (first,) = claim()
    kill(first)
    assert Job.objects.requeue_dead([first.id]) == [first.id]
    assert [fresh(j).status for j in jobs] == ["pending", "waiting", "waiting"]
    assert [fresh(j).parents_left for j in jobs[1:]] == [1, 1]
    assert [fresh(j).finished_at for j in jobs[1:]] == [None, None]
    invariant_holds()
    (again,) = claim()
    finish([again], lambda j: 3)
    (second,) = claim()
    assert second.args == [3]


def test_requeue__a_dependant_stays_cancelled_while_another_parent_is_dead():
    a = Job.objects.enqueue(add, [1, 0])
    b = Job.objects.enqueue(add, [2, 0])
    d = Job.objects.enqueue(total, depends_on=[a, b])
    ja, jb = claim()
    kill(ja)
    kill(jb)
    assert fresh(d).status == "cancelled"
    Job.objects.requeue_dead([a.id])
    assert fresh(d).status == "cancelled"
    Job.objects.requeue_dead([b.id])
    assert fresh(d).status == "waiting" and fresh(d).parents_left == 2
    invariant_holds()


def test_requeue__a_dependant_cancelled_by_someone_stays_cancelled():
    jobs = chain(step(add, 1, 2), double).enqueue()
    Job.objects.cancel([jobs[1].id])
    (first,) = claim()
    kill(first)
    Job.objects.requeue_dead([first.id])
    assert fresh(jobs[1]).status == "cancelled"


# --- depends_on ------------------------------------------------------------------------


def test_depends_on__a_job_with_two_parents_waits_for_both():
    a = Job.objects.enqueue(add, [1, 0])
    b = Job.objects.enqueue(add, [2, 0])
    d = Job.objects.enqueue(add, [5, 5], depends_on=[a, b.id])
    assert (d.status, d.parents_left, d.parent_results) == ("waiting", 2, None)
    ja, jb = claim()
    finish([ja], lambda j: 1)
    assert fresh(d).status == "waiting"
    assert Job.objects.complete(jb, "w1", result=2)
    released = fresh(d)
    assert (released.status, released.args) == ("pending", [5, 5])  # no results passed


def test_depends_on__finished_parents_decide_at_enqueue():
    a = Job.objects.enqueue(add, [1, 0])
    (ja,) = claim()
    finish([ja], lambda j: 1)
    b = Job.objects.enqueue(add, [2, 0])
    (jb,) = claim()
    kill(jb)
    assert Job.objects.enqueue(add, [1, 1], depends_on=[a]).status == "pending"
    cancelled = Job.objects.enqueue(add, [1, 1], depends_on=[a, b])
    assert cancelled.status == "cancelled"
    assert (
        f"parent job {b.id} ended dead before this job was enqueued"
        in (cancelled.errors[-1]["traceback"])
    )
    ran = Job.objects.enqueue(add, [1, 1], depends_on=[a, b], on_parent_failure="run")
    assert ran.status == "pending"
    assert edges(ran) == [(a.id, "done", 1), (b.id, "dead", None)]
    scheduled = Job.objects.enqueue(
        add, [1, 1], depends_on=[a], run_at=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    )
    assert scheduled.status == "scheduled"


def test_depends_on__a_scheduled_dependant_is_released_to_scheduled():
    a = Job.objects.enqueue(add, [1, 0])
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    d = Job.objects.enqueue(add, [1, 1], depends_on=[a], run_at=later)
    (ja,) = claim()
    finish([ja], lambda j: 1)
    assert fresh(d).status == "scheduled"


@pytest.mark.parametrize(
    ("depends_on", "message"),
    [
        ([10**12], r"no job 1000000000000 in jobs database 'default'"),
        ("12", "must be a collection"),
        ([1.5], "must hold jobs or int job ids"),
        ([True], "must hold jobs or int job ids"),
    ],
)
def test_depends_on__bad_parents_are_refused_before_anything_is_written(depends_on, message):
    with pytest.raises(InvalidJob, match=message):
        Job.objects.enqueue(add, [1, 1], depends_on=depends_on)
    assert Job.objects.count() == 0


def test_depends_on__refuses_duplicates_options_and_self_reference():
    a = Job.objects.enqueue(add, [1, 0], idempotency_key="k")
    with pytest.raises(InvalidJob, match=f"names job {a.id} twice"):
        Job.objects.enqueue(add, [1, 1], depends_on=[a, a.id])
    with pytest.raises(InvalidJob, match="cannot be combined with unique_for"):
        Job.objects.enqueue(add, [1, 1], depends_on=[a], idempotency_key="u", unique_for=5)
    with pytest.raises(InvalidJob, match="on_parent_failure needs depends_on"):
        Job.objects.enqueue(add, [1, 1], on_parent_failure="run")
    with pytest.raises(InvalidJob, match=f"held by job {a.id}, which is in depends_on"):
        Job.objects.enqueue(add, [1, 1], depends_on=[a], idempotency_key="k")
    # Issue 28 item 18: no raw DataError (bigint out of range) for an impossible id.
    for bad in (2**63, -(2**63) - 1, 0):
        with pytest.raises(InvalidJob, match=f"depends_on: {bad} is no job id"):
            Job.objects.enqueue(add, [1, 1], depends_on=[bad])
    assert Job.objects.count() == 1 and JobDependency.objects.count() == 0


def test_depends_on__an_idempotency_key_held_by_a_waiting_job_returns_it():
    a = Job.objects.enqueue(add, [1, 0])
    d = Job.objects.enqueue(add, [1, 1], depends_on=[a], idempotency_key="once")
    assert Job.objects.enqueue(add, [2, 2], depends_on=[a], idempotency_key="once").id == d.id
    assert Job.objects.enqueue(add, [2, 2], idempotency_key="once").id == d.id


@pytest.mark.django_db(databases=["default", "second"], transaction=True)
def test_depends_on__a_job_of_another_jobs_database_is_refused_naming_both():
    other = Job.objects.db_manager("second").enqueue(add, [1, 1], backend="second")
    with pytest.raises(InvalidJob, match=r"job \d+ is in jobs database 'second'.*'default'"):
        Job.objects.enqueue(add, [1, 1], depends_on=[other])
    assert Job.objects.count() == 0
    assert task_backends["second"].database == "second"


# --- the late dependant ------------------------------------------------------------------


def complete_elsewhere(conn: psycopg.Connection, *jobs: Job) -> list[tuple[Any, ...]]:
    """The batched completion of ``jobs`` on another connection (its own snapshot), as
    a worker writes it for jobs created without dependants (the plain statement; no
    follow-up: what it would resolve right after is left to the re-check and sweeper)."""
    rows = conn.execute(
        sql.JOB_COMPLETE_MANY,
        {
            "worker_id": "w1",
            "ids": [j.id for j in jobs],
            "attempts": [j.attempts for j in jobs],
            "claimed_at": [j.last_attempted_at for j in jobs],
            "results": [str(10 * j.args[0]) for j in jobs],
            "channel": settings.NOTIFY_CHANNEL,
            "now": None,
        },
    ).fetchall()
    return [row[:2] for row in rows]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("plant", ["none", "no-recheck", "no-recheck-no-repair"])
def test_late_dependant__its_parent_completing_while_the_enqueue_is_open(
    other_connection, monkeypatch, plant
):
    """The dependant's enqueue counted its running parent as unfinished; the parent's
    completion commits before the enqueue does, on a snapshot without the new edge. The
    re-check after commit releases it; without it the sweeper's repair does; without
    both it would wait for ever (the plants show the test would catch it)."""
    if plant != "none":
        monkeypatch.setattr(workflows, "resolve_late", lambda *a, **k: 0)
    if plant == "no-recheck-no-repair":
        monkeypatch.setattr(workflows, "resolve_missed", lambda *a, **k: 0)
    parent = Job.objects.enqueue(add, [1, 2])
    (running,) = claim()
    completer = other_connection(autocommit=True)
    with transaction.atomic():
        dependant = Job.objects.enqueue(double, depends_on=[parent])
        assert dependant.status == "waiting"
        assert complete_elsewhere(completer, running) == [(1, "done")]
    assert fresh(parent).status == "done"
    if plant == "none":
        assert fresh(dependant).status == "pending"
    else:
        assert fresh(dependant).status == "waiting"
        sweeper.sweep()
        expected = "pending" if plant == "no-recheck" else "waiting"
        assert fresh(dependant).status == expected
    if fresh(dependant).status == "pending":
        assert edges(dependant) == [(parent.id, "done", 10)]
        invariant_holds()


@pytest.mark.django_db(transaction=True)
def test_late_dependant__a_completion_in_progress_is_waited_for_by_the_recheck(
    other_connection,
):
    """The parent's completion took its snapshot before the enqueue committed and is
    blocked on a lock: the re-check waits for it (FOR SHARE), then sees it done."""
    parent = Job.objects.enqueue(add, [1, 2])
    (running,) = claim()
    blocker = other_connection()
    blocker.execute("SELECT 1 FROM pgqueue_job WHERE id = %s FOR NO KEY UPDATE", [running.id])
    completer = other_connection(autocommit=True)
    thread = threading.Thread(target=complete_elsewhere, args=(completer, running))
    thread.start()
    watcher = other_connection(autocommit=True)
    blocked = "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'"
    wait_for(lambda: watcher.execute(blocked, [completer.info.backend_pid]).fetchone())
    made: list[Any] = []

    def enqueue() -> None:
        try:
            connection.ensure_connection()
            made.append(connection.connection.info.backend_pid)
            made.append(Job.objects.enqueue(double, depends_on=[parent]))  # + re-check
        finally:
            connection.close()

    enqueuer = threading.Thread(target=enqueue)
    enqueuer.start()
    wait_for(lambda: made)
    # Committed, and its re-check (JOB_RESOLVE_LATE) waits for the parent's row.
    rechecking = blocked + " AND query LIKE '%%AND e.repair%%'"
    wait_for(lambda: watcher.execute(rechecking, [made[0]]).fetchone())
    blocker.commit()
    enqueuer.join(10)
    thread.join(10)
    dependant = made[1]
    assert fresh(dependant).status == "pending"
    assert edges(dependant) == [(parent.id, "done", 10)]


@pytest.mark.django_db(transaction=True)
def test_late_dependant__a_completion_writing_after_the_recheck_is_the_sweepers(
    other_connection,
):
    """The completion took its snapshot before the enqueue committed, but reaches the
    parent's row only after the re-check read it (running): the sweeper resolves it."""
    first = Job.objects.enqueue(add, [1, 2])
    parent = Job.objects.enqueue(add, [2, 2])
    a, p = claim()
    blocker = other_connection()
    blocker.execute("SELECT 1 FROM pgqueue_job WHERE id = %s FOR NO KEY UPDATE", [a.id])
    completer = other_connection(autocommit=True)
    thread = threading.Thread(target=complete_elsewhere, args=(completer, a, p))
    thread.start()
    watcher = other_connection(autocommit=True)
    blocked = "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'"
    wait_for(lambda: watcher.execute(blocked, [completer.info.backend_pid]).fetchone())
    dependant = Job.objects.enqueue(double, depends_on=[parent])
    assert fresh(dependant).status == "waiting"  # the re-check saw the parent running
    blocker.commit()
    thread.join(10)
    assert fresh(parent).status == "done" and fresh(first).status == "done"
    assert fresh(dependant).status == "waiting"  # missed by the completion
    assert sweeper.sweep().repaired == 1
    assert fresh(dependant).status == "pending"
    assert edges(dependant) == [(parent.id, "done", 20)]
    invariant_holds()


def finished_by_an_old_worker(job: Job, status: str, result: Any = None) -> None:
    """What a worker of a release before workflows wrote to finish a job: its row only,
    nothing about the jobs waiting on it."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE pgqueue_job SET status = %s, result = %s, finished_at = clock_timestamp(),"
            " lease_owner = NULL, lease_expires_at = NULL WHERE id = %s",
            [status, None if result is None else json.dumps(result), job.id],
        )


def test_rolling_upgrade__the_sweeper_releases_what_an_old_worker_finished(monkeypatch):
    """Issue 28 item 14: during a rolling upgrade a worker of the previous release
    finishes chain and group parents without resolving their edges (not marked for
    repair: created with their parents). The sweeper releases a waiting job whose
    parents all finished, whoever finished them: a chain's next step gets its result, a
    group's callback every member's, a failed parent's dependant is cancelled."""
    monkeypatch.setattr(workflows, "_stranded_at", {})
    steps = chain(step(add, 1, 2), double).enqueue()
    album = group(step(add, 1, 1), step(add, 2, 2), then=step(total)).enqueue()
    doomed = chain(step(add, 0, 0), double).enqueue()
    first, one, two, failing = claim()
    finished_by_an_old_worker(first, "done", 3)
    finished_by_an_old_worker(one, "done", 2)
    assert finish([two], lambda j: 4) == [True]  # a new worker finishes the other member
    finished_by_an_old_worker(failing, "dead")
    assert [fresh(j).status for j in (steps[1], album[2], doomed[1])] == ["waiting"] * 3
    # Retention keeps a parent whose edge is unresolved: the repair reads its row.
    sweeper.prune_finished("default", now=dt.datetime.now(dt.UTC) + dt.timedelta(days=30))
    assert Job.objects.filter(pk__in=[first.id, one.id]).count() == 2
    assert sweeper.sweep().repaired == 3
    assert (fresh(steps[1]).status, fresh(steps[1]).args) == ("pending", [3])
    assert (fresh(album[2]).status, fresh(album[2]).args) == ("pending", [[2, 4]])
    assert fresh(doomed[1]).status == "cancelled"
    assert "ended dead" in fresh(doomed[1]).errors[-1]["traceback"]
    invariant_holds()
    # Live workflows are left alone: an unfinished parent's edge stays unresolved.
    pending = chain(step(add, 5, 5), double).enqueue()
    assert workflows.resolve_stranded("default", max_batches=1) == 0
    assert fresh(pending[1]).status == "waiting"


# --- retention and the rest ------------------------------------------------------------


#: The advisory lock a planted BEFORE DELETE trigger waits on (the test holds it).
GATE = 28_012


@pytest.fixture
def gated_delete(other_connection):
    """Plant a BEFORE DELETE trigger on pgqueue_job that, for the job ids it is given,
    waits for an advisory lock the test holds: a DELETE statement stops there, its
    snapshot taken, until the test opens the gate. Dropped at teardown."""
    gate = other_connection(autocommit=True)
    gate.execute("SELECT pg_advisory_lock(%s)", [GATE])

    def plant(*ids: int) -> Callable[[], None]:
        with connection.cursor() as cursor:
            cursor.execute(
                f"""CREATE FUNCTION pgqueue_test_gate() RETURNS trigger LANGUAGE plpgsql AS $$
                    BEGIN
                        IF OLD.id = ANY('{{{",".join(map(str, ids))}}}'::bigint[]) THEN
                            PERFORM pg_advisory_lock({GATE});
                            PERFORM pg_advisory_unlock({GATE});
                        END IF;
                        RETURN OLD;
                    END $$"""
            )
            cursor.execute(
                "CREATE TRIGGER pgqueue_test_gate BEFORE DELETE ON pgqueue_job"
                " FOR EACH ROW EXECUTE FUNCTION pgqueue_test_gate()"
            )
        return lambda: gate.execute("SELECT pg_advisory_unlock(%s)", [GATE])

    yield plant
    with connection.cursor() as cursor:
        cursor.execute("DROP TRIGGER IF EXISTS pgqueue_test_gate ON pgqueue_job")
        cursor.execute("DROP FUNCTION IF EXISTS pgqueue_test_gate()")


@pytest.mark.django_db(transaction=True)
def test_prune__a_parent_done_while_its_dependants_enqueue_is_open_is_not_lost(
    other_connection, monkeypatch, gated_delete
):
    """Issue 28 item 12. The parent completes while the dependant's enqueue is open; the
    retention delete takes its snapshot before the enqueue commits (it sees no edge) and
    reaches the parent's row after (a planted trigger holds it on an older job's delete
    in between), and the enqueuer died right after its commit (no re-check). The parent
    must not be deleted with its edge unresolved: the dependant runs, never cancelled."""
    monkeypatch.setattr(workflows, "resolve_late", lambda *a, **k: 0)
    older = Job.objects.enqueue(add, [1, 1])
    parent = Job.objects.enqueue(add, [1, 2])
    a, p = claim()
    assert finish([a], lambda j: 2) == [True]  # finished first: deleted first
    open_gate = gated_delete(older.id)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=30)
    watcher = other_connection(autocommit=True)
    pids: list[int] = []

    def prune() -> None:
        try:
            connection.ensure_connection()
            pids.append(connection.connection.info.backend_pid)
            sweeper.prune_finished("default", now=later)
        finally:
            connection.close()

    pruning = threading.Thread(target=prune)
    with transaction.atomic():
        dependant = Job.objects.enqueue(double, depends_on=[parent])
        assert dependant.status == "waiting"
        assert complete_elsewhere(other_connection(autocommit=True), p) == [(1, "done")]
        pruning.start()
        at_gate = "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event = 'advisory'"
        wait_for(lambda: pids and watcher.execute(at_gate, [pids[0]]).fetchone())
    open_gate()  # the enqueue committed while the delete was under way
    pruning.join(20)
    assert not pruning.is_alive()
    sweeper.sweep()
    assert fresh(dependant).status == "pending"
    assert edges(dependant) == [(parent.id, "done", 10)]
    invariant_holds()


def test_prune__deletes_a_pruned_dependants_edges_and_keeps_a_parent_with_a_missed_edge(now):
    jobs = chain(step(add, 1, 2), double).enqueue()
    (first,) = claim()
    finish([first], lambda j: 3)
    (second,) = claim()
    finish([second], lambda j: 6)
    # A missed edge (as the race leaves it) on a done parent: the parent is kept.
    lone = Job.objects.enqueue(add, [1, 1])
    (jl,) = claim()
    finish([jl], lambda j: 2)
    waiting = Job.objects.enqueue(double, depends_on=[lone])  # released at once: done
    JobDependency.objects.filter(job_id=waiting.id).update(state=None, repair=True)
    Job.objects.filter(pk=waiting.pk).update(status="waiting", parents_left=1)
    later = now + dt.timedelta(days=30)
    Job.objects.update(finished_at=now)
    sweeper.prune_finished("default", now=later)
    assert set(Job.objects.values_list("id", flat=True)) == {lone.id, waiting.id}
    assert JobDependency.objects.filter(job_id__in=[j.id for j in jobs]).count() == 0
    assert sweeper.sweep().repaired == 1  # resolved from the kept parent's row
    assert fresh(waiting).status == "pending"


def test_discard__a_dead_dependant_takes_its_edges_with_it():
    jobs = chain(step(add, 1, 2), double).enqueue()
    (first,) = claim()
    finish([first], lambda j: 3)
    (second,) = claim()
    kill(second)
    assert Job.objects.discard_dead([second.id]) == [second.id]
    assert JobDependency.objects.filter(job_id=jobs[1].id).count() == 0


def test_task_result__a_waiting_job_reads_as_ready():
    jobs = chain(step(add, 1, 2), double).enqueue()
    result = double.get_result(str(jobs[1].id))
    assert result.status.name == "READY"


def test_claim__never_takes_a_waiting_job():
    chain(step(add, 1, 2), double, double).enqueue()
    assert len(claim()) == 1
    assert claim() == []


def test_admin__a_jobs_page_links_its_parents_dependants_and_workflow(admin_client):
    jobs = group(step(add, 1, 0), step(add, 2, 0), then=step(total)).enqueue()
    after = Job.objects.enqueue(double, depends_on=[jobs[-1]])
    a, _ = claim()
    finish([a], lambda j: 1)
    page = admin_client.get(reverse("admin:django_pgqueue_job_change", args=[jobs[-1].id]))
    text = page.content.decode()
    for member in jobs[:2]:
        link = reverse("admin:django_pgqueue_job_change", args=[member.id])
        assert f'href="{link}?backend=default">#{member.id}</a>' in text
    assert "1 of 2 not finished, given their results" in text
    dependant = reverse("admin:django_pgqueue_job_change", args=[after.id])
    assert f'href="{dependant}?backend=default">#{after.id}</a>' in text
    assert f"workflow {jobs[0].id}</a>: 1 of 4 done (1 running, 2 waiting)" in text
    listed = admin_client.get(
        reverse("admin:django_pgqueue_job_changelist") + f"?workflow_id={jobs[0].id}"
    )
    assert listed.status_code == 200
    assert listed.content.decode().count('class="action-select"') == 4


def test_chaos_judge__catches_each_planted_violation():
    """bench.workflows' verdict against states it must reject: a callback run twice,
    given the wrong results, one left waiting, a counter that disagrees with its edges."""
    import bench.workflows as workflows_bench
    from testproject.demo.models import Execution

    jobs = group(*[step(add, n, 0) for n in range(3)], then=step(total)).enqueue()
    callback = jobs[-1]
    finish(claim(), lambda j: j.args[0])
    (cb,) = claim()
    Job.objects.complete(cb, "w1", result=3)
    Execution.objects.create(job_id=callback.id, attempt=1, kind="tx", worker_id="w1")

    def verdict() -> dict[str, int]:
        found = workflows_bench.judge([callback.id], 3, kills=0, unclean=0)
        return {k: v for k, v in found.items() if k in workflows_bench.MUST_BE_ZERO and v}

    assert verdict() == {}
    Execution.objects.create(job_id=callback.id, attempt=2, kind="tx", worker_id="w2")
    assert verdict() == {"callbacks_run_twice": 1}
    Execution.objects.filter(attempt=2).delete()
    Job.objects.filter(pk=callback.id).update(args=[[0, 1, 5]])
    assert verdict() == {"wrong_results": 1}
    Job.objects.filter(pk=callback.id).update(args=[[0, 1, 2]])
    lone = Job.objects.enqueue(double, depends_on=[Job.objects.enqueue(add, [1, 1])])
    assert verdict() == {"left_waiting": 1, "left_unfinished": 2, "members_not_done": 2}
    Job.objects.filter(pk=lone.id).update(parents_left=0)
    assert verdict()["bad_counters"] == 1


def test_failure__a_cancel_requested_parent_whose_lease_expires_cancels_its_dependant(now):
    jobs = chain(step(add, 1, 2), double).enqueue()
    (first,) = claim()
    Job.objects.cancel([first.id])
    sweeper.rescue_expired("default", now=now + dt.timedelta(days=1))
    assert fresh(first).status == "cancelled"
    assert "ended cancelled" in fresh(jobs[1]).errors[-1]["traceback"]
    assert fresh(jobs[1]).status == "cancelled"


def test_discard__a_dead_letter_resolves_an_edge_its_death_missed():
    parent = Job.objects.enqueue(add, [1, 0])
    (running,) = claim()
    dependant = Job.objects.enqueue(double, depends_on=[parent])
    # The race's outcome: the parent died on a snapshot without the new edge.
    JobDependency.objects.filter(job_id=dependant.id).update(state=None, repair=True)
    Job.objects.filter(pk=parent.id).update(
        status="dead", lease_expires_at=None, finished_at=dt.datetime.now(dt.UTC)
    )
    assert fresh(dependant).status == "waiting"
    assert Job.objects.discard_dead([parent.id]) == [parent.id]
    assert fresh(dependant).status == "cancelled"
    assert edges(dependant) == [(parent.id, "dead", None)]


def test_depends_on__rolled_back_with_the_callers_transaction():
    parent = Job.objects.enqueue(add, [1, 0])
    with transaction.atomic():
        Job.objects.enqueue(double, depends_on=[parent])
        transaction.set_rollback(True)
    assert Job.objects.count() == 1 and JobDependency.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_claim__waiting_jobs_cost_the_claim_nothing():
    """5,000 waiting jobs: the claim still reads the head of its index, a few pages."""
    parent = Job.objects.enqueue(add, [1, 0])
    with connection.cursor() as cursor:
        cursor.execute(
            """INSERT INTO pgqueue_job (backend, queue, task, args, kwargs, priority, status,
                   attempts, max_attempts, run_at, errors, created_at, parents_left)
               SELECT 'default', 'default', 'tests.tasks.double', '[]', '{}', 0, 'waiting',
                      0, 3, clock_timestamp(), '[]', clock_timestamp(), 1
               FROM generate_series(1, 5000)"""
        )
        cursor.execute("ANALYZE pgqueue_job")
        cursor.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql.JOB_CLAIM,
            {"worker_id": "w1", "limit": 10, "lease_seconds": 60, "now": None},
        )
        plan = json.dumps(cursor.fetchone()[0])
    assert '"Index Name": "pgqueue_job_claim_idx"' in plan
    (entry,) = json.loads(plan)
    assert entry["Plan"]["Actual Rows"] == 1  # the one pending job
    assert entry["Plan"]["Shared Hit Blocks"] + entry["Plan"]["Shared Read Blocks"] < 50
    assert fresh(parent).status == "running"


def test_release__a_workflows_parent_releases_in_its_one_completion_statement(
    django_assert_num_queries,
):
    jobs = chain(step(add, 1, 2), double).enqueue()
    (first,) = claim()
    assert first.has_dependants
    with django_assert_num_queries(1):
        assert finish([first], lambda j: 3) == [True]
    assert fresh(jobs[1]).status == "pending"


@pytest.mark.parametrize("path", ["batched", "one"])
def test_release__a_dependant_enqueued_later_is_released_right_after_the_completion(
    path, django_assert_num_queries
):
    parent = Job.objects.enqueue(add, [1, 2])
    dependant = Job.objects.enqueue(double, depends_on=[parent])  # committed: not racing
    (claimed,) = claim()
    assert not claimed.has_dependants  # created without: the plain completion finds it
    with django_assert_num_queries(2):  # the completion, then the release
        if path == "batched":
            assert finish([claimed], lambda j: 3) == [True]
        else:
            assert Job.objects.complete(claimed, "w1", result=3)
    assert fresh(dependant).status == "pending"
    assert edges(dependant) == [(parent.id, "done", 3)]


@pytest.mark.django_db(transaction=True)
def test_release__if_the_release_after_a_completion_fails_the_sweeper_does_it(monkeypatch):
    def broken(*args: Any, **kwargs: Any) -> int:
        raise DatabaseError("connection lost")

    monkeypatch.setattr(workflows, "resolve_parents", broken)
    parent = Job.objects.enqueue(add, [1, 2])
    dependant = Job.objects.enqueue(double, depends_on=[parent])
    (claimed,) = claim()
    assert finish([claimed], lambda j: 3) == [True]  # the completion stands
    assert fresh(dependant).status == "waiting"
    assert sweeper.sweep().repaired == 1
    assert fresh(dependant).status == "pending"


def test_admin__the_workflow_section_shows_only_for_a_job_that_has_one(admin_client):
    plain = Job.objects.enqueue(add, [1, 1])
    parent = Job.objects.enqueue(add, [2, 2])
    Job.objects.enqueue(double, depends_on=[parent])  # a dependant it got later
    page = lambda job: admin_client.get(  # noqa: E731
        reverse("admin:django_pgqueue_job_change", args=[job.id])
    ).content.decode()
    assert ">Workflow</h2>" not in page(plain)
    assert ">Workflow</h2>" in page(parent)


@pytest.mark.django_db(transaction=True)
def test_monitoring__waiting_jobs_are_counted_by_status_and_metrics(client, settings):
    """pgqueue_status (table and --json) and the Prometheus gauge count waiting jobs."""
    from io import StringIO

    from django.core.management import call_command
    from prometheus_client.parser import text_string_to_metric_families

    chain(step(add.using(queue_name="flow"), 1, 2), double.using(queue_name="flow")).enqueue()
    group(step(add, 1, 1), then=step(total.using(queue_name="flow"))).enqueue()
    out = StringIO()
    call_command("pgqueue_status", "--json", stdout=out)
    assert json.loads(out.getvalue())["queues"]["flow"]["waiting"] == 2
    out = StringIO()
    call_command("pgqueue_status", stdout=out)
    header, *lines = out.getvalue().splitlines()
    column = header.split().index("waiting")
    flow = next(line for line in lines if line.startswith("flow"))
    assert flow.split()[column] == "2"
    settings.PGQUEUE_METRICS_TOKEN = "t"
    text = client.get("/metrics/pgqueue", HTTP_AUTHORIZATION="Bearer t").content.decode()
    gauges = {
        (s.name, s.labels.get("queue")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert gauges[("pgqueue_jobs_waiting", "flow")] == 2


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("planted", [False, True], ids=["release-notify", "planted-ignored"])
def test_worker__a_released_job_behind_the_claim_position_is_claimed_at_once(
    settings, monkeypatch, planted
):
    """Three chains: their first steps are claimed together (the worker's position then
    lies past the second steps of the first two chains, which keep their older ids).
    The release's NOTIFY makes the next claim start at the head, so the chains finish
    well within the rescan interval (60 s here). Planted: the listener takes it for a
    plain wake-up, and the released steps wait behind the position."""
    from django_pgqueue.worker import Worker, listener

    settings.PGQUEUE_CLAIM_RESCAN_SECONDS = 60.0
    if planted:
        monkeypatch.setattr(listener, "RELEASE_NOTIFY_PREFIX", "ignored:")
    with transaction.atomic():
        chains = [chain(step(add, n, 0), double, double).enqueue() for n in range(3)]
    worker = Worker(concurrency=3, batch_size=3, poll_interval=0.1)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        last = [c[-1].id for c in chains]
        finished = lambda: Job.objects.filter(pk__in=last, status="done").count() == 3  # noqa: E731
        if planted:
            with pytest.raises(AssertionError):
                wait_for(finished, timeout=3)
        else:
            wait_for(finished, timeout=15)
            assert [fresh(c[-1]).result for c in chains] == [0, 4, 8]
    finally:
        worker.stop()
        thread.join(15)
