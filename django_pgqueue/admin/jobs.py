"""The job list: every job, read-only, a summary of the queue's health above it, and
the cancel action."""

from __future__ import annotations

import logging
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import quote, unquote
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html

from .. import flow, monitoring
from ..models import LIVE_STATUSES, Job
from ..monitoring import queue_summary
from .base import (
    actor,
    admin_database,
    human_duration,
    job_id,
    log_change,
    timestamp,
)
from .bulk_actions import BulkActions, confirmation, selection
from .filters import BackendFilter, QueueFilter, TaskFilter
from .read_only_jobs import ReadOnlyJobAdmin
from .tags import TagFilter, TagsColumn
from .timeline import TimelineDisplay

logger = logging.getLogger(__name__)

CANCEL_PERMISSION = "django_pgqueue.cancel_job"


def why_waiting(job: Job, alias: str) -> list[str]:
    """Why a job that has not started waits, as far as the queue knows: its run time,
    its parents, a paused queue, a full limit (its key's or its queue's budget)."""
    if job.status == Job.Status.SCHEDULED:
        return [f"due at {timestamp(job.run_at)}"]
    if job.status == Job.Status.WAITING:
        return ["waiting for the jobs it depends on to finish (see its parents below)"]
    view = flow.load(alias)
    reasons = []
    if job.queue in view.paused:
        reasons.append(f"queue {job.queue!r} is paused: no worker claims from it")
    for budget in monitoring.budgets(view, using=alias):
        mine = (budget.kind == "queue" and budget.subject == job.queue) or (
            budget.kind == "key" and job.concurrency_key and budget.subject == job.concurrency_key
        )
        if mine and budget.full:
            reasons.append(f"limit {budget.limit} is full ({budget.running} running)")
    if not reasons:
        reasons.append("ready: the next free worker of its queue takes it")
    return reasons


