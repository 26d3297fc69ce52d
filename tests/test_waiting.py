"""Waiting for results without polling (``waiting.py``, ``hub.py``): ``wait_for``,
``await_for``, ``watch`` and ``awatch``, against jobs finished by real
``pgqueue_worker`` processes or by hand (an UPDATE of the job's row, as any finishing
statement makes), on one database and on two."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time
from pathlib import Path

import psycopg
import pytest
from asgiref.sync import sync_to_async
from django.db import connection, connections
from django.utils import timezone

import django_pgqueue
from django_pgqueue import hub, sql
from django_pgqueue.models import Job
from django_pgqueue.taskapi import TaskResultStatus
from django_pgqueue.workflows import step
from testproject.demo.tasks import add, always_fails, slow
from tests import tasks
from tests.conftest import connect_test_db, wait_for

pytestmark = pytest.mark.django_db(databases=["default", "second"], transaction=True)

WORKER = ("pgqueue_worker", "--poll-interval", "0.1", "--concurrency", "4")


@pytest.fixture(autouse=True)
def _close_hubs():
    """Each test's hubs closed after it: their connections would keep the test
    database from being dropped."""
    yield
    hub.close_all()


def db_now(alias: str = "default") -> dt.datetime:
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def own_connection(alias: str = "default") -> psycopg.Connection:
    """A connection of the test's own (closed by its ``with``): one made by Django in a
    helper thread would outlive the test and keep its database from being dropped."""
    params = connections[alias].get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return psycopg.connect(**params, autocommit=True)


def finish(result, alias: str = "default", status: str = "done") -> None:
    """Finish a job by hand, as a worker's completion does: one committed UPDATE."""
    with own_connection(alias) as conn:
        conn.execute(
            "UPDATE pgqueue_job SET status = %s, result = '3', finished_at = clock_timestamp() "
            "WHERE id = %s",
            [status, int(result.id)],
        )


def waiting_connections() -> int:
    with own_connection() as conn:
        return conn.execute(
            # This test database's only: the slow tests' runs beside this one (make
            # test) have listening connections of their own on the same server.
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name LIKE 'pgqueue wait %'"
        ).fetchone()[0]


def test_wait_for__a_finished_job_returns_at_once_refreshed():
    result = add.enqueue(1, 2)
    finish(result)
    started = time.monotonic()
    assert django_pgqueue.wait_for(result, timeout=5) is result
    assert time.monotonic() - started < 1.0
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 3)


@pytest.mark.slow
def test_wait_for__a_real_worker_completion_wakes_it_within_a_moment(manage):
    """A 0.5 s job run by a pgqueue_worker process: wait_for returns within 0.6 s of the
    completion, in database time (it is woken by the NOTIFY, not a poll)."""
    manage(*WORKER)
    result = slow.enqueue(0.5)
    assert django_pgqueue.wait_for(result, timeout=30) is result
    returned = db_now()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 0.5
    assert result.finished_at is not None
    assert (returned - result.finished_at).total_seconds() < 0.6


@pytest.mark.slow
def test_wait_for__times_out_after_about_the_timeout(manage):
    manage(*WORKER)
    result = slow.enqueue(5)
    wait_for(lambda: Job.objects.get(pk=result.id).status == "running", timeout=20)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=f"job {result.id} not finished within 0.2 s"):
        django_pgqueue.wait_for(result, timeout=0.2)
    assert 0.2 <= time.monotonic() - started < 0.5
    # Not finished, so not refreshed by the failed wait.
    assert result.status == TaskResultStatus.READY


