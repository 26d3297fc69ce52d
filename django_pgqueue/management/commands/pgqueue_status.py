"""``manage.py pgqueue_status``: per-queue figures and live workers, for people
(a table), for scripts (``--json``) and for probes (``--check``)."""

from __future__ import annotations

import argparse
import json
import sys
import threading
from typing import Any

from django.core.management.base import CommandError
from django.db import DatabaseError

from django_pgqueue import deadline, flow, monitoring, schema, validation
from django_pgqueue.bounds import DAY, Bounds
from django_pgqueue.databases import backend_database
from django_pgqueue.exceptions import DeadlineExceeded, InvalidJob, first_line
from django_pgqueue.management.base import PgQueueCommand, add_backend_argument
from django_pgqueue.monitoring import Snapshot
from django_pgqueue.signals import Abort, on_stop

#: ANSI: cursor home, clear screen (``--watch`` redraws in place).
CLEAR = "\x1b[H\x1b[2J"

#: Ranges of the flags (argparse ``type=``: an out-of-range value exits 2 naming it).
WATCH = Bounds(0.1, DAY, unit="seconds")
LATENCY = Bounds(0, 365 * DAY, unit="seconds")
COUNT = Bounds(0, 2**62, integer=True)
TIMEOUT = Bounds(0.1, DAY, unit="seconds")

#: Exit status when the database gives no answer (timeout, unreachable): not "1", which
#: --check gives for a threshold exceeded, nor "2", a usage error.
NO_ANSWER = 3


def age(seconds: float | None) -> str:
    """'—', '850 ms', '42 s', '3 min 5 s', '2 h 10 min', '1 d 4 h'."""
    if seconds is None:
        return "—"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "min"), (secs, "s")]
    return " ".join(f"{n} {unit}" for n, unit in parts if n)[:20] or "0 s"


#: The queue table's columns after the queue's name: QueueStats fields, in order.
QUEUE_FIGURES = (
    ("pending", "pending"),
    ("scheduled", "scheduled"),
    ("waiting", "waiting"),
    ("running", "running"),
    ("dead", "dead"),
    ("done/5m", "done_5m"),
    ("failed/5m", "failed_5m"),
    ("cancelled/5m", "cancelled_5m"),
    ("finished/s", "finished_per_second"),
)
#: The workers table's columns.
WORKER_HEADER = (
    "id",
    "state",
    "host",
    "pid",
    "queues",
    "conc",
    "held",
    "done",
    "failed",
    "rss",
    "restarts",
    "version",
    "up",
    "last seen",
)


def render_table(snap: Snapshot) -> str:
    """The human view: one line per queue, then one per worker."""
    rows = [("queue", *(title for title, _ in QUEUE_FIGURES), "oldest pending")]
    rows += [_queue_row(q, snap) for q in snap.queues.values()]
    lines = _columns(rows) if snap.queues else ["No queues: no jobs and no live workers."]
    if any(q.estimated - q.lower_bound for q in snap.queues.values()):
        lines.append(f"~ estimated (a status over {snap.cap:,} rows, or a busy window)")
    if any(q.lower_bound for q in snap.queues.values()):
        lines.append(f"≥ at least: counting stopped at {snap.cap:,}")
    if snap.budgets:
        lines += ["", "Limits:", *render_budgets(snap.budgets)]
    live = snap.live_workers
    lost = len(snap.workers) - len(live)
    lines += ["", f"Workers: {len(live)} live" + (f", {lost} lost" if lost else "")]
    if snap.workers:
        lines += _columns([WORKER_HEADER, *(_worker_row(w, snap) for w in snap.workers)])
    return "\n".join(lines)


def _figure(q: monitoring.QueueStats, name: str) -> str:
    """A queue's figure, "≥ " when a count stopped at its cap, "~" when estimated."""
    value = getattr(q, name)
    text = f"{value:,.2f}" if isinstance(value, float) else f"{value:,}"
    if name in q.lower_bound:
        return "≥ " + text
    return ("~" if name in q.estimated else "") + text


def _queue_row(q: monitoring.QueueStats, snap: Snapshot) -> tuple[str, ...]:
    oldest = age(q.oldest_pending_age)
    if "oldest_pending_age" in q.estimated and q.oldest_pending_age is not None:
        oldest = "≥ " + oldest
    marks = [m for m, on in (("paused", q.paused), ("fair", q.queue in snap.fair)) if on]
    return (
        q.queue + (f" ({', '.join(marks)})" if marks else ""),
        *(_figure(q, name) for _, name in QUEUE_FIGURES),
        oldest,
    )


