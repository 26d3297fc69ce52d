"""Worker benchmark: burn-down throughput and idle pickup latency.

    python -m bench.throughput [--jobs 20000] [--workers 2] [--concurrency 4]
                               [--batch-size 8] [--latency-samples 50]
    make bench NAME=throughput

Burn-down: worker processes are started first and left idle; then ``--jobs`` no-op jobs
are bulk-enqueued in one transaction and the clock runs until every job is ``done``
(measured by the database: ``max(finished_at) - min(created_at)``). Pickup latency: on
an idle queue, one job at a time is enqueued and committed; the time from its
``created_at`` to its ``started_at`` (both database clock) is the latency a NOTIFY buys.

Database: ``pgqueue_bench_worker`` on the embedded server, or ``DATABASE_URL`` (whose
jobs table is truncated: use a database of its own).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MANAGE = REPO / "testproject" / "manage.py"
TASK = "testproject.demo.tasks.add"


def prepare() -> None:
    sys.path.insert(0, str(REPO))
    if not os.environ.get("DATABASE_URL"):
        from testproject.pgserver import embedded_server, ensure_database

        os.environ["DATABASE_URL"] = ensure_database(embedded_server(), "pgqueue_bench_worker")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def truncate() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE pgqueue_job, pgqueue_step")


def start_workers(args: argparse.Namespace) -> list[subprocess.Popen[bytes]]:
    cmd = [
        sys.executable, str(MANAGE), "pgqueue_worker", "-v", "0",
        "--concurrency", str(args.concurrency), "--batch-size", str(args.batch_size),
        "--poll-interval", "1",
    ]  # fmt: skip
    return [
        subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(args.workers)
    ]


def wait_until(condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit("benchmark timed out")
        time.sleep(0.05)


def burn_down(jobs: int) -> float:
    """Enqueue ``jobs`` at once to idle workers; return jobs/s by the database clock."""
    from django.db import connection

    from django_pgqueue.models import Job

    truncate()
    Job.objects.bulk_enqueue({"task": TASK, "args": [i, i]} for i in range(jobs))
    wait_until(lambda: not Job.objects.exclude(status="done").exists(), timeout=600)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT extract(epoch FROM max(finished_at) - min(created_at)) FROM pgqueue_job"
        )
        (seconds,) = cursor.fetchone()
    return jobs / float(seconds)


def pickup_latency(samples: int) -> list[float]:
    """Milliseconds from commit of an enqueue to the job's start, on an idle queue."""
    from django.db import connection

    from django_pgqueue.models import Job

    truncate()
    latencies = []
    for i in range(samples):
        job = Job.objects.enqueue(TASK, [i, i])  # autocommit: NOTIFY goes out now
        wait_until(lambda pk=job.pk: Job.objects.filter(pk=pk, status="done").exists(), 30)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT extract(epoch FROM started_at - created_at) * 1000"
                " FROM pgqueue_job WHERE id = %s",
                [job.pk],
            )
            latencies.append(float(cursor.fetchone()[0]))
        time.sleep(0.02)  # let the workers go idle again
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000, help="(default: %(default)r)")
    parser.add_argument("--workers", type=int, default=2, help="(default: %(default)r)")
    parser.add_argument("--concurrency", type=int, default=4, help="(default: %(default)r)")
    parser.add_argument("--batch-size", type=int, default=8, help="(default: %(default)r)")
    parser.add_argument("--latency-samples", type=int, default=50, help="(default: %(default)r)")
    args = parser.parse_args()
    prepare()
    from django.db import connection

    truncate()
    workers = start_workers(args)
    try:
        time.sleep(3)  # Django start-up of the workers, not part of the measurement
        rate = burn_down(args.jobs)
        print(
            f"burn-down: {args.jobs:,} jobs, {args.workers} workers x {args.concurrency} "
            f"threads, batch {args.batch_size}: {rate:,.0f} jobs/s "
            f"(PostgreSQL {connection.pg_version // 10000}, {os.cpu_count()} cores)"
        )
        lat = sorted(pickup_latency(args.latency_samples))
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
        print(
            f"pickup latency on an idle queue ({len(lat)} samples): "
            f"p50 {statistics.median(lat):.1f} ms, p99 {p99:.1f} ms, max {lat[-1]:.1f} ms"
        )
    finally:
        for proc in workers:
            proc.send_signal(signal.SIGTERM)
        for proc in workers:
            proc.wait(30)


if __name__ == "__main__":
    main()
