"""The monitoring figures checked against exact counts on a big table (issue 28): each
figure that ``pgqueue_status``, the dashboard and the admin's job list show, beside the
truth from a full ``GROUP BY``, and whether it is honest: exact where it says so, a
lower bound (at most the truth) where it is marked one, an estimate only where marked.

    python -m bench.monitoring_figures [--rows 1000000] [--refill]

The jobs live in a database of the bench's own, ``pgqueue_bench_figures`` (on the
server of ``DATABASE_URL``), filled once per size with ``INSERT ... SELECT FROM
generate_series`` (secondary indexes dropped during the load and rebuilt after). The
shape, the issue's: two paused queues, ``mail`` with 1.5 % of the rows pending and
``search`` with 500; a burst of done jobs (``--rows`` / 50 in the last 8 seconds, then
uneven minutes before it), 0.2 % dead, 0.1 % cancelled, the rest done over a week.
Prints one line per figure and the time each reading took; exits 1 if any figure is
dishonest.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

REPO = Path(__file__).resolve().parent.parent
BENCH_DB = "pgqueue_bench_figures"

FILL = """
INSERT INTO pgqueue_job (
    backend, queue, task, args, kwargs, priority, status, attempts, max_attempts,
    run_at, errors, created_at, started_at, last_attempted_at, finished_at, lease_owner
)
SELECT 'default', k.queue, 'bench.tasks.task_' || (i %% 15), '[]', '{}', 0, k.status,
       1, 1, t.at - interval '2 s', '[]', t.at - interval '2 s',
       CASE WHEN k.status <> 'pending' THEN t.at - interval '1 s' END,
       CASE WHEN k.status <> 'pending' THEN t.at - interval '1 s' END,
       CASE WHEN k.status <> 'pending' THEN t.at END,
       CASE WHEN k.status <> 'pending' THEN 'w' END
FROM generate_series(%(first)s, %(last)s) AS i,
     LATERAL (SELECT CASE
         WHEN i <= %(mail)s THEN 'mail'
         WHEN i <= %(mail)s + 500 THEN 'search'
         ELSE 'q' || (i %% 4) END AS queue) AS q,
     LATERAL (SELECT q.queue, CASE
         WHEN i <= %(mail)s + 500 THEN 'pending'
         WHEN i %% 1000 < 2 THEN 'dead'
         WHEN i %% 1000 < 3 THEN 'cancelled'
         ELSE 'done' END AS status) AS k,
     -- pending: waited 60 s (mail) or 600 s (search); the newest rows/50 in the last
     -- 8 s, then 3 minutes of 30 %%, 10 %% and 5 %% of that, the rest over a week.
     LATERAL (SELECT CASE
         WHEN i <= %(mail)s THEN %(now)s - interval '60 s'
         WHEN i <= %(mail)s + 500 THEN %(now)s - interval '600 s'
         WHEN i > %(rows)s - %(burst)s
             THEN %(now)s - ((%(rows)s - i)::float / %(burst)s) * interval '8 s'
         WHEN i > %(rows)s - %(burst)s * 1.3
             THEN date_trunc('minute', %(now)s) - interval '1 min'
                  + ((%(rows)s - %(burst)s - i)::float / (%(burst)s * 0.3)) ^ 3 * interval '59 s'
         WHEN i > %(rows)s - %(burst)s * 1.4
             THEN date_trunc('minute', %(now)s) - interval '2 min'
                  + ((%(rows)s - %(burst)s * 1.3 - i)::float / (%(burst)s * 0.1)) * interval '59 s'
         WHEN i > %(rows)s - %(burst)s * 1.45
             THEN date_trunc('minute', %(now)s) - interval '3 min'
                  + ((%(rows)s - %(burst)s * 1.4 - i)::float / (%(burst)s * 0.05))
                    * interval '59 s'
         ELSE %(now)s - interval '1 h' - (i::float / %(rows)s) * interval '7 days'
     END AS at) AS t
