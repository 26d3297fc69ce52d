"""A steady stream: a producer holds a backlog while a worker runs jobs of a few ms.

    python -m bench.steady [--duration 60] [--warmup 15] [--depth 4000] [--work-ms 1]
                           [--payload 256] [--concurrency 16] [--async-concurrency N]
                           [--processes 1] [--batch-size B] [--rounds 1]
                           [--limits off|on|both] [--keys 1000] [--key-concurrency 2]
                           [--database-url URL]
    make bench NAME=steady ARGS='--rounds 3'

What a site in production looks like, unlike ``bench.compare``'s drain of a backlog
enqueued beforehand: a **producer** process holds ``--depth`` jobs pending (every
~10 ms it reads the depth and enqueues what is missing, at most ``--producer-batch``
(128) jobs, with ``enqueue_many``: one transaction, one NOTIFY; so at most 12,800 jobs
a second, fewer as its ticks run late, and the bench warns when the depth it held
fell under half the target: the pace was the producer's, raise ``--producer-batch``),
each job carrying a ``--payload``-byte string; one ``manage.py pgqueue_worker -v 0``
(``--processes``, ``--concurrency`` threads, ``--batch-size``) runs them:
``testproject.demo.tasks.work`` (``time.sleep(--work-ms)``), or with
``--async-concurrency N`` the coroutine ``testproject.demo.tasks.await_work`` (``await
asyncio.sleep(--work-ms)``) on the worker's event loop of N in flight. After
``--warmup`` seconds, for ``--duration`` seconds:

* completed jobs/s: jobs whose ``finished_at`` falls in the window, by the database
  clock; enqueued jobs/s: the ids the producer used in the window;
* the depth: pending jobs, counted once a second (median);
* enqueue -> start (``started_at - created_at``, both written by the database): once
  a second, p50/p95/p99 of the jobs started in the second before the last (so that
  their claims have committed); the medians of those samples;
* CPU per job (µs): user + system time from ``/proc/<pid>/stat`` of the worker (its
  whole process tree), of the producer, and of their PostgreSQL backends (the
  database's client backends but the bench's own, sampled at the window's start).

``--limits on``: every job keyed ``k:<i % --keys>`` under ``PGQUEUE_LIMITS = {"k:*":
{"concurrency": --key-concurrency}}`` (1,000 keys of 2 by default: a budget each, the
flow claim); ``both``: each round runs without and with limits, in turn first, and
the ratio is printed (the target: limits >= 0.7x).

Each figure is the median of ``--rounds`` rounds (a fresh worker and producer each,
the table truncated). Database: ``pgqueue_bench_steady`` on ``127.0.0.1:5432`` unless
``--database-url`` (its jobs table is truncated: use a database of its own).
"""

from __future__ import annotations

import argparse
import json
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

from bench.common import (
    backend_pids,
    cpu_seconds,
    ensure_databases,
    process_tree,
    setup_django,
    sql_one,
)

REPO = Path(__file__).resolve().parent.parent
MANAGE = REPO / "testproject" / "manage.py"
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/pgqueue_bench_steady"
THREAD_TASK = "testproject.demo.tasks.work"
ASYNC_TASK = "testproject.demo.tasks.await_work"
#: The producer's tick: it tops the backlog up this often.
TICK = 0.010

