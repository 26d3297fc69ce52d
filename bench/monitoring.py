"""Monitoring on a big table: what ``pgqueue_status``, the admin dashboard and a
Prometheus scrape cost on 10,000,000 jobs.

    python -m bench.monitoring [--rows 10000000] [--repeat 5] [--refill]
    make bench NAME=monitoring

The jobs live in a database of the bench's own, ``pgqueue_bench_monitoring``: on the
server of ``DATABASE_URL`` when it is set, else on the embedded server. It is filled
once with ``INSERT ... SELECT FROM generate_series`` (secondary indexes dropped during
the load and rebuilt after, as ``pg_dump`` would) and reused by later runs of the same
size. The shape: 95 % done (600,000 of them in the last hour, 10,000 a minute, so the
charts' per-minute sample is capped and scaled), 2 % dead, 1 % pending in four queues,
0.4 % scheduled, 0.1 % running, the rest done long ago; two registered workers.

Each surface is measured ``--repeat`` times, interleaved (status, dashboard, scrape,
status, ...), and reported as median, min and max wall time with its number of SQL
statements; then every monitoring statement's own ``EXPLAIN ANALYZE`` time and buffers,
which show that none of them reads the table.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

REPO = Path(__file__).resolve().parent.parent
BENCH_DB = "pgqueue_bench_monitoring"
TOKEN = "bench-token"

FILL = """
INSERT INTO pgqueue_job (
    backend, queue, task, args, kwargs, priority, status, attempts, max_attempts,
    run_at, lease_owner, lease_expires_at, errors, result,
    created_at, started_at, last_attempted_at, finished_at
)
SELECT 'default',
       (ARRAY['default', 'mail', 'billing', 'reports'])[1 + i %% 4],
       'bench.tasks.task_' || (i %% 8),
       jsonb_build_array(i),
       '{}'::jsonb,
       (i %% 3) * 10,
       s.status,
       CASE WHEN s.status IN ('done', 'running') THEN 1
            WHEN s.status = 'dead' THEN 5 ELSE 0 END,
       5,
       t.at - make_interval(secs => (i %% 7) * 0.5)
           + CASE WHEN s.status = 'scheduled' THEN interval '1 day' ELSE interval '0' END,
       CASE WHEN s.status IN ('running', 'dead') THEN 'bench-host:' || (i %% 2) || ':a1' END,
       CASE WHEN s.status = 'running' THEN clock_timestamp() + interval '5 minutes' END,
       '[]'::jsonb,
       CASE WHEN s.status = 'done' THEN to_jsonb(i) END,
       t.at - interval '4 seconds',
       CASE WHEN s.status IN ('done', 'dead', 'running') THEN t.at END,
       CASE WHEN s.status IN ('done', 'dead', 'running') THEN t.at END,
       CASE WHEN s.status IN ('done', 'dead') THEN t.at + interval '0.2 seconds' END
FROM generate_series(%(first)s, %(last)s) AS i,
     LATERAL (SELECT CASE WHEN i %% 1000 < 950 THEN 'done'
                          WHEN i %% 1000 < 970 THEN 'dead'
                          WHEN i %% 1000 < 980 THEN 'pending'
                          WHEN i %% 1000 < 984 THEN 'scheduled'
                          WHEN i %% 1000 < 985 THEN 'running'
                          ELSE 'done' END AS status) AS s,
     -- The newest 600,000 jobs in the last hour (one every 6 ms), the rest over a week.
     LATERAL (SELECT %(now)s::timestamptz - CASE
                 WHEN i > %(rows)s - 600000
                 THEN make_interval(secs => (%(rows)s - i) * 0.006)
                 ELSE make_interval(secs => 3600 + (%(rows)s - 600000 - i) * %(step)s)
              END AS at) AS t
"""


def configure() -> None:
    """Point the test project at the bench's own database before Django starts."""
    import psycopg

    url = os.environ.get("DATABASE_URL")
    if url:
        parts = urlsplit(url)
        with psycopg.connect(url, autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [BENCH_DB])
            if exists.fetchone() is None:
                conn.execute(f'CREATE DATABASE "{BENCH_DB}"')  # our constant
        os.environ["DATABASE_URL"] = urlunsplit(parts._replace(path=f"/{BENCH_DB}"))
    else:
        from testproject.pgserver import embedded_server, ensure_database

        os.environ["DATABASE_URL"] = ensure_database(embedded_server(), BENCH_DB)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    sys.path.insert(0, str(REPO))
    import django

    django.setup()


