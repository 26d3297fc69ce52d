"""Progress benchmark: what one ``current_job().set_progress(value)`` costs.

    python -m bench.progress [--calls 2000] [--rounds 3]

Claims one job, then, in each round, times ``--calls`` calls of ``set_progress`` with a
small value (``{"done": i, "of": calls}``, what a task reporting every second writes)
beside as many ``SELECT 1`` round trips on the same connection: the floor any write
pays. Prints the median per call of each round and the median of the rounds' medians,
the ratio of the two, and how many of the updates PostgreSQL made HOT (no index
touched, the dead version pruned within the page).

The database: with no ``DATABASE_URL``, database ``pgqueue_bench_progress`` on the
embedded server (created and migrated here; the shared test databases are never
touched). With ``DATABASE_URL``, that database, whose ``pgqueue_job`` table must be
empty unless ``--truncate-existing`` is given: every run truncates it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def prepare_database(truncate_existing: bool, name: str = "pgqueue_bench_progress") -> None:
    """Django on the bench's database, migrated, ``pgqueue_job`` emptied: ``name`` on the
    embedded server with no ``DATABASE_URL``, else ``DATABASE_URL``'s database, created
    if missing (the README's commands name one of their own)."""
    sys.path.insert(0, str(REPO))
    own = not os.environ.get("DATABASE_URL")
    if own:
        from testproject.pgserver import embedded_server, ensure_database

        os.environ["DATABASE_URL"] = ensure_database(embedded_server(), name)
    else:
        from bench.common import ensure_databases

        ensure_databases(os.environ["DATABASE_URL"])
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from django_pgqueue.models import Job

    call_command("migrate", verbosity=0)
    if Job.objects.exists() and not (own or truncate_existing):
        raise SystemExit(
            "pgqueue_job is not empty and the benchmark truncates it; use a database of "
            "its own (unset DATABASE_URL) or pass --truncate-existing"
        )
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE pgqueue_job, pgqueue_step, pgqueue_job_key RESTART IDENTITY")


def hot_updates() -> tuple[int, int]:
    """(updates, HOT updates) of pgqueue_job so far, as the statistics collector has them."""
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.pg_version >= 150000:  # before 15 the collector lags a little
            cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
            " WHERE relid = 'pgqueue_job'::regclass"
        )
        updated, hot = cursor.fetchone()
    return int(updated), int(hot)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--truncate-existing", action="store_true")
    options = parser.parse_args()
    prepare_database(options.truncate_existing)

    from django.db import connection

    from django_pgqueue import db, lifecycle
    from django_pgqueue.models import Job

    Job.objects.enqueue("testproject.demo.tasks.add", [1, 2])
    (job,) = Job.objects.claim("bench-progress", limit=1, lease_seconds=3600)
    fence = ("default", job.id, "bench-progress", job.attempts, job.last_attempted_at)
    calls = options.calls
    connection.ensure_connection()
    before = hot_updates()
    progress: list[float] = []
    round_trip: list[float] = []
    for round_no in range(1, options.rounds + 1):
        began = time.perf_counter()
        for i in range(calls):
            lifecycle.set_progress(*fence, {"done": i, "of": calls})
        progress.append((time.perf_counter() - began) / calls * 1000)
        began = time.perf_counter()
        for _ in range(calls):
            db.rows("default", "SELECT 1", {}, prepare=True)
        round_trip.append((time.perf_counter() - began) / calls * 1000)
        print(
            f"round {round_no}: set_progress {progress[-1]:.3f} ms/call, "
            f"SELECT 1 {round_trip[-1]:.3f} ms/call"
        )
    after = hot_updates()
    updated, hot = after[0] - before[0], after[1] - before[1]
    assert Job.objects.get(pk=job.id).progress == {"done": calls - 1, "of": calls}
    median_progress, median_trip = statistics.median(progress), statistics.median(round_trip)
    print(
        f"{calls} calls x {options.rounds} rounds: set_progress median {median_progress:.3f} "
        f"ms/call, SELECT 1 median {median_trip:.3f} ms/call "
        f"({median_progress / median_trip:.2f}x a round trip); "
        f"HOT updates {hot} of {updated}"
    )


if __name__ == "__main__":
    main()
