"""Flow control benchmark: what limits cost a drain, and the claim at scale.

    python -m bench.flow [--jobs 20000] [--keys 1000] [--key-concurrency 2]
                         [--rounds 3] [--processes 2] [--concurrency 4] [--batch-size 50]
                         [--ref main] [--scale-keys 10000] [--scale-pending 1000000]
                         [--database-url URL] [--only drain,scale]
                         [--config quiet|stock]

Drains (interleaved rounds, each one's order rotated; medians printed): idle worker
processes (warmed up by a job each), then ``--jobs`` no-op jobs enqueued in one
transaction, with ``ANALYZE``; jobs / (last completion - commit), by the database
clock. The same jobs, four ways:

* ``main``: the workers of ``--ref`` (extracted with ``git archive`` into a temporary
  directory, run against this database: its schema has our columns and indexes too,
  which a job without a key never touches when claimed), jobs without a key;
* ``no limits``: this tree's workers, jobs without a key: the no-limit path;
* ``keys, no limits``: jobs spread over ``--keys`` concurrency keys, no limit in force
  (still today's claim; a keyed job's claim adds an entry to the running-key index);
* ``limits``: the same jobs under ``PGQUEUE_LIMITS = {"k:*": {"concurrency":
  --key-concurrency}}``: each key its own budget, the two-statement flow claim.

``--config``: ``quiet`` (``-v 0``, the test project's logging) or ``stock``, logging as
most projects have it (``bench/stock_settings.py``: a console handler on the root
logger at INFO; the workers at their default verbosity, their output in a file), as
``bench.compare`` runs them.

Scale: ``--scale-pending`` pending jobs spread over ``--scale-keys`` keys (1,000,000
over 10,000 by default), one limit of ``--key-concurrency`` per key; time per batch of
the flow claim (both statements and the transaction: what a worker waits for), median
over 200 claims of ``--batch-size`` whose jobs are completed between claims so that
the keys stay busy, beside the same at ``--keys`` keys and ``--jobs`` pending, the big
backlog again with each key's jobs in one block (the head of the line is a full key:
every claim walks the keys), and today's ``JOB_CLAIM`` on the big backlog (no limits)
for reference.

Database: ``pgqueue_bench_flow`` on ``127.0.0.1:5432`` unless ``--database-url`` (its
jobs table is truncated: use a database of its own).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.common import ensure_databases, setup_django, sql_one, wait_until

REPO = Path(__file__).resolve().parent.parent
TASK = "testproject.demo.tasks.add"
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/pgqueue_bench_flow"
KINDS = ("main", "no limits", "keys, no limits", "limits")


def unfinished() -> bool:
    return bool(
        sql_one(
            "SELECT EXISTS (SELECT 1 FROM pgqueue_job WHERE status = 'pending') "
            "OR EXISTS (SELECT 1 FROM pgqueue_job WHERE status = 'running')"
        )
    )


@contextmanager
def main_tree(ref: str) -> Iterator[Path]:
    """``ref``'s files (``git archive``) in a temporary directory."""
    where = Path(tempfile.mkdtemp(prefix="pgqueue-bench-flow-"))
    try:
        archive = subprocess.run(
            ["git", "archive", ref], cwd=REPO, check=True, capture_output=True
        ).stdout
        archive_path = where / "tree.tar"
        archive_path.write_bytes(archive)
        with tarfile.open(archive_path) as tar:
            tar.extractall(where / "tree", filter="data")
        yield where / "tree"
    finally:
        shutil.rmtree(where, ignore_errors=True)


