"""Durable steps benchmark: what 1,000 ``current_job().run_step()`` calls in one job cost
against the same code run plainly.

    python -m bench.steps [--steps 1000] [--rounds 3]

Each round claims a fresh job and times, for ``--steps`` steps of a trivial function
(``lambda i: {"i": i}``):

* ``plain code``: the function called directly, the floor;
* ``run_step (first run)``: each step called and recorded (one fenced INSERT each);
* ``run_step transactional``: each step in its own transaction with its record;
* ``run_step (resumed run)``: a new run of the same job: one SELECT of its recorded
  steps, then each step answered from them without a query;
* ``SELECT 1``: as many round trips on the same connection, what any write pays.

Prints each round's milliseconds per job and per step, then the median of the rounds.

The database: with no ``DATABASE_URL``, database ``pgqueue_bench_steps`` on the
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def prepare_database(truncate_existing: bool) -> None:
    sys.path.insert(0, str(REPO))
    own = not os.environ.get("DATABASE_URL")
    if own:
        from testproject.pgserver import embedded_server, ensure_database

        os.environ["DATABASE_URL"] = ensure_database(embedded_server(), "pgqueue_bench_steps")
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
        cursor.execute("TRUNCATE pgqueue_job, pgqueue_job_key, pgqueue_step RESTART IDENTITY")


def a_run(job: Any) -> Any:
    """What ``current_job()`` gives a worker's run of the claimed ``job``."""
    from django_pgqueue.tasks import CancelFlag, RunningJob

    return RunningJob(job, "bench-steps", False, CancelFlag(), "default").current()


def claimed() -> Any:
    from django_pgqueue.models import Job

    job = Job.objects.enqueue("testproject.demo.tasks.add", [1, 2])
    (got,) = Job.objects.claim("bench-steps", limit=1, lease_seconds=3600)
    assert got.id == job.id
    return got


def timed(body: Callable[[], None]) -> float:
    began = time.perf_counter()
    body()
    return (time.perf_counter() - began) * 1000


def one_round(steps: int) -> dict[str, float]:
    """Milliseconds per job of each way, for ``steps`` steps."""
    from django_pgqueue import db

    def fn(i: int) -> dict[str, int]:
        return {"i": i}

    figures: dict[str, float] = {}
    figures["plain code"] = timed(lambda: [fn(i) for i in range(steps)] and None)
    job = claimed()
    first = a_run(job)
    figures["run_step (first run)"] = timed(
        lambda: [first.run_step(f"s{i}", fn, i) for i in range(steps)] and None
    )
    later = a_run(job)
    figures["run_step (resumed run)"] = timed(
        lambda: [later.run_step(f"s{i}", fn, i) for i in range(steps)] and None
    )
    tx = a_run(claimed())
    figures["run_step transactional"] = timed(
        lambda: [tx.run_step(f"s{i}", fn, i, transactional=True) for i in range(steps)] and None
    )
    figures["SELECT 1"] = timed(
        lambda: [db.rows("default", "SELECT 1", {}, prepare=True) for _ in range(steps)] and None
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--truncate-existing", action="store_true")
    options = parser.parse_args()
    prepare_database(options.truncate_existing)
    from django.db import connection

    connection.ensure_connection()
    rounds = []
    for number in range(1, options.rounds + 1):
        figures = one_round(options.steps)
        rounds.append(figures)
        print(
            f"round {number}: " + ", ".join(f"{name} {ms:.1f} ms" for name, ms in figures.items())
        )
    print(f"\n{options.steps} steps per job, median of {options.rounds} rounds:")
    print(f"{'':26} {'ms per job':>12} {'ms per step':>12}")
    for name in rounds[0]:
        median = statistics.median(r[name] for r in rounds)
        print(f"{name:26} {median:12.1f} {median / options.steps:12.4f}")


if __name__ == "__main__":
    main()
