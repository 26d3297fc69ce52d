"""The sweeper: one bounded maintenance pass, once or on an interval.

Each pass rescues expired leases (to pending, or dead on the last attempt), promotes
due scheduled jobs and prunes old done jobs (see ``JobManager.sweep``), then enqueues
the due ticks of periodic entries (see ``periodic.py``). Several sweepers may run at
once: every statement uses SKIP LOCKED, and each tick is enqueued once.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import threading

from django.db import DatabaseError, close_old_connections

from . import periodic
from .databases import backend_database
from .exceptions import NotMigrated
from .manager import SweepResult
from .models import Job
from .worker.connections import close_connection, first_line
from .worker.retry import Retry

logger = logging.getLogger(__name__)


class Sweeper:
    """Sweeps every ``interval`` seconds the jobs database of ``TASKS[backend]`` (None:
    the default alias). ``now`` pins the database clock the passes use (for tests, like
    ``%(now)s`` in the SQL); with ``now_step`` each pass after the first moves the
    pinned clock that many seconds forward."""

    def __init__(
        self,
        *,
        interval: float = 5.0,
        now: dt.datetime | None = None,
        now_step: float | None = None,
        backend: str | None = None,
    ) -> None:
        self.interval = interval
        self.alias = backend_database(backend)
        self.now = now
        self.now_step = now_step
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def run_once(self) -> SweepResult:
        """One pass; logs at info level only when something changed."""
        result = Job.objects.db_manager(self.alias).sweep(now=self.now)
        # Each sweeper enqueues the PGQUEUE_PERIODIC entries whose backend's jobs live
        # in its database (an entry's "backend", default "default").
        ticks = periodic.enqueue_due(using=self.alias, now=self.now)
        result = dataclasses.replace(result, periodic=len(ticks))
        if result:
            logger.info(
                "sweep: recovered=%d dead=%d promoted=%d pruned=%d periodic=%d cancelled=%d"
                " lost_workers=%d",
                result.recovered,
                result.dead,
                result.promoted,
                result.pruned,
                result.periodic,
                result.cancelled,
                result.lost_workers,
                extra={"action": "sweep"},
            )
        if self.now is not None and self.now_step:
            self.now += dt.timedelta(seconds=self.now_step)
        return result

    def run_forever(self) -> None:
        """Sweep every ``interval`` seconds until stopped; database errors are logged
        and retried with backoff, except ``NotMigrated``, which is raised."""
        retry = Retry(self.alias, stop=self._stop)
        while not self._stop.is_set():
            close_old_connections()
            try:
                self.run_once()
                retry.succeeded()
            except DatabaseError as exc:
                if isinstance(exc, NotMigrated):
                    raise  # no retry cures a missing table
                delay = retry.failed()
                logger.warning(
                    "sweep failed (%s); retrying in %.1fs",
                    first_line(exc),
                    delay,
                    extra={"action": "db_error"},
                )
                close_connection(self.alias)
            if retry.failures:
                retry.wait()
            else:
                self._stop.wait(self.interval)