def fill(rows: int, refill: bool) -> None:
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        assert connection.settings_dict["NAME"] == BENCH_DB
        cursor.execute("SELECT reltuples::bigint FROM pg_class WHERE relname = 'pgqueue_job'")
        (estimate,) = cursor.fetchone()
        if not refill and abs(estimate - rows) <= rows * 0.01 and rows > 0:
            print(f"reusing about {estimate:,} rows (--refill to rebuild)")
        else:
            started = time.perf_counter()
            cursor.execute(
                "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'pgqueue_job'"
                " AND indexname <> 'pgqueue_job_pkey'"
            )
            indexes = cursor.fetchall()
            cursor.execute("TRUNCATE pgqueue_job, pgqueue_step RESTART IDENTITY")
            for name, _ in indexes:
                cursor.execute(f'DROP INDEX "{name}"')  # names read from the catalog
            cursor.execute("SELECT clock_timestamp()")
            (now,) = cursor.fetchone()
            step = 7 * 86400 / max(1, rows)
            chunk = 1_000_000
            for first in range(1, rows + 1, chunk):
                last = min(rows, first + chunk - 1)
                cursor.execute(
                    FILL, {"first": first, "last": last, "rows": rows, "now": now, "step": step}
                )
                print(f"  {last:,} rows ({time.perf_counter() - started:.0f} s)", flush=True)
            for name, definition in indexes:
                cursor.execute(definition)
                print(f"  rebuilt {name} ({time.perf_counter() - started:.0f} s)", flush=True)
            print(f"filled {rows:,} rows in {time.perf_counter() - started:.1f} s")
        started = time.perf_counter()
        cursor.execute("VACUUM ANALYZE pgqueue_job")
        print(f"VACUUM ANALYZE in {time.perf_counter() - started:.1f} s")
        cursor.execute("SELECT pg_size_pretty(pg_total_relation_size('pgqueue_job'))")
        print(f"table + indexes: {cursor.fetchone()[0]}")
        cursor.execute("TRUNCATE pgqueue_worker")
    from django_pgqueue.worker import presence

    for worker_id, queues in (("bench-host:0:a1", None), ("bench-host:1:a1", ["mail"])):
        presence.register("default", worker_id, queues=queues, concurrency=8, lease_seconds=300)
    presence._registered.clear()  # rows stay; nothing here beats for them


def surfaces() -> dict[str, Callable[[], Any]]:
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.test import Client, override_settings

    user_model = get_user_model()
    user = user_model.objects.filter(username="bench").first()
    if user is None:
        user = user_model.objects.create_superuser("bench", "bench@example.com", "bench-pw")
    admin = Client()
    admin.force_login(user)
    scraper = Client()

    def status() -> None:
        out = io.StringIO()
        call_command("pgqueue_status", "--json", stdout=out)
        assert out.getvalue().startswith("{")

    def dashboard() -> None:
        response = admin.get("/admin/django_pgqueue/dashboard/")
        assert response.status_code == 200, response.status_code

    def scrape() -> None:
        with override_settings(PGQUEUE_METRICS_TOKEN=TOKEN):
            response = scraper.get("/metrics/pgqueue", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
        assert response.status_code == 200, response.status_code

    return {
        "pgqueue_status --json": status,
        "admin dashboard": dashboard,
        "metrics scrape": scrape,
    }


def measure(repeat: int) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    timings: dict[str, list[float]] = {}
    queries: dict[str, int] = {}
    runs = surfaces()
    for fn in runs.values():
        fn()  # warm: imports, templates, connection
    for _ in range(repeat):
        for name, fn in runs.items():
            with CaptureQueriesContext(connection) as captured:
                started = time.perf_counter()
                fn()
                timings.setdefault(name, []).append(time.perf_counter() - started)
            queries[name] = len(captured)
    print()
    print(f"{'surface':<24}{'median':>10}{'min':>10}{'max':>10}{'statements':>12}")
    for name, values in timings.items():
        print(
            f"{name:<24}{statistics.median(values) * 1000:>8.1f}ms"
            f"{min(values) * 1000:>8.1f}ms{max(values) * 1000:>8.1f}ms{queries[name]:>12}"
        )


def explain_statements() -> None:
    import json

    from django.db import connection

    from django_pgqueue import monitoring, sql

    statements = {
        "JOB_COUNT_SAMPLE_BY_QUEUE": {"cap": monitoring.DEFAULT_CAP},
        "JOB_GET_QUEUE_BACKLOG": {"cap": monitoring.DEFAULT_CAP, "queues": monitoring.MAX_QUEUES},
        "JOB_SAMPLE_FINISHED": {
            "cap": monitoring.DEFAULT_CAP,
            "window_seconds": monitoring.RECENT_SECONDS,
            "now": None,
        },
        "JOB_GET_HISTORY": {
            "cap": 2000,
            "count_cap": monitoring.HISTORY_COUNT_CAP,
            "minutes": 60,
            "now": None,
        },
        "JOB_GET_COLUMN_STATS": {"column": "status"},
        "WORKER_GET_ALL": {"now": None, "limit": monitoring.MAX_WORKERS},
    }
    print()
    print(f"{'statement':<28}{'time':>10}{'buffers':>10}{'seq scan of pgqueue_job':>26}")
    with connection.cursor() as cursor:
        for name, params in statements.items():
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + getattr(sql, name), params)
            (plan,) = cursor.fetchone()
            if isinstance(plan, str):
                plan = json.loads(plan)
            top = plan[0]
            buffers = top["Plan"].get("Shared Hit Blocks", 0) + top["Plan"].get(
                "Shared Read Blocks", 0
            )
            print(
                f"{name:<28}{top['Execution Time']:>8.1f}ms{buffers:>10}"
                f"{'yes' if seq_scans(top['Plan']) else 'no':>26}"
            )


def seq_scans(node: dict[str, Any]) -> bool:
    """Whether a plan node, or one below it, reads the whole jobs table."""
    if node.get("Node Type") == "Seq Scan" and node.get("Relation Name") == "pgqueue_job":
        return True
    return any(seq_scans(child) for child in node.get("Plans", ()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--refill", action="store_true")
    args = parser.parse_args()
    configure()
    fill(args.rows, args.refill)
    measure(args.repeat)
    explain_statements()
    print("\n(2 shared cores; other work ran on this machine: compare within one run.)")


if __name__ == "__main__":
    main()
