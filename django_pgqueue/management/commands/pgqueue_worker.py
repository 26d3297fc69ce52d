"""``manage.py pgqueue_worker``: parse options, configure logging, run a Worker."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from django_pgqueue import bounds
from django_pgqueue.databases import backend_database
from django_pgqueue.management.base import PgQueueCommand, add_backend_argument, configure_logging
from django_pgqueue.validation import QUEUE_NAME_RE
from django_pgqueue.worker.supervisor import ExitCode, Supervisor, run_worker_process


def queue_name(value: str) -> str:
    if not QUEUE_NAME_RE.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a valid queue name (1-64 of A-Z a-z 0-9 _ . -)"
        )
    return value


def worker_id(value: str) -> str:
    """A lease owner name: it is stored in lease_owner (255 characters at most)."""
    if not value or len(value) > 255 or not value.isprintable():
        raise argparse.ArgumentTypeError(
            f"{value[:40]!r} is not a valid worker id (1-255 printable characters)"
        )
    return value


class Command(PgQueueCommand):
    help = "Run jobs from the pgqueue jobs table until stopped (SIGTERM/SIGINT/SIGHUP)."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--processes",
            type=bounds.PROCESSES.parse,
            default=1,
            help="Worker processes under one supervisor, each with --concurrency threads: "
            f"{bounds.PROCESSES.describe()} (default: %(default)r)",
        )
        parser.add_argument(
            "--queue",
            dest="queues",
            action="append",
            type=queue_name,
            help="Queue to work; repeat for several (default: all queues)",
        )
        parser.add_argument(
            "--concurrency",
            type=bounds.CONCURRENCY.parse,
            default=1,
            help="Jobs run at once, one thread and database connection each: "
            f"{bounds.CONCURRENCY.describe()} (default: %(default)r)",
        )
        parser.add_argument(
            "--async-concurrency",
            type=bounds.ASYNC_CONCURRENCY.parse,
            default=None,
            help="Coroutine jobs (async def tasks) run at once on the worker's event loop, "
            f"besides the --concurrency threads; 0 runs them on the threads: "
            f"{bounds.ASYNC_CONCURRENCY.describe()} (default: PGQUEUE_ASYNC_CONCURRENCY)",
        )
        parser.add_argument(
            "--batch-size",
            type=bounds.BATCH_SIZE.parse,
            default=None,
            help="Most jobs claimed per statement: "
            f"{bounds.BATCH_SIZE.describe()}; above the concurrency it prefetches for the "
            "threads, and lets a worker of coroutine tasks claim that many at once "
            "(default: the concurrency; 4 x the concurrency, prefetched, while jobs take "
            "under 10 ms on average)",
        )
        parser.add_argument(
            "--lease-seconds",
            type=bounds.LEASE_SECONDS.parse,
            default=None,
            help=f"Lease per claimed job: {bounds.LEASE_SECONDS.describe()} "
            "(default: PGQUEUE_LEASE_SECONDS)",
        )
        parser.add_argument(
            "--burst",
            action="store_true",
            help="Exit once no job is due: due scheduled jobs and due retries (also of "
            "jobs this run failed) are promoted and run first; jobs and retries due later "
            "are left for the next run (default: %(default)r)",
        )
        parser.add_argument(
            "--max-jobs",
            type=bounds.MAX_JOBS.parse,
            default=None,
            help="Exit after claiming this many jobs: "
            f"{bounds.MAX_JOBS.describe()} (default: %(default)r)",
        )
        parser.add_argument(
            "--max-memory",
            type=bounds.MAX_MEMORY.parse,
            default=None,
            help="Recycle the process once its resident memory, measured between claims, "
            f"is over this many MB: {bounds.MAX_MEMORY.describe()} (default: %(default)r)",
        )
        parser.add_argument(
            "--worker-id",
            type=worker_id,
            default=None,
            help="Lease owner name (default: host:pid:random)",
        )
        parser.add_argument(
            "--grace-seconds",
            type=bounds.GRACE_SECONDS.parse,
            default=None,
            help="After SIGTERM, how long running jobs may take before the worker exits "
            f"and leaves them to lease expiry: {bounds.GRACE_SECONDS.describe()} "
            "(default: PGQUEUE_SHUTDOWN_GRACE_SECONDS)",
        )
        parser.add_argument(
            "--stop-seconds",
            type=bounds.STOP_SECONDS.parse,
            default=None,
            help="With --processes: after SIGTERM, how long the supervisor waits for its "
            "worker processes before it SIGKILLs those still running: "
            f"{bounds.STOP_SECONDS.describe()} (default: PGQUEUE_SUPERVISOR_STOP_SECONDS)",
        )
        add_backend_argument(parser)
        parser.add_argument(
            "--poll-interval",
            type=bounds.POLL_INTERVAL.parse,
            default=None,
            help="How long an idle worker waits between polls: "
            f"{bounds.POLL_INTERVAL.describe()} (default: PGQUEUE_POLL_INTERVAL)",
        )

    def handle(
        self,
        *,
        processes: int,
        queues: list[str] | None,
        concurrency: int,
        async_concurrency: int | None,
        batch_size: int | None,
        lease_seconds: float | None,
        burst: bool,
        max_jobs: int | None,
        max_memory: int | None,
        worker_id: str | None,
        poll_interval: float | None,
        grace_seconds: float | None,
        stop_seconds: float | None,
        backend: str | None,
        verbosity: int,
        **options: Any,
    ) -> None:
        configure_logging(verbosity)
        database = backend_database(backend)
        self.check_server(database)
        self.check_migrated(database)
        worker_options = {
            "queues": queues,
            "concurrency": concurrency,
            "async_concurrency": async_concurrency,
            "batch_size": batch_size,
            "lease_seconds": lease_seconds,
            "burst": burst,
            "max_jobs": max_jobs,
            "max_memory": max_memory,
            "worker_id": worker_id,
            "poll_interval": poll_interval,
            "grace_seconds": grace_seconds,
            "backend": backend,
        }
        if processes == 1:
            code = run_worker_process(worker_options, None)
            if code == ExitCode.ABORTED:
                # Leave now, as a supervisor's child does: an ordinary exit joins the
                # threads of the event loop's pool, one of which may be in a job's
                # blocking call for a long while. Logs are flushed first.
                logging.shutdown()
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(int(code))
        else:
            supervisor = Supervisor(
                processes=processes,
                run_child=lambda index, parent: run_worker_process(worker_options, index, parent),
                stop_seconds=stop_seconds,
                burst=burst,
            )
            code = supervisor.run()
        if code:
            # See ExitCode: 1 aborted, 3 fatal (restart me), 4 a child did not drain.
            sys.exit(int(code))