#: The newest id and the pending head: the backlog's depth in two index probes (jobs
#: are claimed nearly in id order here, all of priority 0), cheap enough to run every
#: tick where a count(*) of the pending index would cost PostgreSQL more than the
#: claims it measures. The head is looked for from the last one seen (it never moves
#: back: no job here goes back to pending), so that the probe does not walk the dead
#: entries of the jobs claimed since vacuum last ran (an empty queue's whole index).
DEPTH = """
SELECT (SELECT coalesce(max(id), 0) FROM pgqueue_job),
       (SELECT id FROM pgqueue_job
        WHERE status = 'pending' AND priority = 0 AND id >= %(head)s
        ORDER BY priority DESC, id LIMIT 1)
"""
#: Once a second: the database clock, the pending count, and the pending head.
SAMPLE = """
SELECT clock_timestamp(),
       (SELECT count(*) FROM pgqueue_job WHERE status = 'pending'),
       coalesce((SELECT id FROM pgqueue_job WHERE status = 'pending'
                 ORDER BY priority DESC, id LIMIT 1), (SELECT max(id) + 1 FROM pgqueue_job), 0)
"""
#: Enqueue -> start of the jobs started in (since, until]: every one of them was still
#: pending at ``since``, so its id is at least the pending head then (``head``).
LATENCY = """
SELECT count(*), percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (
    ORDER BY extract(epoch FROM started_at - created_at))
FROM pgqueue_job
WHERE id >= %(head)s AND started_at > %(since)s AND started_at <= %(until)s
"""


# --- the producer (a process of its own: python -m bench.steady --producer JSON) -------


def produce(config: dict[str, Any]) -> None:
    """Hold ``depth`` jobs pending until SIGTERM; print the backend's pid first."""
    from django.db import connection

    from django_pgqueue.bulk import enqueue_many

    task = _task(config["task"])
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    print(json.dumps({"backend": sql_one("SELECT pg_backend_pid()")}), flush=True)
    args = [config["work_ms"] / 1000]
    kwargs = {"payload": "x" * config["payload"]}
    keys, sequence, head = config["keys"], 0, 0
    next_tick = time.monotonic()
    while not stopping:
        with connection.cursor() as cursor:
            cursor.execute(DEPTH, {"head": head})
            newest, first = cursor.fetchone()
        head = newest + 1 if first is None else first
        depth = newest + 1 - head
        missing = min(config["batch"], config["depth"] - depth)
        if missing > 0:
            if keys:
                calls = [
                    (args, kwargs, {"concurrency_key": f"k:{(sequence + i) % keys}"})
                    for i in range(missing)
                ]
            else:
                calls = [(args, kwargs)] * missing
            enqueue_many(task, calls)
            sequence += missing
        next_tick += TICK
        pause = next_tick - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        else:
            next_tick = time.monotonic()


def _task(path: str) -> Any:
    from django.utils.module_loading import import_string

    return import_string(path)


# --- one round ------------------------------------------------------------------------


@contextmanager
def running(args: argparse.Namespace, limited: bool) -> Iterator[tuple[Any, Any, int]]:
    """The worker and the producer of one round: (worker, producer, producer's backend)."""
    sql_one("TRUNCATE pgqueue_job, pgqueue_step")
    env = {**os.environ, "PYTHONPATH": str(REPO), "DATABASE_URL": args.database_url}
    env.pop("PGQUEUE_LIMITS", None)
    if limited:
        env["PGQUEUE_LIMITS"] = json.dumps({"k:*": {"concurrency": args.key_concurrency}})
    command = [
        sys.executable, str(MANAGE), "pgqueue_worker", "-v", "0",
        "--worker-id", "bench-steady", "--concurrency", str(args.concurrency),
        "--processes", str(args.processes),
    ]  # fmt: skip
    if args.async_concurrency:
        command += ["--async-concurrency", str(args.async_concurrency)]
    if args.batch_size:
        command += ["--batch-size", str(args.batch_size)]
    worker = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)
    config = {
        "task": ASYNC_TASK if args.async_concurrency else THREAD_TASK,
        "work_ms": args.work_ms,
        "payload": args.payload,
        "depth": args.depth,
        "batch": args.producer_batch,
        "keys": args.keys if limited else 0,
    }
    producer = subprocess.Popen(
        [sys.executable, "-m", "bench.steady", "--producer", json.dumps(config)],
        env=env,
        stdout=subprocess.PIPE,
        cwd=REPO,
    )
    try:
        assert producer.stdout is not None
        line = producer.stdout.readline()
        if not line:
            raise SystemExit("the producer did not start")
        yield worker, producer, json.loads(line)["backend"]
    finally:
        for proc in (producer, worker):
            proc.send_signal(signal.SIGTERM)
        for proc in (producer, worker):
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        if producer.stdout is not None:
            producer.stdout.close()