def _worker_row(w: monitoring.WorkerInfo, snap: Snapshot) -> tuple[str, ...]:
    return (
        w.id,
        w.state,
        w.hostname,
        str(w.pid),
        ",".join(w.queues) if w.queues else "*",
        str(w.concurrency),
        str(w.jobs_held),
        f"{w.jobs_done:,}",
        f"{w.jobs_failed:,}",
        "-" if w.rss_bytes is None else f"{w.rss_bytes / 2**20:.0f} MB",
        str(w.restarts),
        w.version,
        age((snap.taken_at - w.started_at).total_seconds()),
        age(w.unseen_for.total_seconds()) + " ago",
    )


def render_budgets(budgets: list[monitoring.BudgetStats]) -> list[str]:
    """One line per budget: what runs against its concurrency, what started against
    its rate, what is pending and what the limit holds back now."""
    rows: list[tuple[str, ...]] = [("limit", "key", "running", "started", "pending", "waiting")]
    for b in budgets:
        running = f"{b.running:,}" + ("" if b.concurrency is None else f" / {b.concurrency:,}")
        started = "—" if b.rate is None else f"{b.started:,} / {flow.format_rate(b.rate)}"
        pending = ("≥ " if b.capped else "") + f"{b.pending:,}"
        waiting = ("≥ " if b.capped and b.waiting else "") + f"{b.waiting:,}"
        rows.append((b.limit, b.subject, running, started, pending, waiting))
    return _columns(rows)