"""


def configure() -> None:
    """Point the test project at the bench's own database before Django starts."""
    import psycopg

    url = os.environ.get("DATABASE_URL")
    if not url:
        sys.exit("monitoring_figures: set DATABASE_URL (postgres://...)")
    with psycopg.connect(url, autocommit=True) as conn:
        if (
            conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [BENCH_DB]).fetchone()
            is None
        ):
            conn.execute(f'CREATE DATABASE "{BENCH_DB}"')  # our constant
    os.environ["DATABASE_URL"] = urlunsplit(urlsplit(url)._replace(path=f"/{BENCH_DB}"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    sys.path.insert(0, str(REPO))
    import django

    django.setup()


def fill(rows: int, refill: bool) -> None:
    """The table of ``rows`` jobs, its times relative to now (so a reused table is
    shifted to now: the burst is always the last 8 seconds)."""
    from django.core.management import call_command
    from django.db import connection

    from django_pgqueue.models import Job

    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pgqueue_job")
        (present,) = cursor.fetchone()
        started = time.perf_counter()
        if refill or present != rows:
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
            params = {"rows": rows, "mail": rows * 15 // 1000, "burst": rows // 50, "now": now}
            for first in range(1, rows + 1, 500_000):
                cursor.execute(
                    FILL, {**params, "first": first, "last": min(rows, first + 499_999)}
                )
            for _, definition in indexes:
                cursor.execute(definition)
            print(f"filled {rows:,} rows in {time.perf_counter() - started:.1f} s")
        else:
            # Reused: shift every time so the newest finished job is now again.
            cursor.execute(
                "UPDATE pgqueue_job SET run_at = run_at + d, created_at = created_at + d,"
                " started_at = started_at + d, last_attempted_at = last_attempted_at + d,"
                " finished_at = finished_at + d"
                " FROM (SELECT clock_timestamp() - max(finished_at) AS d FROM pgqueue_job) AS s"
            )
            print(f"reused {rows:,} rows, shifted to now in {time.perf_counter() - started:.1f} s")
        cursor.execute("VACUUM ANALYZE pgqueue_job")
    Job.objects.pause_queue("mail")
    Job.objects.pause_queue("search")


def truth(now: dt.datetime) -> dict[str, Any]:
    """Every figure at ``now``, exactly, from full scans."""
    from django.db import connection

    out: dict[str, Any] = {}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT queue, count(*), min(run_at) FROM pgqueue_job WHERE status = 'pending'"
            " GROUP BY queue"
        )
        out["pending"] = {q: (n, (now - at).total_seconds()) for q, n, at in cursor.fetchall()}
        cursor.execute(
            "SELECT status, queue, count(*) FILTER (WHERE finished_at >= %(now)s - interval"
            " '300 s'), count(*) FILTER (WHERE finished_at >= %(now)s - interval '60 s')"
            " FROM pgqueue_job WHERE status IN ('done', 'dead', 'cancelled') GROUP BY 1, 2",
            {"now": now},
        )
        out["recent"] = {(s, q): (n5, n1) for s, q, n5, n1 in cursor.fetchall()}
        cursor.execute(
            "SELECT date_trunc('minute', finished_at), count(*) FROM pgqueue_job"
            " WHERE status = 'done' AND finished_at >= date_trunc('minute', %(now)s)"
            " - interval '59 min' GROUP BY 1",
            {"now": now},
        )
        out["minutes"] = dict(cursor.fetchall())
        cursor.execute("SELECT status, count(*) FROM pgqueue_job GROUP BY 1")
        out["status"] = dict(cursor.fetchall())
    return out


class Verdicts:
    """One printed line per figure, and whether every figure was honest."""

    def __init__(self) -> None:
        self.honest = True
        print(f"{'figure':<34}{'shown':>14}{'truth':>12}  {'kind':<12}verdict")

    def check(self, name: str, shown: float, true: float, kind: str, tolerance: float = 0) -> None:
        if shown == 0 and true == 0:
            return  # a quiet queue: nothing to compare
        if kind == "exact":
            ok = abs(shown - true) <= tolerance
        elif kind == "lower bound":
            ok = shown <= true + tolerance
        else:  # an estimate, marked as one
            ok = True
        self.honest = self.honest and ok
        print(f"{name:<34}{shown:>14,.1f}{true:>12,.1f}  {kind:<12}{'ok' if ok else 'WRONG'}")


def kind(figure: str, stats: Any) -> str:
    if figure in stats.lower_bound:
        return "lower bound"
    return "estimate" if figure in stats.estimated else "exact"


def check_status(v: Verdicts, exact: dict[str, Any], snap: Any) -> None:
    for queue, (jobs, age) in sorted(exact["pending"].items()):
        q = snap.queues[queue]
        v.check(f"pending {queue}", q.pending, jobs, kind("pending", q))
        v.check(f"oldest pending {queue} (s)", q.oldest_pending_age or 0, age, "exact", 1e-3)
    for queue, q in sorted(snap.queues.items()):
        for status, figure in (
            ("done", "done_5m"),
            ("dead", "failed_5m"),
            ("cancelled", "cancelled_5m"),
        ):
            true5, true1 = exact["recent"].get((status, queue), (0, 0))
            v.check(f"{figure} {queue}", getattr(q, figure), true5, kind(figure, q), 0)
            if status == "done":
                v.check(
                    f"finished/min {queue}",
                    q.finished_per_second * 60,
                    true1,
                    kind("finished_per_second", q),
                    1e-6,
                )


def check_history(v: Verdicts, exact: dict[str, Any], hist: Any) -> None:
    for m in hist.minutes:
        true = exact["minutes"].get(m.start, 0)
        if m.finished or true:
            v.check(
                f"done in {m.start:%H:%M}",
                m.finished,
                true,
                "lower bound" if m.lower_bound else "exact",
            )


def check_summary(v: Verdicts, exact: dict[str, Any], summary: Any) -> None:
    for status in ("pending", "dead", "cancelled", "done"):
        shown = summary.totals.get(status) or 0
        if status in summary.estimated:
            how = "estimate"
        elif status in summary.capped:
            how = "lower bound"
        else:
            how = "exact"
        v.check(f"job list: {status}", shown, exact["status"].get(status, 0), how)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--refill", action="store_true")
    args = parser.parse_args()
    if args.rows < 10_000:
        parser.error("--rows must be at least 10000")
    configure()
    fill(args.rows, args.refill)
    from django_pgqueue import db, monitoring

    now = db.clock("default")  # every reading, and the truth, at this one time
    timings = {}
    started = time.perf_counter()
    snap = monitoring.snapshot(now=now)
    timings["snapshot (pgqueue_status)"] = time.perf_counter() - started
    started = time.perf_counter()
    hist = monitoring.history(now=now)
    timings["history (dashboard charts)"] = time.perf_counter() - started
    started = time.perf_counter()
    summary = monitoring.queue_summary("default", now=now)
    timings["queue_summary (job list)"] = time.perf_counter() - started
    started = time.perf_counter()
    exact = truth(now)
    timings["the truth (full GROUP BYs)"] = time.perf_counter() - started

    v = Verdicts()
    check_status(v, exact, snap)
    check_history(v, exact, hist)
    check_summary(v, exact, summary)
    print()
    for name, seconds in timings.items():
        print(f"{name:<30}{seconds * 1000:>10.1f} ms")
    print(f"\nall figures honest: {'yes' if v.honest else 'NO'}")
    print("(2 shared cores; other work ran on this machine: compare within one run.)")
    sys.exit(0 if v.honest else 1)


if __name__ == "__main__":
    main()