@admin.register(Job)
class JobAdmin(BulkActions, TagsColumn, TimelineDisplay, ReadOnlyJobAdmin):
    """Every job, read-only, with a summary of the queue's health above the list."""

    change_list_template = "admin/django_pgqueue/job/change_list.html"
    change_form_template = "admin/django_pgqueue/job/change_form.html"
    list_display = (
        "id",
        "task",
        "queue",
        "status_column",
        "attempts_display",
        "run_at",
        "worker_link",
        "tags_display",
        "last_error_line",
    )
    list_filter = (
        BackendFilter,
        "status",
        QueueFilter,
        TaskFilter,
        TagFilter,
        ("created_at", admin.DateFieldListFilter),
    )
    actions = ("retry_now_selected", "cancel_selected", "delete_finished_selected")
    readonly_fields = (*ReadOnlyJobAdmin.readonly_fields, "status_display", "timeline_display")
    fieldsets = tuple(
        (name, {"fields": tuple("status_display" if f == "status" else f for f in opts["fields"])})
        for name, opts in ReadOnlyJobAdmin.fieldsets
    )

    @admin.display(description="status", ordering="status")
    def status_column(self, obj: Job) -> str:
        """The status; a running job asked to stop says so (it stays running until its
        task returns or its worker is told)."""
        if obj.status == Job.Status.RUNNING and obj.cancel_requested_at is not None:
            return format_html(
                '{} <span class="pgqueue-cancel-requested" title="{}">(cancel requested)</span>',
                obj.get_status_display(),
                f"cancellation requested at {timestamp(obj.cancel_requested_at)}",
            )
        return obj.get_status_display()

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        """The job's sections, then its timeline (``timeline.events``)."""
        return [
            *super().get_fieldsets(request, obj),
            ("Timeline", {"fields": ("timeline_display",)}),
        ]

    @admin.display(description="status")
    def status_display(self, obj: Job) -> str:
        """A dead job's status links to its dead-letter page, where it can be requeued;
        a running job asked to stop says since when."""
        if obj.status == Job.Status.RUNNING and obj.cancel_requested_at is not None:
            return format_html(
                "Running, asked to stop at {}: its task is told (current_job()."
                "cancel_requested) and the job ends cancelled when it returns",
                timestamp(obj.cancel_requested_at),
            )
        if obj.status in (Job.Status.PENDING, Job.Status.SCHEDULED, Job.Status.WAITING):
            reasons = why_waiting(obj, obj._state.db or Job.objects.db_alias)
            if reasons:
                return format_html("{}: {}", obj.get_status_display(), "; ".join(reasons))
        if obj.status != Job.Status.DEAD:
            return obj.get_status_display()
        url = reverse(
            "admin:django_pgqueue_deadletter_change",
            args=[obj.pk],
            current_app=self.admin_site.name,
        )
        return format_html('{} (<a href="{}">requeue or discard it</a>)', "Dead", url)

    @admin.display(description="worker")
    def worker_link(self, obj: Job) -> str:
        """A running job's lease owner, linked to its row in the workers list."""
        if obj.status != Job.Status.RUNNING or not obj.lease_owner:
            return ""
        url = reverse(
            "admin:django_pgqueue_workerprocess_change",
            args=[quote(obj.lease_owner)],
            current_app=self.admin_site.name,
        )
        return format_html('<a href="{}">{}</a>', url, obj.lease_owner)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Dead letters are discarded from their own page; other jobs are not deleted
        # by hand (done jobs are pruned by the sweeper).
        return False

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(CANCEL_PERMISSION)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        """The job page, with a *Cancel this job* button for a live job not yet asked
        to stop, to whoever may cancel: it posts the list's *Cancel selected jobs*
        action for this job, so the same confirmation page, statement and log follow."""
        extra_context = dict(extra_context or {})
        pk = job_id(unquote(object_id))
        if pk is not None and self.has_cancel_permission(request):
            cancellable = (
                Job.objects.using(admin_database(request))
                .filter(pk=pk, status__in=LIVE_STATUSES, cancel_requested_at__isnull=True)
                .exists()
            )
            if cancellable:
                extra_context["pgqueue_cancel"] = {
                    "url": reverse(
                        "admin:django_pgqueue_job_changelist", current_app=self.admin_site.name
                    ),
                    "id": pk,
                    "checkbox": helpers.ACTION_CHECKBOX_NAME,
                }
        return super().change_view(request, object_id, form_url, extra_context)

    @admin.action(permissions=["cancel"], description="Cancel selected jobs")
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        """A confirmation page first; then one guarded statement per batch
        (``Job.objects.cancel``), and a message saying what changed and what did not."""
        ids = selection(self, request, queryset)
        if ids is None:
            return None
        if not request.POST.get("post"):
            return confirmation(
                self,
                request,
                ids,
                action="cancel_selected",
                title="Cancel jobs",
                question="Pending, scheduled and waiting jobs will never run, nor what "
                "waits on them. Running jobs are asked to stop: their worker learns it at "
                "once (or at its next lease extension), and they end cancelled whatever "
                "their outcome (a transactional task's effects roll back). Finished jobs "
                "are left alone.",
                button="Yes, cancel them",
            )
        result = Job.objects.db_manager(admin_database(request)).cancel(ids)
        logger.info(
            "%s cancelled %d and requested cancellation of %d of %d selected jobs: %s %s",
            request.user.get_username(),
            len(result.cancelled),
            len(result.requested),
            len(ids),
            result.cancelled,
            result.requested,
            extra={
                "action": "cancel",
                "job_ids": result.cancelled + result.requested,
                **actor(request),
            },
        )
        changed = result.cancelled + result.requested
        log_change(request, changed, "Cancelled from the admin.")
        parts = [
            f"Cancelled {len(result.cancelled)} job{'s' if len(result.cancelled) != 1 else ''}"
        ]
        if result.requested:
            parts.append(
                f"asked {len(result.requested)} running job"
                f"{'s' if len(result.requested) != 1 else ''} to stop (job "
                + ", ".join(str(i) for i in result.requested[:10])
                + ")"
            )
        missed = len(ids) - len(changed)
        if missed:
            parts.append(
                f"{missed} of {len(ids)} selected not cancelled: already finished (done, "
                "dead or cancelled) or busy at that instant"
            )
        self.message_user(
            request, "; ".join(parts) + ".", messages.SUCCESS if changed else messages.WARNING
        )
        return None

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if self.has_view_permission(request):
            extra_context = {**(extra_context or {}), **self.summary_context(request)}
        return super().changelist_view(request, extra_context)

    def summary_context(self, request: HttpRequest) -> dict[str, Any]:
        """Counts per status and queue, the longest wait and expired leases."""
        summary = queue_summary(admin_database(request))
        totals = []
        for status, label in Job.Status.choices:
            total = summary.totals.get(status)
            if status in summary.estimated and total is not None:
                shown = f"≈ {total:,}"
            elif status in summary.capped:
                shown = f"≥ {total:,}"
            else:
                shown = "?" if total is None else f"{total:,}"
            totals.append({"status": status, "label": label, "shown": shown})
        queue_rows = [
            {"queue": queue, "counts": [summary.live.get((s, queue), 0) for s in LIVE_STATUSES]}
            for queue in summary.queues
        ]
        return {
            "pgqueue_summary": {
                "totals": totals,
                "live_statuses": LIVE_STATUSES,
                "queue_rows": queue_rows,
                "cap": summary.cap,
                "capped": bool(summary.capped),
                "oldest_pending_wait": human_duration(summary.oldest_pending_wait),
                "expired_leases": summary.expired_leases,
                "dead_letters_url": reverse(
                    "admin:django_pgqueue_deadletter_changelist", current_app=self.admin_site.name
                ),
            }
        }
