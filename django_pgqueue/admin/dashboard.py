"""The admin's queue dashboard: per-queue figures, an hour of throughput and latency
as server-rendered SVG charts (``charts.py``), and the workers.

It is registered on the admin index through the ``Dashboard`` proxy model, shown to
whoever may view jobs, and reads only ``monitoring.py``'s bounded queries, so it costs
the same on 10 million rows as on 10 thousand.
"""

from __future__ import annotations

import datetime as dt
from typing import Any
from urllib.parse import quote as url_quote

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from .. import flow, monitoring
from ..models import Dashboard, Limit
from . import charts
from .base import BREADCRUMBS_AS_LIST, ViewOnlyAdmin, human_duration


def seconds_text(value: float | None) -> str:
    return human_duration(None if value is None else dt.timedelta(seconds=value))


@admin.register(Dashboard)
class DashboardAdmin(ViewOnlyAdmin):
    """The queue at a glance: per-queue figures, an hour of throughput and latency as
    SVG charts, the workers. Read-only, for whoever may view jobs; every figure comes
    from ``monitoring.py``'s bounded queries, so the page is as fast on 10 million rows
    as on 10 thousand."""

    change_list_template = "admin/django_pgqueue/dashboard.html"

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("django_pgqueue.view_job")

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def get_urls(self) -> list[URLPattern]:
        info = self.opts.app_label, self.opts.model_name
        return [
            path(
                "",
                self.admin_site.admin_view(self.changelist_view),
                name="{}_{}_changelist".format(*info),
            )
        ]

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """The dashboard: one snapshot and one hour of history, drawn by the parts below."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        snap = monitoring.snapshot()
        hist = monitoring.history()
        urls = {
            name: reverse(
                f"admin:django_pgqueue_{model}_changelist", current_app=self.admin_site.name
            )
            for name, model in (
                ("jobs", "job"),
                ("dead", "deadletter"),
                ("workers", "workerprocess"),
            )
        }
        limits_url = (
            reverse("admin:django_pgqueue_limit_changelist", current_app=self.admin_site.name)
            if self.admin_site.is_registered(Limit)
            and request.user.has_perm("django_pgqueue.view_limit")
            else None
        )
        context = {
            **self.admin_site.each_context(request),
            "title": "Queue dashboard",
            "breadcrumbs_as_list": BREADCRUMBS_AS_LIST,
            "opts": self.opts,
            "snapshot": snap,
            "queues": [
                _queue_row(q, snap, urls["jobs"], urls["dead"]) for q in snap.queues.values()
            ],
            "headline": _headline(snap, hist),
            "estimated": any(q.estimated for q in snap.queues.values())
            or any(m.estimated for m in hist.minutes),
            **_charts(hist),
            "workers": [self._worker_row(w, snap) for w in snap.workers],
            "budgets": [_budget_row(b) for b in snap.budgets],
            "limits_url": limits_url,
            "jobs_url": urls["jobs"],
            "dead_url": urls["dead"],
            "workers_url": urls["workers"],
            "cap": snap.cap,
            "count_cap": f"{hist.count_cap:,}",
            **(extra_context or {}),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, self.change_list_template, context)

    def _worker_row(self, w: monitoring.WorkerInfo, snap: monitoring.Snapshot) -> dict[str, Any]:
        """A worker process's row of the workers table."""
        return {
            "info": w,
            "url": reverse(
                "admin:django_pgqueue_workerprocess_change",
                args=[quote(w.id)],
                current_app=self.admin_site.name,
            ),
            "up": seconds_text((snap.taken_at - w.started_at).total_seconds()),
            "seen": seconds_text(w.unseen_for.total_seconds()),
            "queues": ", ".join(w.queues) if w.queues else "all",
            "rss_mb": "-" if w.rss_bytes is None else f"{w.rss_bytes / 2**20:.0f}",
        }