def one_round(args: argparse.Namespace, limited: bool) -> dict[str, float]:
    with running(args, limited) as (worker, producer, producer_backend):
        time.sleep(args.warmup)
        for proc in (worker, producer):
            if proc.poll() is not None:
                raise SystemExit(f"a bench process exited with {proc.returncode}")
        workers = process_tree(worker.pid)
        backends = backend_pids(exclude=[producer_backend])

        def cpu() -> tuple[float, float, float, float]:
            return (
                sum(map(cpu_seconds, workers)),
                cpu_seconds(producer.pid),
                sum(map(cpu_seconds, backends)),
                cpu_seconds(producer_backend),
            )

        before = cpu()
        t0 = sql_one("SELECT clock_timestamp()")
        id0 = sql_one("SELECT coalesce(max(id), 0) FROM pgqueue_job")
        samples: list[tuple[Any, int, int]] = []  # (clock, pending, head)
        latencies: list[tuple[float, float, float]] = []
        end = time.monotonic() + args.duration
        next_sample = time.monotonic()
        while time.monotonic() < end:
            with_sample = _sample()
            samples.append(with_sample)
            if len(samples) >= 3:
                (since, _, head), (until, _, _) = samples[-3], samples[-2]
                count, p = _latency(head, since, until)
                if count and p is not None:
                    latencies.append((p[0], p[1], p[2]))
            next_sample += 1.0
            time.sleep(max(0.0, min(next_sample, end) - time.monotonic()))
        after = cpu()
        t1 = sql_one("SELECT clock_timestamp()")
        id1 = sql_one("SELECT coalesce(max(id), 0) FROM pgqueue_job")
        if worker.poll() is not None:
            raise SystemExit(f"the worker exited with {worker.returncode}")
    seconds = float(sql_one("SELECT extract(epoch FROM %s::timestamptz - %s)", [t1, t0]))
    done = sql_one(
        "SELECT count(*) FROM pgqueue_job WHERE status = 'done' "
        "AND finished_at > %s AND finished_at <= %s",
        [t0, t1],
    )
    if not done:
        raise SystemExit("no job completed in the window")
    used = [(a - b) / done * 1e6 for a, b in zip(after, before, strict=True)]
    figures = {
        "completed/s": done / seconds,
        "enqueued/s": (id1 - id0) / seconds,
        "depth": statistics.median(pending for _, pending, _ in samples),
        "p50 ms": _median_of(latencies, 0) * 1000,
        "p95 ms": _median_of(latencies, 1) * 1000,
        "p99 ms": _median_of(latencies, 2) * 1000,
        "cpu worker µs": used[0],
        "cpu producer µs": used[1],
        "cpu pg worker µs": used[2],
        "cpu pg producer µs": used[3],
    }
    figures["cpu total µs"] = sum(used)
    return figures


def _sample() -> tuple[Any, int, int]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(SAMPLE)
        row = cursor.fetchone()
    return row[0], row[1], row[2]


def _latency(head: int, since: Any, until: Any) -> tuple[int, Any]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(LATENCY, {"head": head, "since": since, "until": until})
        row = cursor.fetchone()
    return row[0], row[1]


def _median_of(rows: list[tuple[float, float, float]], index: int) -> float:
    return statistics.median(row[index] for row in rows) if rows else float("nan")


# --- the run ----------------------------------------------------------------------------

