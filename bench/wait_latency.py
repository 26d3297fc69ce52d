"""Wait latency: how long ``django_pgqueue.wait_for(result)`` takes to return once the
job's completion has committed.

    python -m bench.wait_latency [--waits 100]

For each of ``--waits`` jobs: enqueue it, start ``wait_for`` on it in a thread, wait
until the row is flagged ``waited`` (the waiter is listening and has checked), then
finish it with one committed UPDATE on a connection of its own, as a worker's
completion does. Prints the p50, p90 and max of the time from the COMMIT's return to
``wait_for``'s (refresh included), and of the time from the UPDATE's start.

The database: with no ``DATABASE_URL``, database ``pgqueue_bench_wait`` on the embedded
server; with ``DATABASE_URL``, that database (its ``pgqueue_job`` is truncated unless
it holds jobs and ``--truncate-existing`` is not given).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from bench.progress import prepare_database


def one_wait(conn, add, wait_for, job_model) -> tuple[float, float]:
    """(seconds from the commit's return, from the UPDATE's start) to wait_for's return."""
    result = add.enqueue(1, 2)
    returned: list[float] = []

    def waiter() -> None:
        wait_for(result, timeout=30)
        returned.append(time.monotonic())

    thread = threading.Thread(target=waiter)
    thread.start()
    while not job_model.objects.filter(pk=result.id, waited=True).exists():
        time.sleep(0.001)
    started = time.monotonic()
    conn.execute(
        "UPDATE pgqueue_job SET status = 'done', result = '3', "
        "finished_at = clock_timestamp() WHERE id = %s",
        [int(result.id)],
    )
    committed = time.monotonic()
    thread.join(30)
    return returned[0] - committed, returned[0] - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--waits", type=int, default=100)
    parser.add_argument("--truncate-existing", action="store_true")
    options = parser.parse_args()
    prepare_database(options.truncate_existing, "pgqueue_bench_wait")

    import psycopg
    from django.db import connection

    from django_pgqueue import wait_for
    from django_pgqueue.models import Job
    from testproject.demo.tasks import add

    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    with psycopg.connect(**params, autocommit=True) as conn:
        one_wait(conn, add, wait_for, Job)  # the hub's connection made
        figures = [one_wait(conn, add, wait_for, Job) for _ in range(options.waits)]
    for label, values in (
        ("from the COMMIT's return", [f[0] for f in figures]),
        ("from the UPDATE's start", [f[1] for f in figures]),
    ):
        ms = sorted(v * 1000 for v in values)
        p90 = ms[int(len(ms) * 0.9) - 1]
        print(
            f"{len(ms)} waits, {label}: p50 {statistics.median(ms):.2f} ms, "
            f"p90 {p90:.2f} ms, max {ms[-1]:.2f} ms"
        )


if __name__ == "__main__":
    main()
