"""Connection budget: how many server connections one ``pgqueue_worker`` holds.

    python -m bench.connections [--concurrency 1 4 16] [--processes 1 4]

For each (``--processes``, ``--concurrency``) pair, one ``pgqueue_worker`` is started and
given enough slow jobs that every runner thread runs at least one (runners connect on
their first job), with a 6 s lease so that the heartbeat (every lease/3) connects too.
Then the server's ``pg_stat_activity`` is read while all of them are busy, counting the
worker's backends by role (``application_name`` is ``pgqueue <role> <worker id>``).
Once directly (with the LISTEN connection), once as behind a transaction pooler without
``LISTEN_DATABASE`` (``DATABASE_POOLED=1``: the worker polls, so no listener). Through
PgBouncer these are *client* connections; the server sees at most the pool size.

Database: ``pgqueue_bench_connections`` on the embedded server, or ``DATABASE_URL``
(whose jobs table is truncated: use a database of its own).
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MANAGE = REPO / "testproject" / "manage.py"


def prepare() -> None:
    sys.path.insert(0, str(REPO))
    if not os.environ.get("DATABASE_URL"):
        from testproject.pgserver import embedded_server, ensure_database

        os.environ["DATABASE_URL"] = ensure_database(
            embedded_server(), "pgqueue_bench_connections"
        )
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def roles(worker_id: str) -> collections.Counter[str]:
    """Backends of this worker (and of its children) by role."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT application_name FROM pg_stat_activity WHERE application_name LIKE %s",
            [f"pgqueue % {worker_id}%"],
        )
        return collections.Counter(name.split()[1] for (name,) in cursor.fetchall())


def measure(processes: int, concurrency: int, pooled: bool) -> collections.Counter[str]:
    from django.db import connection

    from django_pgqueue.models import Job

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE pgqueue_job, pgqueue_step")
    slots = processes * concurrency
    Job.objects.bulk_enqueue(
        {"task": "testproject.demo.tasks.slow", "kwargs": {"seconds": 3.0}}
        for _ in range(slots * 2)
    )
    worker_id = f"budget-{processes}-{concurrency}-{int(pooled)}"
    env = {**os.environ, "DATABASE_POOLED": "1" if pooled else "0"}
    proc = subprocess.Popen(
        [
            sys.executable,
            str(MANAGE),
            "pgqueue_worker",
            "-v",
            "0",
            "--processes",
            str(processes),
            "--concurrency",
            str(concurrency),
            "--worker-id",
            worker_id,
            "--poll-interval",
            "0.2",
            "--lease-seconds",
            "6",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 90
        most: collections.Counter[str] = collections.Counter()
        while time.monotonic() < deadline:
            seen = roles(worker_id)
            if sum(seen.values()) > sum(most.values()):
                most = seen
            ready = seen["runner"] >= slots and seen["heartbeat"] >= processes
            if ready and sum(seen.values()) == sum(most.values()):
                time.sleep(0.5)  # let the last threads connect
                seen = roles(worker_id)
                return seen if sum(seen.values()) >= sum(most.values()) else most
            time.sleep(0.1)
        return most
    finally:
        # Two signals: every process (a supervisor's children too) aborts at once.
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 4])
    args = parser.parse_args()
    prepare()
    print("| --processes | --concurrency | direct: total (by role) | pooled, no listener |")
    print("|---|---|---|---|")
    for processes in args.processes:
        for concurrency in args.concurrency:
            direct = measure(processes, concurrency, pooled=False)
            pooled = measure(processes, concurrency, pooled=True)
            by_role = ", ".join(f"{role} {n}" for role, n in sorted(direct.items()))
            print(
                f"| {processes} | {concurrency} | {sum(direct.values())} ({by_role}) "
                f"| {sum(pooled.values())} |"
            )


if __name__ == "__main__":
    main()