#: The figures in the order printed, with their format.
FIGURES = [
    ("completed/s", ",.0f"),
    ("enqueued/s", ",.0f"),
    ("depth", ",.0f"),
    ("p50 ms", ",.0f"),
    ("p95 ms", ",.0f"),
    ("p99 ms", ",.0f"),
    ("cpu worker µs", ",.0f"),
    ("cpu producer µs", ",.0f"),
    ("cpu pg worker µs", ",.0f"),
    ("cpu pg producer µs", ",.0f"),
    ("cpu total µs", ",.0f"),
]


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--producer":
        setup_django()
        produce(json.loads(sys.argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_URL))
    add("--duration", type=float, default=60.0, help="seconds measured (default: %(default)r)")
    add("--warmup", type=float, default=15.0, help="seconds before (default: %(default)r)")
    add("--depth", type=int, default=4000, help="pending jobs held (default: %(default)r)")
    add("--work-ms", type=float, default=1.0, help="each job's sleep (default: %(default)r)")
    add("--payload", type=int, default=256, help="bytes of each job's kwarg (default: 256)")
    add("--concurrency", type=int, default=16, help="worker threads (default: %(default)r)")
    add("--async-concurrency", type=int, default=0, help="coroutine jobs in flight instead")
    add("--processes", type=int, default=1, help="worker processes (default: %(default)r)")
    add("--batch-size", type=int, default=0, help="the worker's (default: its own default)")
    add("--producer-batch", type=int, default=128, help="most jobs a tick (default: 128)")
    add("--rounds", type=int, default=1, help="median of (default: %(default)r)")
    add("--limits", choices=("off", "on", "both"), default="off")
    add("--keys", type=int, default=1000, help="concurrency keys with limits (default: 1000)")
    add("--key-concurrency", type=int, default=2, help="each key's limit (default: 2)")
    args = parser.parse_args()
    ensure_databases(args.database_url, "_second")
    setup_django(args.database_url)
    kinds = {"off": [False], "on": [True], "both": [False, True]}[args.limits]
    results: dict[bool, list[dict[str, float]]] = {kind: [] for kind in kinds}
    for r in range(args.rounds):
        order = kinds[r % len(kinds) :] + kinds[: r % len(kinds)]
        for limited in order:
            figures = one_round(args, limited)
            results[limited].append(figures)
            print(
                f"round {r + 1}/{args.rounds}{' limits' if limited else ''}: "
                + ", ".join(f"{name} {figures[name]:{fmt}}" for name, fmt in FIGURES),
                flush=True,
            )
    mode = (
        f"--async-concurrency {args.async_concurrency} (coroutines)"
        if args.async_concurrency
        else f"--concurrency {args.concurrency} (threads)"
    )
    load = os.getloadavg()
    print(
        f"\nsteady: {args.processes} process(es), {mode}, batch size "
        f"{args.batch_size or 'default'}; jobs of {args.work_ms:g} ms, {args.payload} B "
        f"payload, depth {args.depth:,}; {args.duration:g} s after {args.warmup:g} s warm-up; "
        f"medians of {args.rounds} round(s); {os.cpu_count()} cores, load average "
        f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f}"
    )
    print("| figure | " + " | ".join("limits" if k else "no limits" for k in kinds) + " |")
    print("|---|" + "---|" * len(kinds))
    for name, fmt in FIGURES:
        cells = []
        for kind in kinds:
            values = [figures[name] for figures in results[kind]]
            spread = ", ".join(format(v, fmt) for v in values) if len(values) > 1 else ""
            cells.append(
                format(statistics.median(values), fmt) + (f" ({spread})" if spread else "")
            )
        print(f"| {name} | " + " | ".join(cells) + " |")
    for kind in kinds:
        depth = statistics.median(f["depth"] for f in results[kind])
        if depth < args.depth / 2:
            # The producer, not the worker, set the pace: its --producer-batch per tick
            # (at most 100 ticks a second) fell behind the worker.
            print(
                f"warning: the depth held was {depth:,.0f} of {args.depth:,}: the producer "
                "did not keep up, so completed/s is its pace, not the worker's; raise "
                "--producer-batch"
            )
    if len(kinds) == 2:
        ratio = statistics.median(f["completed/s"] for f in results[True]) / statistics.median(
            f["completed/s"] for f in results[False]
        )
        print(f"limits / no limits, completed jobs/s: {ratio:.2f}x (target >= 0.7x)")


if __name__ == "__main__":
    main()