def _queue_row(
    q: monitoring.QueueStats, snap: monitoring.Snapshot, jobs_url: str, dead_url: str
) -> dict[str, Any]:
    """A queue's row: each figure a link to the jobs it counts, marked when estimated."""
    name = _qs(q.queue)

    def jobs(status: str) -> str:
        return f"{jobs_url}?status__exact={status}&queue={name}"

    return {
        "name": q.queue,
        "jobs_url": f"{jobs_url}?queue={name}",
        "dead_url": f"{dead_url}?queue={name}",
        "cells": [
            _cell(q, "pending", jobs("pending")),
            _cell(q, "scheduled", jobs("scheduled")),
            _cell(q, "running", jobs("running")),
            _cell(q, "dead", f"{dead_url}?queue={name}", alert=q.dead > 0),
            _cell(q, "done_5m", jobs("done")),
            _cell(q, "failed_5m", f"{dead_url}?queue={name}", alert=q.failed_5m > 0),
            _cell(q, "cancelled_5m", jobs("cancelled")),
        ],
        "rate": f"{q.finished_per_second:,.1f}",
        "rate_estimated": "finished_per_second" in q.estimated
        and "finished_per_second" not in q.lower_bound,
        "rate_lower_bound": "finished_per_second" in q.lower_bound,
        "oldest": seconds_text(q.oldest_pending_age),
        "oldest_lower_bound": "oldest_pending_age" in q.estimated,
        "paused": q.paused,
        "fair": q.queue in snap.fair,
    }


def _budget_row(b: monitoring.BudgetStats) -> dict[str, Any]:
    """A limit's budget in force: what runs and waits under it, full or not."""
    return {
        "limit": b.limit,
        "subject": b.subject,
        "running": f"{b.running:,}",
        "concurrency": None if b.concurrency is None else f"{b.concurrency:,}",
        "concurrency_full": b.concurrency is not None and b.running >= b.concurrency,
        "rate": None if b.rate is None else flow.format_rate(b.rate),
        "rate_full": b.rate is not None and b.started >= b.rate[0],
        "started": f"{b.started:,}",
        "pending": f"{b.pending:,}",
        "waiting": f"{b.waiting:,}",
        "capped": b.capped,
    }


def _charts(hist: monitoring.History) -> dict[str, str]:
    """The hour's three charts: finished, failed (on their own scale: a few among
    thousands must still show), and how long jobs waited."""
    times = [m.start for m in hist.minutes]
    return {
        "throughput_chart": charts.stacked_bars(
            times,
            [charts.Series("finished", [m.finished for m in hist.minutes], "#2e7d32")],
            title="Jobs finished per minute, last hour",
            lower_bounds=[m.lower_bound for m in hist.minutes],
        ),
        "failures_chart": charts.stacked_bars(
            times,
            [charts.Series("failed", [m.failed for m in hist.minutes], "#c62828")],
            title="Jobs failed (dead-lettered) per minute, last hour",
            height=110,
            lower_bounds=[m.failed_lower_bound for m in hist.minutes],
        ),
        "latency_chart": charts.lines(
            times,
            [
                charts.Series("longest wait", [m.wait_max for m in hist.minutes], "#ef6c00"),
                charts.Series("average wait", [m.wait_avg for m in hist.minutes], "#1565c0"),
            ],
            title="Queue latency: how long jobs waited before they started, last hour",
            height=charts.HEIGHT + 110,
        ),
    }


def _headline(snap: monitoring.Snapshot, hist: monitoring.History) -> dict[str, Any]:
    """The figures above the tables, each marked "≥ " where a count stopped at its cap."""
    oldest = max(
        (q.oldest_pending_age for q in snap.queues.values() if q.oldest_pending_age is not None),
        default=None,
    )
    rate = sum(q.finished_per_second for q in snap.queues.values())
    finished = sum(m.finished for m in hist.minutes)
    failed = sum(m.failed for m in hist.minutes)
    return {
        "pending": _at_least(snap, "pending") + f"{snap.total('pending'):,}",
        "running": f"{snap.total('running'):,}",
        "dead": _at_least(snap, "dead") + f"{snap.total('dead'):,}",
        "rate": _at_least(snap, "finished_per_second") + f"{rate:,.1f}",
        "oldest": seconds_text(oldest),
        "live_workers": len(snap.live_workers),
        "lost_workers": len(snap.workers) - len(snap.live_workers),
        "finished_hour": ("≥ " if any(m.lower_bound for m in hist.minutes) else "")
        + f"{finished:,}",
        "failed_hour": ("≥ " if any(m.failed_lower_bound for m in hist.minutes) else "")
        + f"{failed:,}",
    }


def _at_least(snap: monitoring.Snapshot, name: str) -> str:
    """ "≥ " when a queue's count of ``name`` stopped at the cap, so the sum did too."""
    return "≥ " if any(name in q.lower_bound for q in snap.queues.values()) else ""


def _qs(value: str) -> str:
    return url_quote(value, safe="")


def _cell(q: monitoring.QueueStats, name: str, url: str, *, alert: bool = False) -> dict[str, Any]:
    return {
        "value": f"{getattr(q, name):,}",
        "estimated": name in q.estimated and name not in q.lower_bound,
        "lower_bound": name in q.lower_bound,
        "url": url,
        "alert": alert,
        "name": name,
    }
