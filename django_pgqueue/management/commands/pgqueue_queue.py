"""``manage.py pgqueue_queue``: pause and resume queues at run time, and list them.

``pause NAME``: no worker claims from queue NAME once told (a NOTIFY at commit, or
within about a second), its pending jobs stay pending and its running ones finish;
``resume NAME``: workers claim from it again at once; ``list``: every queue with jobs
or a state, paused or not, with its pending and running jobs.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from django.core.management.base import CommandError

from django_pgqueue import monitoring, validation
from django_pgqueue.databases import backend_database
from django_pgqueue.exceptions import InvalidJob
from django_pgqueue.management.base import PgQueueCommand, add_backend_argument
from django_pgqueue.models import Job


def queue_name(value: str) -> str:
    """argparse ``type=``: a valid queue name."""
    try:
        return validation.queue_name(value)
    except InvalidJob as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class Command(PgQueueCommand):
    help = "Pause or resume a queue at run time (pause NAME, resume NAME), or list queues."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        for action, text in (
            ("pause", "Stop workers claiming from queue NAME (running jobs finish)."),
            ("resume", "Let workers claim from queue NAME again."),
        ):
            sub = actions.add_parser(action, help=text, description=text)
            sub.add_argument("name", type=queue_name, metavar="NAME", help="The queue")
            add_backend_argument(sub)
        listing = actions.add_parser(
            "list",
            help="Every queue with jobs or a state: paused or not, pending, running.",
            description="Every queue with jobs or a state: paused or not, pending, running.",
        )
        listing.add_argument(
            "--json", action="store_true", help="Print one JSON object (default: %(default)r)"
        )
        add_backend_argument(listing)

    def handle(self, *, action: str, backend: str | None, **options: Any) -> None:
        using = backend_database(backend)
        self.check_migrated(using)
        jobs = Job.objects.db_manager(using)
        if action == "pause":
            jobs.pause_queue(options["name"])
            self.stdout.write(f"queue {options['name']!r} paused")
        elif action == "resume":
            if jobs.resume_queue(options["name"]):
                self.stdout.write(f"queue {options['name']!r} resumed")
            else:
                raise CommandError(f"queue {options['name']!r} is not paused")
        else:
            self.list_queues(using, as_json=options["json"])

    def list_queues(self, using: str, *, as_json: bool) -> None:
        snap = monitoring.snapshot(using=using)
        if as_json:
            self.stdout.write(
                json.dumps(
                    {
                        name: {
                            "paused": q.paused,
                            "fair": name in snap.fair,
                            "pending": q.pending,
                            "running": q.running,
                        }
                        for name, q in sorted(snap.queues.items())
                    },
                    sort_keys=True,
                )
            )
            return
        if not snap.queues:
            self.stdout.write("No queues: no jobs, no paused queue and no live workers.")
            return
        width = max(len(name) for name in snap.queues)
        for name, q in sorted(snap.queues.items()):
            state = "paused" if q.paused else "running"
            fair = " fair" if name in snap.fair else ""
            self.stdout.write(
                f"{name.ljust(width)}  {state}{fair}  pending={q.pending:,} running={q.running:,}"
            )
