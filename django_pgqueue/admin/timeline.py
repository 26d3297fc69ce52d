"""A job's timeline on its page: what happened to it, in order, from its own row.

The row keeps when it was enqueued, each failed attempt (its error entry: attempt,
worker, time, exception), the last attempt's claim (worker, start), snoozes,
cancellation, progress and its end; a workflow's links are shown beside it (the
workflow section). Attempts that ended without an error leave no entry of their own: a
done job's last attempt is its end. Nothing is read beyond the row.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.contrib import admin
from django.utils.dateparse import parse_datetime
from django.utils.html import format_html, format_html_join

from ..models import Job
from .base import error_line

#: Most error entries the timeline lists (the newest; the errors section has them all).
MAX_ATTEMPTS_SHOWN = 50


def _when(value: Any) -> dt.datetime | None:
    if isinstance(value, dt.datetime):
        return value
    if isinstance(value, str):
        try:
            return parse_datetime(value)
        except ValueError:
            return None
    return None


def events(job: Job) -> list[tuple[dt.datetime | None, str]]:
    """``(when, what)`` for each thing the row records, oldest first (an event without
    a time last)."""
    found: list[tuple[dt.datetime | None, str]] = []
    enqueued = f"enqueued to queue {job.queue}, priority {job.priority}"
    if job.idempotency_key:
        enqueued += f", key {job.idempotency_key}"
    if job.tags:
        enqueued += f", tags {', '.join(job.tags)}"
    if job.workflow_id is not None:
        enqueued += f", in workflow {job.workflow_id}"
    found.append((job.created_at, enqueued))
    if job.run_at and job.created_at and job.run_at > job.created_at:
        found.append((job.run_at, "due (its run time)"))
    errors = job.errors if isinstance(job.errors, list) else []
    for entry in errors[-MAX_ATTEMPTS_SHOWN:]:
        if not isinstance(entry, dict):
            continue
        found.append(
            (
                _when(entry.get("at")),
                f"attempt {entry.get('attempt', '?')} on {entry.get('worker_id') or '—'} "
                f"ended: {entry.get('exception_class_path', '?')}: "
                f"{error_line(str(entry.get('traceback', '')))}",
            )
        )
    if job.last_attempted_at:
        found.append(
            (
                job.last_attempted_at,
                f"attempt {job.attempts} of {job.max_attempts} claimed by "
                f"{job.lease_owner or 'a worker'}",
            )
        )
    if job.snoozes:
        found.append((None, f"snoozed {job.snoozes} time{'s' if job.snoozes != 1 else ''}"))
    if job.cancel_requested_at:
        found.append((job.cancel_requested_at, "cancellation requested"))
    if job.progress is not None:
        found.append((None, "progress reported (see Progress)"))
    if job.finished_at:
        found.append((job.finished_at, f"ended {job.status}"))
    dated = sorted((e for e in found if e[0] is not None), key=lambda e: e[0])  # type: ignore[arg-type,return-value]
    return dated + [e for e in found if e[0] is None]


class TimelineDisplay:
    """The ``timeline_display`` field of the job page."""

    @admin.display(description="timeline")
    def timeline_display(self, obj: Job) -> str:
        rows = (
            ("" if when is None else when.isoformat(sep=" ", timespec="seconds"), what)
            for when, what in events(obj)
        )
        return format_html(
            '<ol class="pgqueue-timeline">{}</ol>',
            format_html_join("", "<li><time>{}</time> {}</li>", rows),
        )
