"""What announcing bulk-enqueued jobs to ``task_enqueued`` receivers costs.

    python -m bench.bulk_signals [--count 100000] [--repeat 3]

``Job.objects.bulk_enqueue()`` of ``--count`` small jobs, with no receiver (COPY with
the table's own ids, batches overlapping with validation) and with one receiver that
counts what it gets (ids taken from the sequence, one round trip per batch, COPY with
explicit ids, a ``TaskResult`` and a signal per job). Runs alternate, on a truncated
table in a database of the bench's own (``pgqueue_bench_signals``); medians and their
ratio are printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

REPO = Path(__file__).resolve().parent.parent
BENCH_DB = "pgqueue_bench_signals"
TASK = "testproject.demo.tasks.add"


def configure() -> None:
    import psycopg

    url = os.environ.get("DATABASE_URL")
    if url:
        with psycopg.connect(url, autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [BENCH_DB])
            if exists.fetchone() is None:
                conn.execute(f'CREATE DATABASE "{BENCH_DB}"')  # our constant
        os.environ["DATABASE_URL"] = urlunsplit(urlsplit(url)._replace(path=f"/{BENCH_DB}"))
    else:
        from testproject.pgserver import embedded_server, ensure_database

        os.environ["DATABASE_URL"] = ensure_database(embedded_server(), BENCH_DB)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    sys.path.insert(0, str(REPO))
    import django

    django.setup()


def jobs(count: int) -> Iterator[dict[str, Any]]:
    for i in range(count):
        yield {"task": TASK, "args": [i, i % 97], "queue": ("default", "mail")[i % 2]}


def run(count: int, *, receiver: bool) -> tuple[float, int]:
    from django.db import connection

    from django_pgqueue.models import Job
    from django_pgqueue.taskapi import task_enqueued

    seen: list[int] = []

    def count_it(sender: type, task_result: Any, **kwargs: Any) -> None:
        seen.append(int(task_result.id))

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE pgqueue_job, pgqueue_step")
    if receiver:
        task_enqueued.connect(count_it, weak=False)
    try:
        started = time.perf_counter()
        created = Job.objects.bulk_enqueue(jobs(count))
        elapsed = time.perf_counter() - started
    finally:
        task_enqueued.disconnect(count_it)
    assert created == count
    if receiver:
        assert len(seen) == count and len(set(seen)) == count, len(seen)
    return elapsed, len(seen)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    configure()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    run(min(args.count, 5000), receiver=True)  # warm up
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.repeat):
        for receiver in (False, True):
            elapsed, _ = run(args.count, receiver=receiver)
            times[receiver].append(elapsed)
    none, one = statistics.median(times[False]), statistics.median(times[True])
    print(f"bulk_enqueue of {args.count:,} jobs, median of {args.repeat} (interleaved):")
    print(f"  no receiver:   {none:6.2f} s  ({args.count / none:,.0f} jobs/s)")
    print(f"  one receiver:  {one:6.2f} s  ({args.count / one:,.0f} jobs/s)")
    print(f"  ratio: {one / none:.2f}x   runs: no={times[False]} one={times[True]}")
    print("(2 shared cores; other work ran on this machine.)")


if __name__ == "__main__":
    main()
