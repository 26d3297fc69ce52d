"""Coroutine jobs on one worker process's event loop: rate, memory, and a mix.

    python -m bench.async_jobs [--jobs 10000] [--seconds 0.1] [--async-concurrency 1000]
                               [--in-flight 1000] [--rounds 3]
    make bench NAME=async_jobs

One ``pgqueue_worker --concurrency 4`` process (``-v 0``) at a time, started idle, then:

* ``coroutines``: ``--jobs`` jobs of ``testproject.demo.tasks.nap`` (``await
  asyncio.sleep(--seconds)``) enqueued in one transaction; jobs/s by the database
  clock (jobs / (last ``finished_at`` - the enqueue's commit)), against the bound
  ``async-concurrency / seconds``; the worker's peak RSS during the drain;
* ``in flight``: ``--in-flight`` jobs of ``nap(30)`` at once on a loop of that size:
  the worker's RSS once all of them are running, against its RSS idle (the target: no
  more than 60 MB above it), and its connections to the database by role;
* ``mix``: half no-op thread jobs (``add``), half coroutine jobs, interleaved; jobs/s
  (``--mix-batch-size``: that worker's ``--batch-size``).

Each figure is the median of ``--rounds`` rounds (a fresh worker each). Database:
``pgqueue_bench_async`` on the embedded server, or ``DATABASE_URL`` (whose jobs table is
truncated: give it a database of its own).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.common import cpu_seconds, setup_django, sql_one, wait_until

REPO = Path(__file__).resolve().parent.parent
MANAGE = REPO / "testproject" / "manage.py"
NAP = "testproject.demo.tasks.nap"
ADD = "testproject.demo.tasks.add"


def prepare() -> None:
    sys.path.insert(0, str(REPO))
    if not os.environ.get("DATABASE_URL"):
        from testproject.pgserver import embedded_server, ensure_database

        os.environ["DATABASE_URL"] = ensure_database(embedded_server(), "pgqueue_bench_async")
    setup_django()


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    """A memory figure of process ``pid`` from /proc (VmRSS: now, VmHWM: its peak)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise SystemExit(f"no {field} for process {pid}")


def unfinished() -> bool:
    return bool(
        sql_one(
            "SELECT EXISTS (SELECT 1 FROM pgqueue_job WHERE status = 'pending') "
            "OR EXISTS (SELECT 1 FROM pgqueue_job WHERE status = 'running')"
        )
    )


@contextmanager
def worker(
    async_concurrency: int, batch_size: int | None = None, concurrency: int = 4
) -> Iterator[subprocess.Popen[bytes]]:
    """An idle worker process, warmed up (it ran one job of each kind)."""
    from django_pgqueue.models import Job

    sql_one("TRUNCATE pgqueue_job, pgqueue_step")
    command = [sys.executable, str(MANAGE), "pgqueue_worker", "-v", "0"]
    command += ["--concurrency", str(concurrency), "--async-concurrency", str(async_concurrency)]
    command += ["--worker-id", "bench-async"]
    if batch_size is not None:
        command += ["--batch-size", str(batch_size)]
    proc = subprocess.Popen(
        command,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        Job.objects.enqueue(ADD, [1, 1])
        Job.objects.enqueue(NAP, [0.0])
        wait_until(lambda: not unfinished(), 60, "the worker to start")
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def enqueue(rows: Iterator[dict[str, Any]]) -> Any:
    """Enqueue in one transaction; the database's clock right after the commit."""
    from django.db import transaction

    from django_pgqueue.models import Job

    with transaction.atomic():
        Job.objects.bulk_enqueue(rows)
        sql_one("ANALYZE pgqueue_job")
    return sql_one("SELECT clock_timestamp()")


def drain_rate(jobs: int, committed: Any, pid: int, cpu: float) -> tuple[float, float, float]:
    """Wait for the drain; (jobs/s by the database clock, the worker's peak RSS, its CPU
    per job in µs since ``cpu``)."""
    wait_until(lambda: not unfinished(), 3600, "the drain")
    used = (cpu_seconds(pid) - cpu) / jobs * 1e6
    seconds = sql_one(
        "SELECT extract(epoch FROM max(finished_at) - %s::timestamptz) FROM pgqueue_job",
        [committed],
    )
    return jobs / float(seconds), rss_mb(pid, "VmHWM"), used


def coroutines(args: argparse.Namespace) -> tuple[float, float, float]:
    with worker(args.async_concurrency) as proc:
        cpu = cpu_seconds(proc.pid)
        committed = enqueue({"task": NAP, "args": [args.seconds]} for _ in range(args.jobs))
        return drain_rate(args.jobs, committed, proc.pid, cpu)


def in_flight(args: argparse.Namespace) -> tuple[float, float, dict[str, int]]:
    """(idle RSS, RSS with ``--in-flight`` coroutine jobs running, connections by role)."""
    with worker(args.in_flight) as proc:
        time.sleep(1.0)
        idle = rss_mb(proc.pid)
        enqueue({"task": NAP, "args": [30]} for _ in range(args.in_flight))
        wait_until(
            lambda: (
                sql_one("SELECT count(*) FROM pgqueue_job WHERE status = 'running'")
                >= args.in_flight
            ),
            120,
            "every job to start",
        )
        time.sleep(1.0)  # (they all run: the loop has taken each)
        busy = rss_mb(proc.pid)
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT split_part(application_name, ' ', 2), count(*) FROM pg_stat_activity "
                "WHERE application_name LIKE 'pgqueue %% bench-async' GROUP BY 1 ORDER BY 1"
            )
            roles = dict(cursor.fetchall())
        # Cancelled (their coroutines at once), so that the worker stops without
        # waiting for them.
        from django_pgqueue.models import Job

        Job.objects.cancel(Job.objects.filter(status="running").values_list("id", flat=True))
        wait_until(lambda: not unfinished(), 120, "the cancellations")
        return idle, busy, roles


