"""Admin page benchmark: the Job and dead-letter list pages on a 1,000,000-row table.

    python -m bench.admin_page [--rows 1000000] [--repeat 15] [--refill]
    make bench NAME=admin_page

Fills ``pgqueue_job`` with ``--rows`` jobs in one ``INSERT ... SELECT ... FROM
generate_series()`` (96 % done, 2 % dead, 1.5 % pending, 0.4 % scheduled, 0.1 %
running of which a tenth hold an expired lease; four queues, eight tasks), runs
``VACUUM ANALYZE`` (what autovacuum does on its own), then times each admin page
through Django's test ``Client`` as a logged-in superuser (median and best of
``--repeat`` after one warm-up). For every page it captures the SQL the page ran and
``EXPLAIN (ANALYZE, BUFFERS)`` each query on ``pgqueue_job``, printing the rows each
one read and flagging any unbounded ``COUNT(*)``, any sequential scan and any sort that
reads more than a page of rows.

Last, it builds the partial index the report proposes for dead letters
(``(id) WHERE status = 'dead'``) in the bench database only, measures the dead-letter
pages again, and drops it.

The database: with no ``DATABASE_URL``, database ``pgqueue_bench_admin`` on the
embedded server (created and migrated here; the shared test databases are never
touched). With ``DATABASE_URL``, that database; its ``pgqueue_job`` table is filled
only if empty, unless ``--refill`` is given (which truncates it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

BENCH_DB = "pgqueue_bench_admin"

FILL = """
INSERT INTO pgqueue_job (
    backend, queue, task, args, kwargs, priority, status, attempts, max_attempts,
    run_at, lease_owner, lease_expires_at, idempotency_key, errors, result,
    created_at, started_at, last_attempted_at, finished_at
)
SELECT 'default',
       (ARRAY['default', 'default', 'mail', 'billing', 'reports'])[1 + i %% 5],
       'bench.tasks.task_' || (i %% 8),
       jsonb_build_array(i, 'customer-' || (i %% 997)),
       jsonb_build_object('reason', 'bench'),
       (i %% 3) * 10,
       s.status,
       CASE WHEN s.status IN ('done', 'running') THEN 1
            WHEN s.status = 'dead' THEN 5 ELSE 0 END,
       5,
       t.created + CASE WHEN s.status = 'scheduled' THEN interval '1 day' ELSE interval '0' END,
       CASE WHEN s.status IN ('running', 'dead') THEN 'bench-host:' || (i %% 7) || ':a1' END,
       CASE WHEN s.status = 'running'
            THEN clock_timestamp() + CASE WHEN i %% 10 = 0 THEN interval '-5 minutes'
                                          ELSE interval '5 minutes' END END,
       CASE WHEN i %% 4 = 0 THEN 'key-' || i END,
       CASE WHEN s.status = 'dead' THEN jsonb_build_array(jsonb_build_object(
                'exception_class_path', 'builtins.ValueError',
                'traceback', E'Traceback (most recent call last):\\n  File "t.py", line 1\\n'
                             || 'ValueError: bench failure ' || i,
                'worker_id', 'bench-host:1:a1', 'attempt', 5))
            ELSE '[]'::jsonb END,
       CASE WHEN s.status = 'done' THEN to_jsonb(i) END,
       t.created,
       CASE WHEN s.status IN ('done', 'dead', 'running') THEN t.created END,
       CASE WHEN s.status IN ('done', 'dead', 'running') THEN t.created END,
       CASE WHEN s.status IN ('done', 'dead') THEN t.created + interval '2 seconds' END
FROM generate_series(1, %(rows)s) AS i,
     LATERAL (SELECT CASE WHEN i %% 1000 < 960 THEN 'done'
                          WHEN i %% 1000 < 980 THEN 'dead'
                          WHEN i %% 1000 < 995 THEN 'pending'
                          WHEN i %% 1000 < 999 THEN 'scheduled'
                          ELSE 'running' END AS status) AS s,
     LATERAL (SELECT clock_timestamp() - make_interval(secs => %(rows)s - i) AS created) AS t
