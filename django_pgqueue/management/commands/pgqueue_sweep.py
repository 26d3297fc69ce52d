"""``manage.py pgqueue_sweep``: recover expired leases, promote due jobs, prune, and
enqueue the due ticks of periodic jobs."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from typing import Any

from django.core.management.base import CommandError

from django_pgqueue import bounds
from django_pgqueue.databases import backend_database
from django_pgqueue.exceptions import NotMigrated
from django_pgqueue.management.base import PgQueueCommand, add_backend_argument, configure_logging
from django_pgqueue.signals import Abort, on_stop
from django_pgqueue.sweeper import Sweeper


def aware_datetime(value: str) -> dt.datetime:
    """An ISO 8601 date and time with its UTC offset (``2030-01-01T03:00:00+00:00``)."""
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an ISO 8601 date and time") from None
    if parsed.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{value!r} has no UTC offset (add +00:00 or Z)")
    return parsed


class Command(PgQueueCommand):
    help = (
        "Run one sweep pass (or --loop): recover, dead-letter, promote, prune, and "
        "enqueue due periodic jobs."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--loop",
            action="store_true",
            help="Keep sweeping every --interval seconds (default: %(default)r)",
        )
        parser.add_argument(
            "--interval",
            type=bounds.SWEEP_INTERVAL.parse,
            default=5.0,
            help="How long to wait between passes with --loop: "
            f"{bounds.SWEEP_INTERVAL.describe()} (default: %(default)r)",
        )
        add_backend_argument(parser)
        parser.add_argument(
            "--now",
            type=aware_datetime,
            default=None,
            help="For testing schedules: pin the clock of the periodic part of each pass "
            "to this ISO 8601 time instead of the database's; recovery, promotion and "
            "pruning keep the database's clock (default: %(default)r)",
        )
        parser.add_argument(
            "--now-step",
            type=bounds.SWEEP_INTERVAL.parse,
            default=None,
            help="For tests, with --now: move the pinned clock forward after each pass by "
            f"{bounds.SWEEP_INTERVAL.describe()} (default: %(default)r)",
        )

    def handle(
        self,
        *,
        loop: bool,
        interval: float,
        now: dt.datetime | None,
        now_step: float | None,
        backend: str | None,
        verbosity: int,
        **options: Any,
    ) -> None:
        if now_step is not None and now is None:
            raise CommandError("--now-step needs --now")
        configure_logging(verbosity)
        database = backend_database(backend)
        self.check_server(database)
        self.check_migrated(database)
        sweeper = Sweeper(interval=interval, now=now, now_step=now_step, backend=backend)
        try:
            if not loop:
                result = sweeper.run_once()
                self.stdout.write(
                    f"recovered={result.recovered} dead={result.dead} "
                    f"promoted={result.promoted} pruned={result.pruned} "
                    f"periodic={result.periodic} cancelled={result.cancelled} "
                    f"lost_workers={result.lost_workers}"
                )
                return
            with on_stop(sweeper.stop, finishing="finishing the current sweep pass"):
                sweeper.run_forever()
        except Abort:
            sys.exit(1)
        except NotMigrated as exc:  # the tables went away after the start-up check
            raise CommandError(str(exc)) from exc
