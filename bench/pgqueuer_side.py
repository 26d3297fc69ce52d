"""The PgQueuer side of ``bench.compare``; runs in the bench-only PgQueuer virtualenv.

Never imported by django-pgqueue or its tests: PgQueuer is not a dependency of the
package. ``bench.compare`` creates ``bench/.venv-pgqueuer`` (PgQueuer 1.6.0, asyncpg)
and runs this file there. A worker is ``pgqueuer.run(create)`` on uvloop: what
``pgq run bench.pgqueuer_side:create`` does, with all of its defaults (batch size 10,
no concurrency cap, 30 s dequeue timeout, durable tables). The command itself is not
used because its ``--log-level`` parsing fails with typer 0.29 (``'str' object has no
attribute 'name'``, even with the default level).

Commands of this script (``python bench/pgqueuer_side.py <command>``), all on the
database named by ``PGQ_BENCH_DSN``:

* ``worker``: run one worker process until SIGTERM or SIGINT;
* ``install``: (re)install PgQueuer's schema, empty;
* ``truncate``: empty its queue and log tables;
* ``bulk N``: enqueue N jobs through PgQueuer's batch ``enqueue`` (one statement per
  ``--chunk`` jobs, one transaction), print jobs/s;
* ``loop N``: enqueue N jobs one ``enqueue`` call each (autocommit; ``--transaction``:
  all in one transaction), print jobs/s;
* ``latency N``: pickup latency of N jobs enqueued one at a time on an idle queue.

Each prints one JSON object, read by ``bench.compare``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import pgqueuer
import uvloop
from pgqueuer import AsyncpgDriver, PgQueuer, Queries
from pgqueuer.models import Job

ENTRYPOINT = "noop"


def dsn() -> str:
    return os.environ["PGQ_BENCH_DSN"]


@asynccontextmanager
async def create() -> AsyncIterator[PgQueuer]:
    """The worker factory for ``pgq run``: one asyncpg connection, one no-op entrypoint."""
    conn = await asyncpg.connect(dsn())
    pgq = PgQueuer(AsyncpgDriver(conn))

    @pgq.entrypoint(ENTRYPOINT)
    async def noop(job: Job) -> None:
        return None

    try:
        yield pgq
    finally:
        await conn.close()


async def install() -> None:
    conn = await asyncpg.connect(dsn())
    try:
        queries = Queries(AsyncpgDriver(conn))
        if await queries.schema_is_installed():
            await queries.uninstall()
        await queries.install()
    finally:
        await conn.close()


async def truncate() -> None:
    conn = await asyncpg.connect(dsn())
    try:
        await conn.execute("TRUNCATE pgqueuer, pgqueuer_log")
    finally:
        await conn.close()


async def bulk(count: int, chunk: int, *, analyze: bool = False) -> dict[str, object]:
    """Enqueue ``count`` jobs in one transaction (with ``analyze``, ANALYZE the queue
    table in it too); the rate, and the database clock right after the commit (when
    workers can first see the jobs)."""
    conn = await asyncpg.connect(dsn())
    try:
        queries = Queries(AsyncpgDriver(conn))
        payloads = [str(i).encode() for i in range(count)]
        started = time.perf_counter()
        async with conn.transaction():
            for i in range(0, count, chunk):
                part = payloads[i : i + chunk]
                await queries.enqueue([ENTRYPOINT] * len(part), part, [0] * len(part))
            if analyze:
                await conn.execute("ANALYZE pgqueuer")
        rate = count / (time.perf_counter() - started)
        committed = await conn.fetchval("SELECT clock_timestamp()::text")
        return {"rate": rate, "committed": committed}
    finally:
        await conn.close()


async def loop(count: int, *, in_transaction: bool = False) -> dict[str, object]:
    """``count`` enqueues one by one, in autocommit or (``in_transaction``) all in one
    transaction, timed to the commit."""
    conn = await asyncpg.connect(dsn())
    try:
        queries = Queries(AsyncpgDriver(conn))
        started = time.perf_counter()
        if in_transaction:
            async with conn.transaction():
                for i in range(count):
                    await queries.enqueue(ENTRYPOINT, str(i).encode())
        else:
            for i in range(count):
                await queries.enqueue(ENTRYPOINT, str(i).encode())
        return {"rate": count / (time.perf_counter() - started)}
    finally:
        await conn.close()


async def latency(samples: int) -> dict[str, list[float]]:
    """One job at a time on an idle queue: milliseconds from its enqueue to its pick
    and to its recorded success (PgQueuer's log rows, database clock)."""
    conn = await asyncpg.connect(dsn())
    try:
        queries = Queries(AsyncpgDriver(conn))
        start: list[float] = []
        finish: list[float] = []
        for i in range(samples):
            (job_id,) = await queries.enqueue(ENTRYPOINT, str(i).encode())
            deadline = time.monotonic() + 30
            while True:
                row = await conn.fetchrow(
                    """
                    SELECT extract(epoch FROM p.created - q.created) * 1000,
                           extract(epoch FROM s.created - q.created) * 1000
                    FROM pgqueuer_log q, pgqueuer_log p, pgqueuer_log s
                    WHERE q.job_id = $1 AND q.status = 'queued'
                      AND p.job_id = $1 AND p.status = 'picked'
                      AND s.job_id = $1 AND s.status = 'successful'
                    """,
                    job_id,
                )
                if row is not None:
                    break
                if time.monotonic() > deadline:
                    raise SystemExit(f"job {job_id} did not finish")
                await asyncio.sleep(0.005)
            start.append(float(row[0]))
            finish.append(float(row[1]))
            await asyncio.sleep(0.05)  # idle again: the worker waits for a wake-up
        return {"start": start, "finish": finish}
    finally:
        await conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description="PgQueuer side of bench.compare")
    parser.add_argument(
        "command", choices=["worker", "install", "truncate", "bulk", "loop", "latency"]
    )
    parser.add_argument("count", nargs="?", type=int, default=0)
    parser.add_argument("--chunk", type=int, default=10_000, help="(default: %(default)r)")
    parser.add_argument("--analyze", action="store_true", help="ANALYZE in the bulk transaction")
    parser.add_argument(
        "--transaction", action="store_true", help="loop: every enqueue in one transaction"
    )
    args = parser.parse_args()
    if args.command == "worker":
        uvloop.run(pgqueuer.run(create))
    elif args.command == "install":
        asyncio.run(install())
    elif args.command == "truncate":
        asyncio.run(truncate())
    elif args.command == "bulk":
        print(json.dumps(asyncio.run(bulk(args.count, args.chunk, analyze=args.analyze))))  # noqa: T201
    elif args.command == "loop":
        print(json.dumps(asyncio.run(loop(args.count, in_transaction=args.transaction))))  # noqa: T201
    else:
        print(json.dumps(asyncio.run(latency(args.count))))  # noqa: T201


if __name__ == "__main__":
    main()