@pytest.mark.slow
def test_wait_for__failed_cancelled_and_several_at_once(manage):
    """Dead (FAILED), cancelled (FAILED) and done all count as finished; a list comes
    back as the list, each refreshed."""
    manage(*WORKER)
    ok = add.enqueue(2, 3)
    bad = Job.objects.enqueue(always_fails, ["boom"], max_attempts=1)
    cancelled = slow.using(run_after=timezone.now() + dt.timedelta(hours=1)).enqueue(1)
    Job.objects.cancel([int(cancelled.id)])
    got = django_pgqueue.wait_for([ok, bad, cancelled], timeout=30)
    assert got[0] is ok and got[2] is cancelled and got[1].id == str(bad.id)
    assert [r.status for r in got] == [
        TaskResultStatus.SUCCESSFUL,
        TaskResultStatus.FAILED,
        TaskResultStatus.FAILED,
    ]
    assert ok.return_value == 5


def test_wait_for__first_returns_the_first_to_finish():
    slow_one, quick = add.enqueue(1, 1), add.enqueue(2, 2)

    def later() -> None:
        time.sleep(0.1)
        finish(quick)

    thread = threading.Thread(target=later)
    thread.start()
    got = django_pgqueue.wait_for([slow_one, quick], timeout=5, first=True)
    thread.join()
    assert got is quick and quick.status == TaskResultStatus.SUCCESSFUL
    assert slow_one.status == TaskResultStatus.READY


@pytest.mark.slow
def test_wait_for__a_chain_and_a_groups_callback(manage):
    manage(*WORKER)
    last = django_pgqueue.chain(step(add, 1, 2), step(tasks.double)).enqueue()[-1]
    members = [step(add, 1, 1), step(add, 2, 2)]
    callback = django_pgqueue.group(*members, then=step(tasks.total)).enqueue()[-1]
    got = django_pgqueue.wait_for([last, callback], timeout=30)
    assert [r.return_value for r in got] == [6, 6]
    assert [r.id for r in got] == [str(last.id), str(callback.id)]


def test_wait_for__two_databases_one_listening_connection_each():
    here, there = add.enqueue(1, 2), add.using(backend="second").enqueue(3, 4)

    def later() -> None:
        time.sleep(0.1)
        finish(here)
        finish(there, "second")

    thread = threading.Thread(target=later)
    thread.start()
    django_pgqueue.wait_for([here, there], timeout=5)
    thread.join()
    assert here.status == there.status == TaskResultStatus.SUCCESSFUL
    assert set(hub._hubs) >= {"default", "second"}


def test_await_for__200_waiters_share_one_listening_connection():
    """200 concurrent waiters of an event loop: one LISTEN connection for the
    database, not 200; each returns once its job is finished."""
    results = [add.enqueue(n, n) for n in range(200)]
    seen: list[int] = []

    async def main() -> list:
        waits = [asyncio.ensure_future(django_pgqueue.await_for(r, timeout=30)) for r in results]
        await asyncio.sleep(0.3)
        seen.append(await asyncio.to_thread(waiting_connections))
        with connect_test_db(autocommit=True) as conn:
            conn.execute(
                "UPDATE pgqueue_job SET status = 'done', result = '0', "
                "finished_at = clock_timestamp() WHERE id = ANY(%s)",
                [[int(r.id) for r in results]],
            )
        got = await asyncio.gather(*waits)
        await sync_to_async(connections.close_all)()  # arefresh()'s thread's
        return got

    got = asyncio.run(main())
    assert seen == [1]
    assert got == results
    assert all(r.status == TaskResultStatus.SUCCESSFUL for r in results)


def test_await_for__timeout():
    result = add.enqueue(1, 1)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        asyncio.run(django_pgqueue.await_for(result, timeout=0.2))
    assert 0.2 <= time.monotonic() - started < 0.5


@pytest.mark.slow
def test_watch__yields_each_progress_then_the_result(manage, tmp_path):
    """Sync and coroutine tasks: the progress stored while running, then the result."""
    manage(*WORKER)
    for i, progress_task in enumerate([tasks.report_progress, tasks.async_report_progress]):
        marker, gate = tmp_path / f"started-{i}", tmp_path / f"gate-{i}"
        result = progress_task.enqueue(str(marker), str(gate))
        seen = []
        for value in django_pgqueue.watch(result, timeout=30):
            seen.append(value)
            if value == {"done": 1, "of": 2}:
                Path(gate).write_text("go")
        assert seen[:-1] == [{"done": 1, "of": 2}, {"done": 2, "of": 2}]
        assert seen[-1] is result and result.return_value == "finished"