@contextmanager
def workers(args: argparse.Namespace, tree: Path, env: dict[str, str]) -> Iterator[None]:
    """``--processes`` worker processes of ``tree``, each warmed up by a job."""
    from django_pgqueue.models import Job

    sql_one("TRUNCATE pgqueue_job, pgqueue_step")
    quiet = args.config == "quiet"
    command = [
        sys.executable, str(tree / "testproject" / "manage.py"), "pgqueue_worker",
        *(["-v", "0"] if quiet else []),
        "--concurrency", str(args.concurrency), "--batch-size", str(args.batch_size),
    ]  # fmt: skip
    full = {**os.environ, "PYTHONPATH": str(tree), "DATABASE_URL": args.database_url, **env}
    if not quiet:
        full["DJANGO_SETTINGS_MODULE"] = "bench.stock_settings"
    logs = tempfile.TemporaryFile() if not quiet else None  # what the workers print
    output = subprocess.DEVNULL if logs is None else logs
    procs = [
        subprocess.Popen(command, env=full, stdout=output, stderr=subprocess.STDOUT)
        for _ in range(args.processes)
    ]
    try:
        for _ in range(2 * args.processes):
            Job.objects.enqueue(TASK, [0, 0])
        wait_until(lambda: not unfinished(), 60, "the workers to start")
        yield
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        if logs is not None:
            logs.close()


def drain(args: argparse.Namespace, keyed: bool) -> float:
    from django.db import transaction

    from django_pgqueue.models import Job

    keys = args.keys
    with transaction.atomic():
        Job.objects.bulk_enqueue(
            (
                {"task": TASK, "args": [i, i], "concurrency_key": f"k:{i % keys}"}
                if keyed
                else {"task": TASK, "args": [i, i]}
            )
            for i in range(args.jobs)
        )
        sql_one("ANALYZE pgqueue_job")
    committed = sql_one("SELECT clock_timestamp()")
    wait_until(lambda: not unfinished(), 3600, "the drain")
    seconds = sql_one(
        "SELECT extract(epoch FROM max(finished_at) - %s::timestamptz) FROM pgqueue_job",
        [committed],
    )
    return args.jobs / float(seconds)


def drains(args: argparse.Namespace) -> None:
    import json

    limits = json.dumps({"k:*": {"concurrency": args.key_concurrency}})
    rates: dict[str, list[float]] = {kind: [] for kind in KINDS}
    with main_tree(args.ref) as main:
        setups: dict[str, tuple[Path, dict[str, str], bool]] = {
            "main": (main, {}, False),
            "no limits": (REPO, {}, False),
            "keys, no limits": (REPO, {}, True),
            "limits": (REPO, {"PGQUEUE_LIMITS": limits}, True),
        }
        for round_ in range(args.rounds):
            order = KINDS[round_ % len(KINDS) :] + KINDS[: round_ % len(KINDS)]
            for kind in order:
                tree, env, keyed = setups[kind]
                with workers(args, tree, env):
                    rates[kind].append(drain(args, keyed))
                print(f"  round {round_ + 1} {kind}: {rates[kind][-1]:,.0f} jobs/s", flush=True)
    median = {kind: statistics.median(values) for kind, values in rates.items()}
    print(
        f"\ndrain of {args.jobs:,} no-op jobs, {args.processes} processes x "
        f"{args.concurrency} threads, batch {args.batch_size}, {args.config} logging; "
        f"medians of {args.rounds}:"
    )
    for kind in KINDS:
        spread = ", ".join(f"{v:,.0f}" for v in rates[kind])
        print(f"  {kind:<17} {median[kind]:>9,.0f} jobs/s   ({spread})")
    print(
        f"  limits ({args.keys:,} keys, concurrency {args.key_concurrency} each) / no limits: "
        f"{median['limits'] / median['no limits']:.2f}x (target >= 0.7x)"
    )
    print(f"  no limits / main: {median['no limits'] / median['main']:.2f}x (target: same speed)")


