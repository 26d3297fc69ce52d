"""Periodic jobs benchmark: what the periodic part of one sweep pass costs.

    python -m bench.periodic [--entries 100] [--passes 30]

Declares ``--entries`` every-minute entries, then runs ``--passes`` pairs of passes
over a pinned clock: a *busy* pass one minute later (every entry has a due tick: one
job each) and an *idle* pass five seconds after it (nothing due). Prints the median,
best and worst of each, and the statements a pass ran (three, however many entries).

The database: with no ``DATABASE_URL``, database ``pgqueue_bench_periodic`` on the
embedded server (created and migrated here; the shared test databases are never
touched). With ``DATABASE_URL``, that database, whose ``pgqueue_schedule`` table must be
empty unless ``--truncate-existing`` is given: every run truncates it and the jobs table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def prepare_database(truncate_existing: bool) -> None:
    sys.path.insert(0, str(REPO))
    own = not os.environ.get("DATABASE_URL")
    if own:
        from testproject.pgserver import embedded_server, ensure_database

        os.environ["DATABASE_URL"] = ensure_database(embedded_server(), "pgqueue_bench_periodic")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from django_pgqueue.models import Schedule

    call_command("migrate", verbosity=0)
    if Schedule.objects.exists() and not (own or truncate_existing):
        raise SystemExit(
            "pgqueue_schedule is not empty and the benchmark truncates it; use a database "
            "of its own (unset DATABASE_URL) or pass --truncate-existing"
        )
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE pgqueue_schedule, pgqueue_job, pgqueue_step RESTART IDENTITY")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=100)
    parser.add_argument("--passes", type=int, default=30)
    parser.add_argument("--truncate-existing", action="store_true")
    options = parser.parse_args()
    prepare_database(options.truncate_existing)

    from django.db import connection
    from django.test import override_settings
    from django.test.utils import CaptureQueriesContext

    from django_pgqueue import periodic

    entries = {
        f"entry-{i}": {"task": "testproject.demo.tasks.add", "cron": "* * * * *", "args": [i, 1]}
        for i in range(options.entries)
    }
    start = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    busy: list[float] = []
    idle: list[float] = []
    with override_settings(PGQUEUE_PERIODIC=entries):
        periodic.enqueue_due(using="default", now=start)  # rows created, no jobs
        for k in range(1, options.passes + 1):
            at = start + dt.timedelta(minutes=k)
            began = time.perf_counter()
            with CaptureQueriesContext(connection) as queries:
                enqueued = periodic.enqueue_due(using="default", now=at)
            busy.append(time.perf_counter() - began)
            assert len(enqueued) == options.entries, len(enqueued)
            began = time.perf_counter()
            assert periodic.enqueue_due(using="default", now=at + dt.timedelta(seconds=5)) == []
            idle.append(time.perf_counter() - began)
    print(
        f"{options.entries} entries, {options.passes} passes each, statements a pass: "
        f"{len(queries.captured_queries)}"
    )
    for name, times in (("busy (one tick each)", busy), ("idle (nothing due)", idle)):
        ms = sorted(t * 1000 for t in times)
        print(
            f"  {name:22} median {statistics.median(ms):7.1f} ms  best {ms[0]:7.1f} ms  "
            f"worst {ms[-1]:7.1f} ms  ({statistics.median(ms) / options.entries:.2f} ms/entry)"
        )


if __name__ == "__main__":
    main()
