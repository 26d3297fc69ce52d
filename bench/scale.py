"""Flat at scale: drain rates behind a big backlog, after a million finished jobs, and
with the xmin horizon pinned by a long transaction; worker RSS over a million jobs.

    python -m bench.scale [--small 20000] [--big 1000000] [--pin-seconds 300]
                          [--processes 2] [--concurrency 4] [--batch-size 50]
                          [--queue NAME ...] [--rescan-seconds S]
    make bench NAME=scale

One ``pgqueue_worker --processes P`` (a supervisor and P workers) runs for the whole
benchmark. Each drain enqueues its jobs in one transaction (``bulk_enqueue``) to idle
workers and waits until all are done; its rate is jobs / (last finish - first start),
both by the database clock. In order:

1. ``fresh``: an emptied, vacuumed table, ``--small`` jobs;
2. ``backlog``: ``--big`` jobs at once (a million pending);
3. ``retention``: ``--small`` jobs again, with the ``--big`` finished rows kept (as the
   default retention keeps them) and no manual VACUUM: only autovacuum, with the
   settings the migrations give the table;
4. ``pinned``: a REPEATABLE READ transaction on another connection holds its snapshot
   (the xmin horizon) for ``--pin-seconds`` while drains of ``--small`` jobs follow
   one another; each one's rate is printed, then the last and the slowest against
   ``fresh``.

Worker RSS (the largest child's VmRSS) is sampled after the fresh drain (past 10,000
jobs) and after the backlog (past a million).

Database: ``DATABASE_URL``, else ``pgqueue_bench_scale`` on the embedded server; with
``--private-server``, a throw-away embedded server of its own (``shared_buffers=1GB``,
``max_wal_size=8GB`` unless ``--server-setting``), deleted at the end. Its jobs table
is emptied: use a database of its own.
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
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MANAGE = REPO / "testproject" / "manage.py"
TASK = "testproject.demo.tasks.add"


def private_server(settings: list[str]) -> Any:
    """Start a throw-away server of our own with ``settings`` (``name=value``)."""
    import psycopg

    from testkit.private_server import PrivateServer

    server = PrivateServer()
    with psycopg.connect(server.url(), autocommit=True) as conn:
        for item in settings:
            name, value = item.split("=", 1)
            conn.execute(
                psycopg.sql.SQL("ALTER SYSTEM SET {} = {}").format(
                    psycopg.sql.Identifier(name), psycopg.sql.Literal(value)
                )
            )
    server.restart()
    os.environ["DATABASE_URL"] = server.create_database("pgqueue_bench_scale")
    return server


def prepare() -> None:
    sys.path.insert(0, str(REPO))
    if not os.environ.get("DATABASE_URL"):
        from testproject.pgserver import embedded_server, ensure_database

        os.environ["DATABASE_URL"] = ensure_database(embedded_server(), "pgqueue_bench_scale")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def execute(query: str, params: Any = None) -> list[tuple[Any, ...]]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return cursor.fetchall() if cursor.description else []


def wait_until(condition: Callable[[], bool], timeout: float, interval: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit("benchmark timed out")
        time.sleep(interval)


def drain(count: int) -> float:
    """Enqueue ``count`` jobs at once to the idle workers; return jobs/s."""
    from django_pgqueue.models import Job

    (first,) = execute("SELECT coalesce(max(id), 0) + 1 FROM pgqueue_job")[0]
    Job.objects.bulk_enqueue({"task": TASK, "args": [i, i]} for i in range(count))
    (last,) = execute("SELECT max(id) FROM pgqueue_job")[0]
    span = {"first": first, "last": last}
    # Jobs of one priority are claimed in id order: wait for the last one with a cheap
    # primary-key read (a count over a million rows every few seconds would take a
    # good part of a core from the workers), then check that none is left behind.
    last_done = "SELECT status = 'done' FROM pgqueue_job WHERE id = %(last)s"
    unfinished = (
        "SELECT count(*) FROM pgqueue_job"
        " WHERE id BETWEEN %(first)s AND %(last)s AND status <> 'done'"
    )
    wait_until(lambda: execute(last_done, span)[0][0], 3600, 0.05)
    wait_until(lambda: execute(unfinished, span)[0][0] == 0, 600, 0.2)
    (seconds,) = execute(
        "SELECT extract(epoch FROM max(finished_at) - min(started_at)) FROM pgqueue_job"
        " WHERE id BETWEEN %(first)s AND %(last)s",
        span,
    )[0]
    return count / float(seconds)


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()]


def worker_rss_mb(supervisor: int) -> float:
    """The largest VmRSS among the supervisor's worker processes, in MB."""
    sizes = []
    for pid in children(supervisor):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                sizes.append(int(line.split()[1]) / 1024)
    return max(sizes)


def table_sizes() -> str:
    rows = execute(
        "SELECT pg_size_pretty(pg_table_size('pgqueue_job')),"
        " pg_size_pretty(pg_indexes_size('pgqueue_job')), n_dead_tup, n_live_tup"
        " FROM pg_stat_user_tables WHERE relname = 'pgqueue_job'"
    )
    heap, indexes, dead, live = rows[0]
    return f"table {heap}, indexes {indexes}, ~{live:,} live / ~{dead:,} dead tuples"