def claim_times(
    args: argparse.Namespace, pending: int, keys: int, limited: bool, blocked: bool = False
) -> list[float]:
    """Seconds per flow claim of ``--batch-size`` with ``pending`` jobs over ``keys``:
    interleaved (job i has key i % keys), or ``blocked`` (each key's jobs one after
    another: the head of the line is one key, full at once, and the claim must walk)."""
    per_key = max(1, pending // keys)
    from django.db import connection, transaction

    from django_pgqueue import flow
    from django_pgqueue.models import Job
    from django_pgqueue.worker.connections import configure_claim_session

    sql_one("TRUNCATE pgqueue_job, pgqueue_step")
    step = 100_000
    for start in range(0, pending, step):
        with transaction.atomic():
            Job.objects.bulk_enqueue(
                {
                    "task": TASK,
                    "args": [i, i],
                    "concurrency_key": f"k:{i // per_key if blocked else i % keys}",
                }
                for i in range(start, min(pending, start + step))
            )
    sql_one("VACUUM ANALYZE pgqueue_job")
    connection.close()
    connection.ensure_connection()
    configure_claim_session("default")  # as a worker's claim connection
    spec = {"k:*": {"concurrency": args.key_concurrency}}
    view = flow.FlowView(limits=tuple(flow.parse_limit(k, v) for k, v in spec.items()))
    cursors: dict[str, str] = {}
    walk = False  # as a worker: a claim that walked the keys makes the next start so
    times = []
    for _ in range(200):
        started = time.perf_counter()
        if limited:
            claimed = Job.objects.claim_flow(
                "bench", limit=args.batch_size, view=view, cursors=cursors, walk=walk
            )
            jobs, cursors, walk = claimed.jobs, claimed.cursors, claimed.walked
        else:
            jobs = Job.objects.claim("bench", limit=args.batch_size)
        times.append(time.perf_counter() - started)
        if jobs:
            Job.objects.complete_many([(job, None) for job in jobs], "bench")
    return times


def scale(args: argparse.Namespace) -> None:
    ms = lambda values: statistics.median(values) * 1000  # noqa: E731
    small = claim_times(args, args.jobs, args.keys, limited=True)
    big = claim_times(args, args.scale_pending, args.scale_keys, limited=True)
    walked = claim_times(args, args.scale_pending, args.scale_keys, limited=True, blocked=True)
    plain = claim_times(args, args.scale_pending, args.scale_keys, limited=False)
    print(
        f"\nflow claim of {args.batch_size} under a limit of {args.key_concurrency} per key, "
        "ms per batch (median of 200; p90):"
    )
    for label, values in (
        (f"{args.jobs:,} pending over {args.keys:,} keys", small),
        (f"{args.scale_pending:,} pending over {args.scale_keys:,} keys", big),
        ("the same, each key's jobs in a block (walked)", walked),
        (f"today's JOB_CLAIM, {args.scale_pending:,} pending, no limits", plain),
    ):
        p90 = sorted(values)[int(len(values) * 0.9)] * 1000
        print(f"  {label:<50} {ms(values):6.2f} ms   (p90 {p90:.2f} ms)")
    print(
        f"  big / small: {ms(big) / ms(small):.2f}x, walked / small: "
        f"{ms(walked) / ms(small):.2f}x (target: flat)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000, help="(default: %(default)r)")
    parser.add_argument("--keys", type=int, default=1000, help="(default: %(default)r)")
    parser.add_argument("--key-concurrency", type=int, default=2, help="(default: %(default)r)")
    parser.add_argument("--rounds", type=int, default=3, help="(default: %(default)r)")
    parser.add_argument("--processes", type=int, default=2, help="(default: %(default)r)")
    parser.add_argument("--concurrency", type=int, default=4, help="(default: %(default)r)")
    parser.add_argument("--batch-size", type=int, default=50, help="(default: %(default)r)")
    parser.add_argument("--ref", default="main", help="(default: %(default)r)")
    parser.add_argument("--scale-keys", type=int, default=10_000, help="(default: %(default)r)")
    parser.add_argument(
        "--scale-pending", type=int, default=1_000_000, help="(default: %(default)r)"
    )
    parser.add_argument("--database-url", default=DEFAULT_URL, help="(default: %(default)r)")
    parser.add_argument("--only", default="drain,scale", help="(default: %(default)r)")
    parser.add_argument(
        "--config", choices=("quiet", "stock"), default="quiet", help="(default: %(default)r)"
    )
    args = parser.parse_args()
    ensure_databases(args.database_url, "_second")
    setup_django(args.database_url)
    only = set(args.only.split(","))
    print(
        f"PostgreSQL {sql_one('SHOW server_version')}, {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.1f} at the start",
        flush=True,
    )
    if "drain" in only:
        drains(args)
    if "scale" in only:
        scale(args)


if __name__ == "__main__":
    main()