def mix(args: argparse.Namespace) -> tuple[float, float, float]:
    def rows() -> Iterator[dict[str, Any]]:
        for i in range(args.jobs):
            if i % 2:
                yield {"task": NAP, "args": [args.seconds]}
            else:
                yield {"task": ADD, "args": [i, i]}

    with worker(args.async_concurrency, args.mix_batch_size) as proc:
        cpu = cpu_seconds(proc.pid)
        committed = enqueue(rows())
        return drain_rate(args.jobs, committed, proc.pid, cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000, help="(default: %(default)r)")
    parser.add_argument("--seconds", type=float, default=0.1, help="(default: %(default)r)")
    parser.add_argument(
        "--async-concurrency", type=int, default=1000, help="(default: %(default)r)"
    )
    parser.add_argument("--in-flight", type=int, default=1000, help="(default: %(default)r)")
    parser.add_argument(
        "--mix-batch-size",
        type=int,
        default=None,
        help="--batch-size of the mix's worker (default: the worker's own)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="(default: %(default)r)")
    parser.add_argument(
        "--only", default="", help="comma-separated: coroutines,inflight,mix (default: all)"
    )
    args = parser.parse_args()
    only = set(filter(None, args.only.split(",")))
    prepare()
    results: dict[str, list[Any]] = {}

    def record(name: str, value: Any, text: str) -> None:
        results.setdefault(name, []).append(value)
        print(f"  {name:<12} {text}", flush=True)

    for r in range(args.rounds):
        print(f"round {r + 1}/{args.rounds}", flush=True)
        if not only or "coroutines" in only:
            rate, peak, used = coroutines(args)
            record(
                "coroutines",
                (rate, peak, used),
                f"{rate:,.0f} jobs/s, peak RSS {peak:.1f} MB, {used:.0f} µs CPU a job",
            )
        if not only or "inflight" in only:
            idle, busy, roles = in_flight(args)
            record("inflight", (idle, busy, roles), f"idle {idle:.1f} MB, busy {busy:.1f} MB")
        if not only or "mix" in only:
            rate, peak, used = mix(args)
            record(
                "mix",
                (rate, peak, used),
                f"{rate:,.0f} jobs/s, peak RSS {peak:.1f} MB, {used:.0f} µs CPU a job",
            )
    load = os.getloadavg()
    print(
        f"\nPostgreSQL {sql_one('SHOW server_version')}, {os.cpu_count()} cores, load "
        f"average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; medians of {args.rounds}; one "
        "worker process, --concurrency 4"
    )
    print(f"| figure | result | target |\n|{'---|' * 3}")
    if "coroutines" in results:
        rates = [rate for rate, _, _ in results["coroutines"]]
        used = statistics.median(u for _, _, u in results["coroutines"])
        bound = args.async_concurrency / args.seconds
        print(
            f"| {args.jobs:,} coroutine jobs of `asyncio.sleep({args.seconds:g})`, "
            f"--async-concurrency {args.async_concurrency} | "
            f"{statistics.median(rates):,.0f} jobs/s "
            f"({', '.join(f'{r:,.0f}' for r in rates)}; bound {bound:,.0f}), peak RSS "
            f"{statistics.median(p for _, p, _ in results['coroutines']):.1f} MB, worker CPU "
            f"{used:.0f} µs a job | |"
        )
    if "inflight" in results:
        idle = statistics.median(i for i, _, _ in results["inflight"])
        busy = statistics.median(b for _, b, _ in results["inflight"])
        roles = results["inflight"][-1][2]
        print(
            f"| RSS with {args.in_flight:,} coroutine jobs in flight | {busy:.1f} MB, idle "
            f"{idle:.1f} MB: +{busy - idle:.1f} MB; connections "
            f"{sum(roles.values())} ({', '.join(f'{k} {v}' for k, v in roles.items())}) "
            "| within 60 MB of idle |"
        )
    if "mix" in results:
        rates = [rate for rate, _, _ in results["mix"]]
        used = statistics.median(u for _, _, u in results["mix"])
        batch = "" if args.mix_batch_size is None else f", --batch-size {args.mix_batch_size}"
        print(
            f"| {args.jobs:,} jobs, half no-op thread jobs, half coroutine jobs of "
            f"`asyncio.sleep({args.seconds:g})`{batch} | {statistics.median(rates):,.0f} jobs/s "
            f"({', '.join(f'{r:,.0f}' for r in rates)}), worker CPU {used:.0f} µs a job | |"
        )


if __name__ == "__main__":
    main()