def pinned(args: argparse.Namespace, fresh: float) -> None:
    """Drains one after another while another connection holds a snapshot open."""
    import psycopg
    from django.db import connection

    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    holder = psycopg.connect(**params)
    try:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM pgqueue_job WHERE id < 0")  # the snapshot
        (xmin,) = holder.execute("SELECT backend_xmin FROM pg_stat_activity"
                                 " WHERE pid = pg_backend_pid()").fetchone()  # fmt: skip
        print(f"pinned: a REPEATABLE READ snapshot holds the xmin horizon at {xmin}")
        start = time.monotonic()
        rates: list[tuple[float, float]] = []
        while time.monotonic() - start < args.pin_seconds:
            rate = drain(args.small)
            rates.append((time.monotonic() - start, rate))
            print(f"  after {rates[-1][0]:6.1f}s: {rate:8,.0f} jobs/s", flush=True)
        print(f"  {table_sizes()}")
    finally:
        holder.rollback()
        holder.close()
    # Medians of the first and the last minute: one drain of a few seconds on a shared
    # machine is noisy, a trend over five minutes is not.
    window = min(60.0, args.pin_seconds / 3)
    first = statistics.median(r for t, r in rates if t <= window)
    last = statistics.median(r for t, r in rates if t >= rates[-1][0] - window)
    print(
        f"pinned for {args.pin_seconds:.0f}s, {len(rates) * args.small:,} jobs: median drain "
        f"{first:,.0f} jobs/s in the first {window:.0f}s, {last:,.0f} in the last "
        f"({last / first:.0%} of the first); the last = {last / fresh:.0%} of fresh, the "
        f"slowest drain {min(r for _, r in rates):,.0f} (target: >= 50% of fresh)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=20_000, help="(default: %(default)r)")
    parser.add_argument("--big", type=int, default=1_000_000, help="(default: %(default)r)")
    parser.add_argument("--pin-seconds", type=float, default=300.0, help="(default: %(default)r)")
    parser.add_argument("--processes", type=int, default=2, help="(default: %(default)r)")
    parser.add_argument("--concurrency", type=int, default=4, help="(default: %(default)r)")
    parser.add_argument("--batch-size", type=int, default=50, help="(default: %(default)r)")
    parser.add_argument(
        "--rescan-seconds",
        type=float,
        default=None,
        help="the workers' PGQUEUE_CLAIM_RESCAN_SECONDS (0: every claim from the head, as "
        "before claims resumed; default: the setting's)",
    )
    parser.add_argument(
        "--queue",
        action="append",
        default=None,
        help="run the workers with --queue (repeatable): their claims keep a position "
        "per queue (the jobs go to 'default'; default: workers of all queues)",
    )
    parser.add_argument(
        "--skip", default="", help="comma-separated scenarios to leave out (backlog,pinned)"
    )
    parser.add_argument(
        "--private-server",
        action="store_true",
        help="run on a throw-away embedded server of its own, with --server-setting",
    )
    parser.add_argument(
        "--server-setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting of the private server (repeatable; default: shared_buffers=1GB, "
        "max_wal_size=8GB)",
    )
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    server = None
    if args.private_server:
        sys.path.insert(0, str(REPO))
        server = private_server(args.server_setting or ["shared_buffers=1GB", "max_wal_size=8GB"])
    try:
        run(args, skip)
    finally:
        if server is not None:
            server.close()


def run(args: argparse.Namespace, skip: set[str]) -> None:
    prepare()
    from django.db import connection

    execute("TRUNCATE pgqueue_job, pgqueue_step")
    execute("VACUUM ANALYZE pgqueue_job")
    command = [
        sys.executable, str(MANAGE), "pgqueue_worker", "-v", "0",
        "--processes", str(args.processes), "--concurrency", str(args.concurrency),
        "--batch-size", str(args.batch_size), "--poll-interval", "1",
    ]  # fmt: skip
    for name in args.queue or ():
        command += ["--queue", name]
    env = {**os.environ}
    if args.rescan_seconds is not None:
        env["PGQUEUE_CLAIM_RESCAN_SECONDS"] = str(args.rescan_seconds)
    supervisor = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        time.sleep(3)  # Django start-up of the workers, not part of the measurement
        rescan = "" if args.rescan_seconds is None else f", rescan {args.rescan_seconds}s"
        if args.queue:
            rescan += f", --queue {' --queue '.join(args.queue)}"
        print(
            f"pgqueue scale benchmark: {args.processes} worker processes x "
            f"{args.concurrency} threads, batch {args.batch_size}{rescan}; PostgreSQL "
            f"{connection.pg_version // 10000}"
            f"{' (private server)' if args.private_server else ''}, {os.cpu_count()} cores"
        )
        drain(2000)  # warm-up: imports, prepared statements
        fresh = drain(args.small)
        print(f"fresh: {args.small:,} jobs at {fresh:,.0f} jobs/s")
        rss_small = worker_rss_mb(supervisor.pid)
        if "backlog" not in skip:
            backlog = drain(args.big)
            print(
                f"backlog: {args.big:,} pending at once at {backlog:,.0f} jobs/s = "
                f"{fresh / backlog:.2f}x slower than fresh (target: within 1.2x)"
            )
            rss_big = worker_rss_mb(supervisor.pid)
            print(
                f"worker RSS: {rss_small:.1f} MB after {args.small + 2000:,} jobs, "
                f"{rss_big:.1f} MB after {args.small + args.big + 2000:,}: "
                f"{rss_big - rss_small:+.1f} MB (target: within 20 MB)"
            )
            retention = drain(args.small)
            print(
                f"retention: {args.small:,} jobs beside {args.big:,} finished ones at "
                f"{retention:,.0f} jobs/s = {fresh / retention:.2f}x slower than fresh "
                f"(target: within 1.2x); {table_sizes()}"
            )
        if "pinned" not in skip:
            pinned(args, fresh)
    finally:
        supervisor.send_signal(signal.SIGTERM)
        supervisor.wait(60)


if __name__ == "__main__":
    main()
