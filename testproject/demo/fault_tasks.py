"""Tasks for the fault tests and the chaos suite; each execution leaves a ledger row.

``Execution`` rows are the oracle's evidence: a transactional task's row commits with
its completion (so exactly one per done job), an ordinary task's row commits at once
(so a job run twice leaves two rows, reported as a plain duplicate).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connection, transaction

from django_pgqueue.models import ClockTimestamp
from django_pgqueue.taskapi import task
from django_pgqueue.tasks import current_job

from .models import Execution, Span


def record(kind: str, backend_pid: int | None = None) -> int:
    """Write this execution's ledger row; return the job id."""
    job = current_job()
    assert job is not None, "only a worker runs these tasks"
    Execution.objects.create(
        job_id=job.id,
        attempt=job.attempt,
        kind=kind,
        worker_id=job.worker_id,
        backend_pid=backend_pid,
    )
    return job.id


@task()
def ledger_plain(n: int = 0, work_ms: float = 0.0) -> int:
    """An ordinary task: its effect commits at once (at-least-once)."""
    record("plain")
    time.sleep(work_ms / 1000)
    return n


@task()
async def ledger_async(n: int = 0, work_ms: float = 0.0) -> int:
    """A coroutine task (it runs on the worker's event loop): its effect, a ``plain``
    row, commits at once from its lane thread (at-least-once), as ``ledger_plain``'s."""
    await sync_to_async(record)("plain")
    await asyncio.sleep(work_ms / 1000)
    return n


@task(transactional=True)
def ledger_tx(n: int = 0, work_ms: float = 0.0) -> int:
    """A transactional task: its effect commits with its completion (exactly once)."""
    record("tx")
    time.sleep(work_ms / 1000)
    return n


@task(max_attempts=3)
def poison() -> None:
    """Kills its own worker process every time it runs, after a "poison" ledger row
    (so the chaos suite can tell its SIGKILLs from ones nobody sent, e.g. the OOM
    killer's)."""
    record("poison")
    os.kill(os.getpid(), signal.SIGKILL)


@task(timeout=1.0)
def hang(seconds: float = 5.0) -> float:
    """Runs far past its 1 s timeout (then records, too late to count)."""
    time.sleep(seconds)
    record("plain")
    return seconds


@task()
def slow_plain(seconds: float = 1.0) -> float:
    """Sleeps, then records: a zombie's effect shows up as a second ledger row."""
    time.sleep(seconds)
    record("plain")
    return seconds


@task()
async def slow_in_thread(seconds: float = 1.0) -> float:
    """A coroutine task waiting on a blocking call in the event loop's thread pool."""
    await asyncio.to_thread(time.sleep, seconds)
    return seconds


@task(transactional=True)
def slow_tx(seconds: float = 1.0) -> float:
    """Records, then sleeps, in one transaction with its completion."""
    record("tx")
    time.sleep(seconds)
    return seconds


@task()
def leak_transaction() -> None:
    """Opens an atomic block and never closes it."""
    transaction.atomic().__enter__()
    record("plain")


#: Ways a task can leave its connection dirty outside Django's tracking, by name: SQL
#: run through Django's cursor, then (``raw_*``) straight on the psycopg connection.
LEAKS: dict[str, str] = {
    "begin": "BEGIN",
    "set_role": "SET ROLE pg_monitor",
    "search_path": "SET search_path = pg_catalog",
    "statement_timeout": "SET statement_timeout = 1234",
    "advisory_lock": "SELECT pg_advisory_lock(8)",
    "hold_cursor": "DECLARE pgqueue_leak CURSOR WITH HOLD FOR SELECT 1",
    "prepare": "PREPARE pgqueue_leak AS SELECT 1",
    "listen": "LISTEN pgqueue_leak",
    "temp_table": "CREATE TEMPORARY TABLE pgqueue_leak (id int)",
    "read_only": "SET default_transaction_read_only = on",
}
#: Every way ``leak`` knows.
LEAK_KINDS: list[str] = [*LEAKS, *(f"raw_{k}" for k in LEAKS), "autocommit_off"]


@task()
def leak(kind: str, then_raise: bool = False) -> None:
    """Record an execution, then leave the connection dirty in the way ``kind`` names
    (one of ``LEAK_KINDS``), then maybe raise. A "leaked" ledger row is written inside
    the leaked transaction: it must never be committed. The execution's row names the
    session's backend, so the oracle can tell a leak the worker missed from one whose
    session a fault ended first (a terminated backend, a restart: nothing was left)."""
    connection.ensure_connection()
    record("plain", backend_pid=connection.connection.info.backend_pid)
    if kind == "autocommit_off":
        connection.ensure_connection()
        connection.connection.autocommit = False  # the driver's, behind Django's back
        record("leaked")  # this row now waits in an implicit transaction
    elif kind.startswith("raw_"):
        connection.connection.execute(LEAKS[kind.removeprefix("raw_")])
    else:
        with connection.cursor() as cursor:
            cursor.execute(LEAKS[kind])
    if kind in ("begin", "raw_begin"):
        record("leaked")  # this row now waits in the leaked transaction
    if then_raise:
        raise RuntimeError(f"failed after leaking {kind}")