"""

DROP_DEAD_INDEX = "DROP INDEX pgqueue_job_dead_idx"


def configure() -> None:
    """Point the test project at the bench database before Django starts."""
    if not os.environ.get("DATABASE_URL"):
        from testproject.pgserver import embedded_server, ensure_database

        os.environ["DATABASE_URL"] = ensure_database(embedded_server(), BENCH_DB)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    os.environ.setdefault("PGQUEUE_LOG_LEVEL", "WARNING")
    import django

    django.setup()


def fill(rows: int, refill: bool) -> None:
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pgqueue_job")
        (have,) = cursor.fetchone()
        if have == rows and not refill:
            print(f"reusing {have:,} rows")
        else:
            ours = connection.settings_dict["NAME"] == BENCH_DB
            if have and not refill and not ours:
                raise SystemExit(f"pgqueue_job holds {have:,} rows; --refill replaces them")
            started = time.perf_counter()
            cursor.execute("TRUNCATE pgqueue_job, pgqueue_step RESTART IDENTITY")
            cursor.execute(FILL, {"rows": rows})
            print(f"filled {rows:,} rows in {time.perf_counter() - started:.1f} s")
        started = time.perf_counter()
        cursor.execute("VACUUM ANALYZE pgqueue_job")
        print(f"VACUUM ANALYZE in {time.perf_counter() - started:.1f} s")
        cursor.execute("SELECT pg_size_pretty(pg_total_relation_size('pgqueue_job'))")
        print(f"table + indexes: {cursor.fetchone()[0]}")


def explain(sql: str) -> dict[str, Any]:
    """Run EXPLAIN (ANALYZE, BUFFERS) on one captured query; summarise its plan."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql)
        plan = cursor.fetchone()[0]
    if isinstance(plan, str):
        plan = json.loads(plan)
    root = plan[0]["Plan"]
    found = {"seq_scans": [], "sorts": [], "rows_read": 0, "nodes": []}

    def walk(node: dict[str, Any]) -> None:
        kind = node["Node Type"]
        found["nodes"].append(kind + (f" {node['Index Name']}" if "Index Name" in node else ""))
        if kind == "Seq Scan" and node.get("Relation Name") == "pgqueue_job":
            found["seq_scans"].append(node["Actual Rows"] + node.get("Rows Removed by Filter", 0))
        if kind in ("Sort", "Incremental Sort"):
            child = node["Plans"][0]
            found["sorts"].append(child["Actual Rows"] * child.get("Actual Loops", 1))
        if node.get("Relation Name") == "pgqueue_job":
            found["rows_read"] += (
                node["Actual Rows"] + node.get("Rows Removed by Filter", 0)
            ) * node.get("Actual Loops", 1)
        for sub in node.get("Plans", []):
            walk(sub)

    walk(root)
    found["ms"] = plan[0]["Execution Time"]
    return found


def measure(client: Any, label: str, url: str, repeat: int) -> dict[str, Any]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    response = client.get(url)  # warm-up (and the queries to explain)
    assert response.status_code == 200, (url, response.status_code)
    with CaptureQueriesContext(connection) as captured:
        client.get(url)
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        client.get(url)
        times.append((time.perf_counter() - started) * 1000)
    problems = []
    details = []
    for query in captured.captured_queries:
        sql = query["sql"]
        if "pgqueue_job" not in sql or sql.startswith("EXPLAIN"):
            continue
        info = explain(sql)
        upper = sql.upper()
        if "COUNT(" in upper and "LIMIT" not in upper:
            problems.append("unbounded COUNT")
        if info["seq_scans"]:
            problems.append(f"seq scan reading {max(info['seq_scans']):,} rows")
        if any(rows > 1000 for rows in info["sorts"]):
            problems.append(f"sort of {max(info['sorts']):,} rows")
        details.append((sql, info))
    return {
        "label": label,
        "url": url,
        "median": statistics.median(times),
        "best": min(times),
        "worst": max(times),
        "queries": len(captured.captured_queries),
        "problems": problems,
        "details": details,
    }