def _columns(rows: list[tuple[str, ...]]) -> list[str]:
    """Aligned columns: numbers to the right, text to the left."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    numeric = [
        i > 0
        and all(
            row[i].lstrip("~≥ ").replace(",", "").replace(".", "").isdigit() for row in rows[1:]
        )
        for i in range(len(widths))
    ]
    out = []
    for row in rows:
        cells = [
            cell.rjust(width) if numeric[i] else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        out.append("  ".join(cells).rstrip())
    return out


def problems(
    snap: Snapshot,
    *,
    max_latency: float | None,
    max_dead: int | None,
    min_workers: int | None,
) -> list[str]:
    """What is over its threshold, one sentence each (empty: all is well)."""
    found = []
    for q in snap.queues.values():
        if max_latency is not None and (q.oldest_pending_age or 0.0) > max_latency:
            found.append(
                f"queue {q.queue!r}: oldest pending job waited {q.oldest_pending_age:.1f}s "
                f"(max {max_latency:g}s)"
            )
        if max_dead is not None and q.dead > max_dead:
            found.append(f"queue {q.queue!r}: {q.dead} dead jobs (max {max_dead})")
    live = len(snap.live_workers)
    if min_workers is not None and live < min_workers:
        found.append(f"{live} live workers (min {min_workers})")
    return found


class Command(PgQueueCommand):
    help = "Show each queue's backlog, throughput and latency, and the live workers."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--json",
            action="store_true",
            help="Print one JSON object (with --watch: one per line) (default: %(default)r)",
        )
        parser.add_argument(
            "--watch",
            type=WATCH.parse,
            default=None,
            metavar="SECONDS",
            help="Refresh every SECONDS until interrupted (default: %(default)r)",
        )
        parser.add_argument(
            "--check",
            action="store_true",
            help="Exit 1 naming every threshold that is exceeded, else 0 (default: %(default)r)",
        )
        parser.add_argument(
            "--max-latency",
            type=LATENCY.parse,
            default=None,
            metavar="SECONDS",
            help="With --check: longest a pending job may have waited (default: %(default)r)",
        )
        parser.add_argument(
            "--max-dead",
            type=COUNT.parse,
            default=None,
            metavar="N",
            help="With --check: most dead jobs a queue may hold (default: %(default)r)",
        )
        parser.add_argument(
            "--min-workers",
            type=COUNT.parse,
            default=None,
            metavar="N",
            help="With --check: fewest live workers (default: %(default)r)",
        )
        parser.add_argument(
            "--timeout",
            type=TIMEOUT.parse,
            default=10.0,
            metavar="SECONDS",
            help="Longest one reading of the figures may take (a locked jobs table, an "
            f"overloaded server); then exit {NO_ANSWER} saying so (default: %(default)r)",
        )
        parser.add_argument(
            "--tag",
            default=None,
            metavar="TAG",
            help="Instead of the queues, count the jobs carrying TAG by status and queue "
            "(through the tags index, at most 100,000 read) (default: %(default)r)",
        )
        add_backend_argument(parser)

    def handle(
        self,
        *,
        json: bool,
        watch: float | None,
        check: bool,
        max_latency: float | None,
        max_dead: int | None,
        min_workers: int | None,
        timeout: float,
        backend: str | None,
        tag: str | None = None,
        **options: Any,
    ) -> None:
        using = backend_database(backend)
        self.timeout = timeout
        if tag is not None:
            self.tag_report(using, tag, json=json, alone=not (check or watch is not None))
            return
        thresholds: dict[str, Any] = {
            "max_latency": max_latency,
            "max_dead": max_dead,
            "min_workers": min_workers,
        }
        given = [f"--{k.replace('_', '-')}" for k, v in thresholds.items() if v is not None]
        if given and not check:
            self.stderr.write(f"pgqueue_status: {', '.join(given)} needs --check")
            sys.exit(2)
        if check and watch is not None:
            self.stderr.write("pgqueue_status: --check and --watch do not go together")
            sys.exit(2)
        self.check_migrated(using)
        if check:
            snap = self.snapshot(using)
            found = problems(snap, **thresholds)
            if json:
                self.stdout.write(_dumps({**snap.as_json(), "problems": found}))
            for line in found:
                self.stderr.write(f"pgqueue_status: {line}")
            if found:
                sys.exit(1)
            if not json:
                self.stdout.write("OK")
            return
        # --watch stops at its first SIGINT or SIGTERM between two snapshots, never by
        # an exception thrown into a query in flight (which can leave the connection
        # waiting on a cancel); a second signal aborts at once.
        stopped = threading.Event()
        try:
            with on_stop(stopped.set, finishing="finishing the current snapshot"):
                while not stopped.is_set():
                    snap = self.snapshot(using)
                    if json:
                        self.stdout.write(_dumps(snap.as_json()))
                    else:
                        prefix = CLEAR if watch is not None else ""
                        self.stdout.write(prefix + render_table(snap))
                    self.stdout.flush()
                    if watch is None:
                        return
                    stopped.wait(watch)
        except Abort:
            return

    def tag_report(self, using: str, tag: str, *, json: bool, alone: bool) -> None:
        """``--tag``: the jobs carrying ``tag``, by status and queue."""
        if not alone:
            self.stderr.write("pgqueue_status: --tag goes with neither --check nor --watch")
            sys.exit(2)
        try:
            validation.tag(tag, source="--tag")
        except InvalidJob as exc:
            self.stderr.write(f"pgqueue_status: {exc}")
            sys.exit(2)
        self.check_migrated(using)
        try:
            with deadline.within(using, self.timeout):
                found = monitoring.tag_count(using, tag)
        except DeadlineExceeded as exc:
            raise CommandError(str(exc), returncode=NO_ANSWER) from exc
        if json:
            self.stdout.write(_dumps(found.as_json()))
            return
        total = sum(found.counts.values())
        more = " (at least: the count stops there)" if found.capped else ""
        lines = [f"tag {tag}: {total:,} jobs{more}"]
        rows: list[tuple[str, ...]] = [("QUEUE", "STATUS", "JOBS")]
        rows.extend((q, s, f"{n:,}") for (s, q), n in found.counts.items())
        if total:
            lines.extend(_columns(rows))
        self.stdout.write("\n".join(lines))

    def snapshot(self, using: str) -> Snapshot:
        """The figures, read within ``--timeout``; a database that does not answer
        (or lacks the tables) stops the command with one line saying so."""
        try:
            with deadline.within(using, self.timeout):
                return monitoring.snapshot(using=using)
        except DeadlineExceeded as exc:
            raise CommandError(str(exc), returncode=NO_ANSWER) from exc
        except DatabaseError as exc:
            missing = schema.not_migrated(exc, using)
            if missing is not None:
                raise CommandError(str(missing)) from exc
            raise CommandError(
                f"database {using!r}: {first_line(exc)}", returncode=NO_ANSWER
            ) from exc


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True)
