"""Search and tag benchmark: the job list's search box on a 1,000,000-row table.

    python -m bench.search [--rows 1000000] [--repeat 7] [--refill]

Fills ``pgqueue_job`` of its own database (``pgqueue_bench_search`` beside
``DATABASE_URL``'s, or on the embedded server) with ``--rows`` jobs through COPY, the
search indexes dropped during the load and built after (as a restore would), then
``VACUUM ANALYZE``. Each job: args ``[i, "customer-<i % 997>"]``, kwargs
``{"customer_id": i % 5000, "region": ...}``, tags ``["customer:<i % 5000>"]`` (a tenth
also ``"import"``), an idempotency key on a quarter, eight tasks, 96 % done.

For each term it times what the job list runs for a search (``search.search_q`` as the
admin's queryset, newest 50 first, plus the paginator's bounded count): the median and
best of ``--repeat`` after a warm-up, and prints ``EXPLAIN (ANALYZE, BUFFERS)`` of the
list query, whose index names show what served it. Last, the whole admin page with
that search, through Django's test ``Client`` as a superuser. Target: under 100 ms per
query on 1,000,000 jobs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

BENCH_DB = "pgqueue_bench_search"
#: The search indexes (migrations 0026 and 0027): dropped for the load, built after it.
SEARCH_INDEXES = (
    "pgqueue_job_tags_search_idx",
    "pgqueue_job_args_search_idx",
    "pgqueue_job_kwargs_search_idx",
    "pgqueue_job_task_search_idx",
    "pgqueue_job_key_search_idx",
)
COLUMNS = (
    "backend, queue, task, args, kwargs, priority, status, attempts, max_attempts, run_at, "
    "idempotency_key, errors, created_at, finished_at, tags"
)
REGIONS = ("eu-west", "eu-central", "us-east", "ap-south")


def configure() -> None:
    from bench.common import ensure_databases, setup_django

    url = os.environ.get("DATABASE_URL")
    if url is None:
        from testproject.pgserver import embedded_server, ensure_database

        url = ensure_database(embedded_server(), BENCH_DB)
    else:
        url = url.rsplit("/", 1)[0] + "/" + BENCH_DB
        ensure_databases(url)
    setup_django(url)


def rows(count: int) -> Any:
    """The jobs, as COPY text rows."""
    for i in range(1, count + 1):
        status = "done" if i % 100 < 96 else ("dead" if i % 100 < 98 else "pending")
        tags = f"customer:{i % 5000}" + (",import" if i % 10 == 0 else "")
        yield (
            "default",
            ("default", "mail", "billing", "reports")[i % 4],
            f"bench.tasks.task_{i % 8}",
            json.dumps([i, f"customer-{i % 997}"]),
            json.dumps({"customer_id": i % 5000, "region": REGIONS[i % 4]}),
            0,
            status,
            1,
            5,
            "2026-01-01 00:00:00+00",
            f"key-{i}" if i % 4 == 0 else None,
            "[]",
            "2026-01-01 00:00:00+00",
            "2026-01-01 00:00:02+00" if status != "pending" else None,
            "{" + tags + "}",
        )


def fill(count: int, refill: bool) -> None:
    from django.db import connection

    from django_pgqueue.models import Job

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM (SELECT 1 FROM pgqueue_job LIMIT %s) AS x", [count])
        if cursor.fetchone()[0] >= count and not refill:
            return
    started = time.monotonic()
    indexes = {i.name: i for i in Job._meta.indexes if i.name in SEARCH_INDEXES}
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE pgqueue_job, pgqueue_step")
        for name in SEARCH_INDEXES:
            cursor.execute(f"DROP INDEX IF EXISTS {name}")
        with cursor.cursor.copy(f"COPY pgqueue_job ({COLUMNS}) FROM STDIN") as copy:
            for row in rows(count):
                copy.write_row(row)
    loaded = time.monotonic()
    with connection.schema_editor(atomic=False) as editor:
        for index in indexes.values():
            editor.add_index(Job, index)
    built = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE pgqueue_job")
    print(
        f"filled {count:,} jobs: COPY {loaded - started:.1f} s, search indexes "
        f"{built - loaded:.1f} s, VACUUM ANALYZE {time.monotonic() - built:.1f} s"
    )


def timed(run: Any, repeat: int) -> tuple[float, float]:
    run()  # warm-up
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), min(times)


def measure(term: str, repeat: int, client: Any) -> None:
    from django.db import connection
    from django.urls import reverse

    from django_pgqueue.admin.paginator import EstimatedCountPaginator
    from django_pgqueue.admin.search import search_q
    from django_pgqueue.models import Job

    base = Job.objects.filter(search_q(term, using="default")).defer(
        "args", "kwargs", "result", "errors"
    )
    page = base.order_by("-id")[:50]

    def query() -> None:
        list(page)
        EstimatedCountPaginator(base.order_by("-id"), 50).count  # noqa: B018

    median, best = timed(query, repeat)
    found = len(list(page))
    sql, params = page.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sql, params)
        plan = [row[0] for row in cursor.fetchall()]
    url = reverse("admin:django_pgqueue_job_changelist")
    page_median, page_best = timed(lambda: client.get(url, {"q": term}), max(3, repeat // 2))
    verdict = "ok" if median < 100 else "OVER 100 ms"
    print(f"\n=== q={term!r}: {found} shown")
    print(
        f"query + count: median {median:.1f} ms, best {best:.1f} ms ({verdict}); "
        f"admin page: median {page_median:.1f} ms, best {page_best:.1f} ms"
    )
    print("\n".join("    " + line for line in plan))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--refill", action="store_true")
    args = parser.parse_args()
    configure()
    fill(args.rows, args.refill)
    from django.contrib.auth import get_user_model
    from django.test import Client

    user, _ = get_user_model().objects.get_or_create(
        username="bench", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(user)
    middle = args.rows // 2 // 4 * 4  # a job with a key
    for term in (
        "customer:4242",  # a tag of 1 job in 5000
        "import",  # a tag of 1 job in 10
        f"[{middle + 1}]",  # a positional argument
        "customer_id=4242",  # a keyword argument
        f"key-{middle}",  # an idempotency key
        "bench.tasks.task_3",  # a task path
        str(middle),  # a job id
        "nothing-matches-this",
    ):
        measure(term, args.repeat, client)


if __name__ == "__main__":
    main()