def report(result: dict[str, Any], verbose: bool) -> None:
    flag = "; ".join(sorted(set(result["problems"]))) or "ok"
    print(
        f"{result['label']:<34} median {result['median']:7.1f} ms  best {result['best']:7.1f}"
        f"  worst {result['worst']:7.1f}  queries {result['queries']:2d}  {flag}"
    )
    if verbose:
        for sql, info in result["details"]:
            short = " ".join(sql.split())
            short = short if len(short) < 150 else short[:147] + "..."
            print(
                f"    {info['ms']:7.2f} ms  rows read {info['rows_read']:>9,}  "
                f"{' > '.join(info['nodes'][:6])}\n      {short}"
            )


def pages() -> list[tuple[str, str]]:
    from django.urls import reverse

    from django_pgqueue.models import Job

    jobs = reverse("admin:django_pgqueue_job_changelist")
    dead = reverse("admin:django_pgqueue_deadletter_changelist")
    dead_id = Job.objects.filter(status="dead").order_by("-id").values_list("id", flat=True)[0]
    return [
        ("Job list", jobs),
        ("Job list ?status=pending", f"{jobs}?status__exact=pending"),
        ("Job list ?queue=mail", f"{jobs}?queue=mail"),
        ("Job list page 100", f"{jobs}?p=100"),
        ("Job search by id", f"{jobs}?q={dead_id}"),
        ("Dead letters", dead),
        ("Dead letters ?queue=billing", f"{dead}?queue=billing"),
        ("Dead letter detail", reverse("admin:django_pgqueue_deadletter_change", args=[dead_id])),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="(default: %(default)r)")
    parser.add_argument("--repeat", type=int, default=15, help="(default: %(default)r)")
    parser.add_argument("--refill", action="store_true", help="truncate and fill again")
    parser.add_argument("--verbose", action="store_true", help="print every query's plan")
    parser.add_argument(
        "--no-dead-index", action="store_true", help="skip the dead-index comparison"
    )
    args = parser.parse_args()
    configure()

    from django.contrib.auth import get_user_model
    from django.core.signals import request_finished, request_started
    from django.db import close_old_connections, connection, reset_queries
    from django.test import Client

    # As a server with persistent connections (CONN_MAX_AGE) runs: no reconnect per
    # request, and no reset of the query log the capture below reads.
    request_started.disconnect(reset_queries)
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)

    fill(args.rows, args.refill)
    user, _ = get_user_model().objects.get_or_create(
        username="bench", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(user)
    print(f"PostgreSQL {connection.pg_version // 10000}, {args.rows:,} jobs, repeat {args.repeat}")

    for label, url in pages():
        report(measure(client, label, url, args.repeat), args.verbose)

    if not args.no_dead_index:
        print("\nwithout pgqueue_job_dead_idx (dropped, rolled back after):")
        dead_pages(client, args, sparse=False)
        print("\nfew dead letters: 100 of 1,000,000 (the 2 % above made done, rolled back after)")
        dead_pages(client, args, sparse=True)


class RollbackError(Exception):
    """Raised to undo a bench section's changes to the table."""


def dead_pages(client: Any, args: argparse.Namespace, *, sparse: bool) -> None:
    """The dead-letter pages with and without pgqueue_job_dead_idx (migration 0003), in
    a transaction that is rolled back (the dropped index and, with ``sparse``, the
    thinned-out dead letters)."""
    from django.db import connection, transaction

    def dead_letter_pages() -> None:
        for label, url in pages():
            if label.startswith("Dead"):
                report(measure(client, label, url, args.repeat), args.verbose)

    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                if sparse:
                    cursor.execute(
                        "UPDATE pgqueue_job SET status = 'done', errors = '[]'"
                        " WHERE status = 'dead' AND id % 10000 <> 970"
                    )
                    cursor.execute("ANALYZE pgqueue_job")
                    print("  with pgqueue_job_dead_idx:")
                    dead_letter_pages()
                    print("  without it:")
                cursor.execute(DROP_DEAD_INDEX)
                cursor.execute("ANALYZE pgqueue_job")
            dead_letter_pages()
            raise RollbackError
    except RollbackError:
        pass


if __name__ == "__main__":
    main()
