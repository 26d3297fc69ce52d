"""Worker processes: who runs, where, since when, holding how many jobs; read-only
(the workers write their own rows, the sweeper prunes them)."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest, QueryDict
from django.urls import reverse
from django.utils.html import format_html

from ..models import WorkerProcess, WorkerQuerySet
from ..states import Status
from .base import ViewOnlyAdmin


@admin.register(WorkerProcess)
class WorkerProcessAdmin(ViewOnlyAdmin):
    """The workers table, read-only: who runs, where, since when, holding how many jobs.

    Rows are written by the workers themselves (and pruned by the sweeper), never here.
    """

    # Fits a 1400 px window: the host and pid are in the id (host:pid:random), the
    # version and lease on the detail page, the counters in one cell.
    list_display = (
        "id",
        "state",
        "queues_display",
        "concurrency",
        "started_at",
        "last_seen_at",
        "jobs_counts",
    )
    readonly_fields = (
        "id",
        "state",
        "hostname",
        "pid",
        "queues_display",
        "concurrency",
        "lease_seconds",
        "version",
        "started_at",
        "last_seen_at",
        "jobs_held",
        "jobs_done",
        "jobs_failed",
        "rss_bytes",
        "restarts",
        "running_jobs",
    )
    fields = readonly_fields
    search_fields = ("id", "hostname")
    list_per_page = 100
    sortable_by = ("id", "hostname", "started_at", "last_seen_at")

    # Not deleted by hand either: a live worker would register again at its next beat.

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        queryset = super().get_queryset(request)
        assert isinstance(queryset, WorkerQuerySet)
        return queryset.with_state()

    @admin.display(description="state", boolean=False)
    def state(self, obj: WorkerProcess) -> str:
        """Lost: not seen for longer than its lease (judged by the database clock)."""
        return "lost" if getattr(obj, "lost", False) else "live"

    @admin.display(description="queues")
    def queues_display(self, obj: WorkerProcess) -> str:
        return ", ".join(obj.queues) if obj.queues else "all"

    @admin.display(description="jobs held / done / failed")
    def jobs_counts(self, obj: WorkerProcess) -> str:
        return f"{obj.jobs_held:,} / {obj.jobs_done:,} / {obj.jobs_failed:,}"

    @admin.display(description="running jobs")
    def running_jobs(self, obj: WorkerProcess) -> str:
        url = reverse("admin:django_pgqueue_job_changelist", current_app=self.admin_site.name)
        # Encoded: a worker id may hold "&", "#" or "=" (any printable characters).
        query = QueryDict(mutable=True)
        query.update({"status__exact": Status.RUNNING.value, "lease_owner": obj.id})
        return format_html('<a href="{}?{}">jobs this worker holds</a>', url, query.urlencode())
