"""``manage.py pgqueue_sweep``: recover expired leases, promote due jobs, prune."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from django.core.management.base import CommandError

from django_pgqueue import limits
from django_pgqueue.exceptions import NotMigrated
from django_pgqueue.management.base import PgQueueCommand
from django_pgqueue.management.commands.pgqueue_worker import configure_logging
from django_pgqueue.signals import Abort, on_stop
from django_pgqueue.sweeper import Sweeper


class Command(PgQueueCommand):
    help = "Run one sweep pass (or --loop): recover, dead-letter, promote, prune."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--loop",
            action="store_true",
            help="Keep sweeping every --interval seconds (default: %(default)r)",
        )
        parser.add_argument(
            "--interval",
            type=limits.SWEEP_INTERVAL.parse,
            default=5.0,
            help="How long to wait between passes with --loop: "
            f"{limits.SWEEP_INTERVAL.describe()} (default: %(default)r)",
        )

    def handle(self, *, loop: bool, interval: float, verbosity: int, **options: Any) -> None:
        configure_logging(verbosity)
        self.check_server()
        self.check_migrated()
        sweeper = Sweeper(interval=interval)
        try:
            if not loop:
                result = sweeper.run_once()
                self.stdout.write(
                    f"recovered={result.recovered} dead={result.dead} "
                    f"promoted={result.promoted} pruned={result.pruned}"
                )
                return
            with on_stop(sweeper.stop):
                sweeper.run_forever()
        except Abort:
            sys.exit(1)
        except NotMigrated as exc:  # the tables went away after the start-up check
            raise CommandError(str(exc)) from exc