@task(transactional=True)
def leak_tx(kind: str) -> None:
    """A transactional task that leaves session state beyond its transaction."""
    record("tx")
    with connection.cursor() as cursor:
        cursor.execute(LEAKS[kind])


@task()
def reconnect() -> None:
    """Closes Django's connection mid-task, then writes on a fresh one (as a task
    calling ``close_old_connections()`` would): not a leak."""
    connection.close()
    record("plain")


@task()
def session_probe() -> dict[str, Any]:
    """What this runner connection carries: the state a leak would have left."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_user, current_setting('search_path'),"
            " current_setting('statement_timeout'),"
            " (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
            "  AND pid = pg_backend_pid()),"
            " (SELECT count(*) FROM pg_cursors WHERE name <> ''),"
            " (SELECT count(*) FROM pg_prepared_statements WHERE name = 'pgqueue_leak'),"
            " (SELECT count(*) FROM pg_listening_channels()),"
            " to_regclass('pg_temp.pgqueue_leak') IS NOT NULL"
        )
        row = cursor.fetchone()
    names = ("user", "search_path", "statement_timeout", "advisory", "cursors", "prepared")
    state: dict[str, Any] = dict(zip(names + ("listening", "temp_table"), row, strict=True))
    state["in_transaction"] = connection.connection.info.transaction_status != 0
    state["autocommit"] = connection.connection.autocommit
    return state


#: Session changes a task can make that the worker resets before the next job, by the
#: setting ``session_sample`` reads back (``random`` for the generator's seed).
SESSION_CHANGES: dict[str, str] = {
    "extra_float_digits": "SET extra_float_digits = -15",
    "transform_null_equals": "SET transform_null_equals = on",
    "client_encoding": "SET client_encoding = 'LATIN1'",
    "application_name": "SET application_name = 'pgqueue leak'",
    "IntervalStyle": "SET IntervalStyle = 'sql_standard'",
    "random": "SELECT setseed(0.5)",
    "work_mem": "SET work_mem = '123MB'",
    "enable_indexscan": "SET enable_indexscan = off",
    "array_nulls": "SET array_nulls = off",
    "idle_session_timeout": "SET idle_session_timeout = '1h'",
    "app.tenant": "SELECT set_config('app.tenant', 'acme', false)",
}


@task()
def change_session(sql: str) -> None:
    """Run ``sql`` (a session change) on this runner's connection and return."""
    with connection.cursor() as cursor:
        cursor.execute(sql)


@task()
def session_sample(name: str) -> dict[str, Any]:
    """What the next job sees of the setting ``name`` (or of ``random()``), a float read
    back and a non-ASCII text read back, and the SQL prepared statements it finds."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_setting(%s, true), random(), 1.23456789::float8, 'naïve',"
            " (SELECT count(*) FROM pg_prepared_statements WHERE from_sql)",
            [name],
        )
        setting, rand, number, text, prepared = cursor.fetchone()
    return {
        "setting": setting,
        "random": rand,
        "float": number,
        "text": text,
        "prepared": prepared,
    }


@task()
def system_exit() -> None:
    """Raises SystemExit (a BaseException) from inside a task."""
    raise SystemExit("task called sys.exit()")


@task(transactional=True)
def on_commit_raises() -> None:
    """Commits its effect, then an on_commit callback raises."""
    record("tx")

    def boom() -> None:
        raise RuntimeError("on_commit callback failed")

    transaction.on_commit(boom)


@task(transactional=True)
def enqueue_child_then_raise() -> None:
    """Writes an effect and enqueues a child job, then fails: both must roll back."""
    record("tx")
    ledger_plain.enqueue(n=-1)
    raise RuntimeError("parent failed after enqueueing a child")


@task()
def span(seconds: float = 0.1) -> int:
    """Record when this run's body starts and ends, by the database's clock (a ``Span``
    row), sleeping ``seconds`` in between: the flow control tests' evidence of what ran
    at once."""
    job = current_job()
    assert job is not None, "only a worker runs these tasks"
    row = Span.objects.create(
        job_id=job.id,
        attempt=job.attempt,
        worker_id=job.worker_id,
        started_at=ClockTimestamp(),
    )
    time.sleep(seconds)
    Span.objects.filter(pk=row.pk).update(finished_at=ClockTimestamp())
    return job.id


@task(max_attempts=50)
def ledger_member(n: int, work_ms: float = 0.0) -> int:
    """A workflow's member (or chain step): records its run (at-least-once: a member
    run twice after a crash leaves two rows), works ``work_ms``, returns ``n``."""
    record("plain")
    time.sleep(work_ms / 1000)
    return n


@task(transactional=True, max_attempts=50)
def ledger_sum(values: list[int | None]) -> int:
    """A group's callback: its ledger row commits with its completion (so exactly one
    per done callback), and it returns the sum of its members' results."""
    record("tx")
    return sum(v or 0 for v in values)