def test_awatch__in_async_code():
    result = add.enqueue(1, 1)

    async def main() -> list:
        seen = []
        async for value in django_pgqueue.awatch(result, timeout=5):
            seen.append(value)
            if len(seen) == 1:
                await asyncio.to_thread(set_progress, result, 2)
            elif len(seen) == 2:
                await asyncio.to_thread(finish, result)
        await sync_to_async(connections.close_all)()  # arefresh()'s thread's
        return seen

    def set_progress(result, value) -> None:
        with connect_test_db(autocommit=True) as conn:
            conn.execute(
                "UPDATE pgqueue_job SET progress = %s::jsonb WHERE id = %s",
                [str(value), int(result.id)],
            )

    set_progress(result, 1)
    assert asyncio.run(main()) == [1, 2, result]


def test_wait_for__only_waited_jobs_notify():
    """A job nobody waits on finishes without a notification: the drain without
    waiters pays nothing but the trigger's WHEN test."""
    quiet, waited = add.enqueue(1, 1), add.enqueue(2, 2)
    with connect_test_db(autocommit=True) as conn:
        conn.execute("LISTEN pgqueue_waited")
        finish(quiet)
        assert list(conn.notifies(timeout=0.2)) == []
        with connection.cursor() as cursor:
            cursor.execute("UPDATE pgqueue_job SET waited = true WHERE id = %s", [int(waited.id)])
        finish(waited)
        (notify,) = conn.notifies(timeout=2, stop_after=1)
    assert notify.payload == f"{waited.id} done"


def test_wait_for__bad_input_is_named():
    with pytest.raises(TypeError, match="not int"):
        django_pgqueue.wait_for(42)
    with pytest.raises(ValueError, match="timeout must be"):
        django_pgqueue.wait_for(add.enqueue(1, 1), timeout=-1)
    gone = add.enqueue(1, 1)
    Job.objects.filter(pk=gone.id).delete()
    with pytest.raises(ValueError, match=f"no job {gone.id} in database 'default'"):
        django_pgqueue.wait_for(gone, timeout=5)
    assert django_pgqueue.wait_for([]) == []


def test_wait_for__survives_the_listening_connection_dying():
    """The hub's connection killed while a waiter sleeps: it reconnects and reads its
    jobs again, so a completion during the outage is not missed."""
    result = add.enqueue(1, 1)

    def later() -> None:
        wait_for(lambda: waiting_connections() == 1, timeout=5)
        with connect_test_db(autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name LIKE 'pgqueue wait %%'"
            )
        finish(result)

    thread = threading.Thread(target=later)
    thread.start()
    django_pgqueue.wait_for(result, timeout=15)
    thread.join()
    assert result.status == TaskResultStatus.SUCCESSFUL


def test_wait_for__the_migrations_trigger_and_function_are_sql_pys():
    """The installed trigger and its function are sql/wait.py's (a migration's copies)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgname = 'pgqueue_job_waited'"
        )
        (definition,) = cursor.fetchone()
    assert "WHEN ((new.waited AND" in definition
    # The function the migration installed is sql.WAITED_NOTIFY_FUNCTION's.
    body = sql.WAITED_NOTIFY_FUNCTION.split("$body$")[1]
    with connection.cursor() as cursor:
        cursor.execute("SELECT prosrc FROM pg_proc WHERE proname = 'pgqueue_job_waited_notify'")
        assert cursor.fetchall() == [(body,)]
    assert "AFTER UPDATE OF status, progress ON public.pgqueue_job" in definition
