"""The one-by-one enqueue, costed per call: client wall time, client CPU and the CPU of
its PostgreSQL backend, and the statements each call sends.

    python -m bench.enqueue_loop [--jobs 2000] [--rounds 3] [--modes manager,task,...]
                                 [--database-url URL]

Modes (each on a truncated table, after 50 calls of warm-up, interleaved by round):

* ``manager``: ``Job.objects.enqueue(path, [i, i])`` in autocommit (what ``bench.compare``
  times as "the loop");
* ``task``: ``add.enqueue(i, i)`` through ``django.tasks`` (``testproject.demo.tasks.add``,
  the default backend), in autocommit;
* ``task_atomic``: the same ``--jobs`` calls inside one ``transaction.atomic()``;
* ``task_each_atomic``: each call in its own ``transaction.atomic()`` block.

CPU is user + system time (this process: ``time.process_time``; the backend of its
connection, on the same machine: ``/proc``). Statements per call are counted by a
``connection.execute_wrapper`` over 100 further calls (the BEGIN and COMMIT of an
``atomic()`` block are not statements Django runs through it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

from bench.common import cpu_seconds, ensure_databases, setup_django, sql_one

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/pgqueue_bench_enqueue_loop"
TASK = "testproject.demo.tasks.add"
MODES = ("manager", "task", "task_atomic", "task_each_atomic")


def calls(mode: str) -> Any:
    """A function of (first, count) making ``count`` enqueues the way ``mode`` says."""
    from django.db import transaction

    from django_pgqueue.models import Job
    from testproject.demo.tasks import add

    def manager(first: int, count: int) -> None:
        for i in range(first, first + count):
            Job.objects.enqueue(TASK, [i, i])

    def task(first: int, count: int) -> None:
        for i in range(first, first + count):
            add.enqueue(i, i)

    def task_atomic(first: int, count: int) -> None:
        with transaction.atomic():
            for i in range(first, first + count):
                add.enqueue(i, i)

    def task_each_atomic(first: int, count: int) -> None:
        for i in range(first, first + count):
            with transaction.atomic():
                add.enqueue(i, i)

    return {
        "manager": manager,
        "task": task,
        "task_atomic": task_atomic,
        "task_each_atomic": task_each_atomic,
    }[mode]


def measure(mode: str, jobs: int) -> dict[str, float]:
    from django.db import connection

    run = calls(mode)
    sql_one("TRUNCATE pgqueue_job CASCADE")
    run(0, 50)  # warm-up: prepared statements, caches
    backend = sql_one("SELECT pg_backend_pid()")
    pg0, cpu0, wall0 = cpu_seconds(backend), time.process_time(), time.perf_counter()
    run(50, jobs)
    wall = time.perf_counter() - wall0
    cpu, pg = time.process_time() - cpu0, cpu_seconds(backend) - pg0
    sent: list[str] = []

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        sent.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(count):
        run(50 + jobs, 100)
    return {
        "rate": jobs / wall,
        "wall_us": wall / jobs * 1e6,
        "cpu_us": cpu / jobs * 1e6,
        "pg_us": pg / jobs * 1e6,
        "statements": len(sent) / 100,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_URL)
    )
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES))
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    ensure_databases(args.database_url)
    setup_django(args.database_url)
    results: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    for r in range(args.rounds):
        for mode in modes[r % len(modes) :] + modes[: r % len(modes)]:
            got = measure(mode, args.jobs)
            results[mode].append(got)
            print(
                f"round {r + 1} {mode:<17} {got['rate']:>7,.0f}/s  wall {got['wall_us']:6.0f} µs"
                f"  client CPU {got['cpu_us']:5.0f} µs  PG CPU {got['pg_us']:5.0f} µs"
                f"  statements {got['statements']:.2f}",
                flush=True,
            )
    print(f"\nmedians of {args.rounds} rounds, {args.jobs:,} enqueues each, per enqueue")
    print("| mode | jobs/s | wall µs | client CPU µs | PG backend CPU µs | statements |")
    print("|---|---|---|---|---|---|")
    for mode, got in results.items():
        med = {k: statistics.median(g[k] for g in got) for k in got[0]}
        print(
            f"| {mode} | {med['rate']:,.0f} | {med['wall_us']:.0f} | {med['cpu_us']:.0f} | "
            f"{med['pg_us']:.0f} | {med['statements']:.2f} |"
        )


if __name__ == "__main__":
    main()
