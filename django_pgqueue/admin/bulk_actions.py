"""Bulk actions of the job list: retry now, cancel, delete finished.

Each asks for confirmation on a page that counts the selection by status, then runs the
manager's guarded operation (``operate.py``: one statement per ``SWEEP_BATCH_SIZE``
ids, rows locked in id order, only jobs still in the state it acts on), and says how
many changed and how many were skipped. "Select all" of a filtered list posts the
selection back as ``select_across`` (never thousands of ids: Django refuses more than
``DATA_UPLOAD_MAX_NUMBER_FIELDS`` fields) and is re-read from the same filters, at
most ``MAX_SELECTED`` jobs. A staff user who may view jobs but lacks an action's
permission gets 403 when posting it, and nothing changes.
"""

from __future__ import annotations

import logging
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.db.models import Count, QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse

from ..models import Job
from .base import BREADCRUMBS_AS_LIST, actor, admin_database, log_change

logger = logging.getLogger(__name__)

#: Most jobs one action takes; "select all" of a bigger list is refused (filter it).
MAX_SELECTED = 100_000
#: Jobs listed by name on a confirmation page.
SHOWN = 100
#: Each action and the permission (``django_pgqueue.<codename>``) it needs.
PERMISSIONS = {
    "retry_now_selected": "django_pgqueue.requeue_job",
    "cancel_selected": "django_pgqueue.cancel_job",
    "delete_finished_selected": "django_pgqueue.delete_job",
}


def plural(count: int, word: str) -> str:
    return f"{count:,} {word}{'' if count == 1 else 's'}"


def selection(model_admin: Any, request: HttpRequest, queryset: QuerySet) -> list[int] | None:
    """The selected ids (``select_across``: the filtered list's, at most
    ``MAX_SELECTED``); None, with a message, when there are more."""
    if request.POST.get("select_across") != "1":
        ids: list[int] = model_admin.selected_ids(request, queryset)
        return ids
    found = list(queryset.order_by().values_list("pk", flat=True)[: MAX_SELECTED + 1])
    if len(found) > MAX_SELECTED:
        model_admin.message_user(
            request,
            f"More than {MAX_SELECTED:,} jobs are selected: filter the list first. "
            "Nothing was changed.",
            messages.ERROR,
        )
        return None
    return sorted(found)


def confirmation(
    model_admin: Any,
    request: HttpRequest,
    ids: list[int],
    *,
    action: str,
    title: str,
    question: str,
    button: str,
) -> TemplateResponse:
    """The confirmation page of ``action`` for ``ids``: counts by status, the first
    ``SHOWN`` jobs, and a form that posts the same selection back."""
    jobs = Job.objects.using(admin_database(request)).filter(pk__in=ids)
    counts = jobs.order_by("status").values_list("status").annotate(n=Count("id"))
    across = request.POST.get("select_across") == "1"
    return TemplateResponse(
        request,
        "admin/django_pgqueue/job/bulk_action_confirmation.html",
        {
            **model_admin.admin_site.each_context(request),
            "title": title,
            "question": question,
            "button": button,
            "action": action,
            "breadcrumbs_as_list": BREADCRUMBS_AS_LIST,
            "opts": model_admin.model._meta,
            "total": len(ids),
            "counts": [(status, n) for status, n in counts],
            "shown": jobs.order_by("id").only("id", "task", "status", "queue")[:SHOWN],
            "more": max(0, len(ids) - SHOWN),
            "select_across": across,
            "ids": [] if across else ids,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        },
    )


class BulkActions:
    """Retry now and delete finished for the job list (cancel is ``JobAdmin``'s), and
    the 403 for an action posted without its permission."""

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        """403 for an action posted without its permission, before Django's dispatch
        (which would only say "no action selected", or, for a user who may take no
        action at all, draw the list as if nothing was posted)."""
        action = request.POST.get("action", "") if request.method == "POST" else ""
        if action in PERMISSIONS and not request.user.has_perm(PERMISSIONS[action]):
            raise PermissionDenied(f"{action} needs {PERMISSIONS[action]}")
        return super().changelist_view(request, extra_context)  # type: ignore[misc]

    def has_retry_now_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(PERMISSIONS["retry_now_selected"])

    def has_delete_finished_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(PERMISSIONS["delete_finished_selected"])

    @admin.action(permissions=["retry_now"], description="Retry selected jobs now")
    def retry_now_selected(self, request: HttpRequest, queryset: QuerySet) -> Any:
        """Dead jobs back to pending (``requeue_dead``: attempts reset, errors kept) and
        scheduled ones (a retry backing off, a job for later) due now (``run_now``)."""
        ids = selection(self, request, queryset)
        if ids is None:
            return None
        if not request.POST.get("post"):
            return confirmation(
                self,
                request,
                ids,
                action="retry_now_selected",
                title="Retry jobs now",
                question="Dead jobs go back to pending with their attempts reset (errors "
                "kept); scheduled jobs (waiting for a retry or their run time) become "
                "due now. Other jobs are left alone.",
                button="Yes, retry them now",
            )
        jobs = Job.objects.db_manager(admin_database(request))
        scheduled = jobs.run_now(ids)
        dead = jobs.requeue_dead(ids)
        changed = sorted(scheduled + dead)
        self._report(request, "retry_now", ids, changed, "Retried now from the admin.")
        self.message_user(  # type: ignore[attr-defined]
            request,
            f"Retried {plural(len(changed), 'job')} now ({len(dead):,} dead, "
            f"{len(scheduled):,} scheduled); skipped {len(ids) - len(changed):,} of "
            f"{len(ids):,} selected (not dead or scheduled at that instant, or a live job "
            "holds the key).",
            messages.SUCCESS if changed else messages.WARNING,
        )
        return None

    @admin.action(permissions=["delete_finished"], description="Delete selected finished jobs")
    def delete_finished_selected(self, request: HttpRequest, queryset: QuerySet) -> Any:
        """Delete done, dead and cancelled jobs (``delete_finished``); live ones stay."""
        ids = selection(self, request, queryset)
        if ids is None:
            return None
        if not request.POST.get("post"):
            return confirmation(
                self,
                request,
                ids,
                action="delete_finished_selected",
                title="Delete finished jobs",
                question="Done, dead and cancelled jobs are deleted, with their results "
                "and errors. Waiting, pending, scheduled and running jobs are left alone.",
                button="Yes, delete the finished ones",
            )
        deleted = Job.objects.db_manager(admin_database(request)).delete_finished(ids)
        self._report(request, "delete_finished", ids, deleted, "")
        self.message_user(  # type: ignore[attr-defined]
            request,
            f"Deleted {plural(len(deleted), 'finished job')}; skipped "
            f"{len(ids) - len(deleted):,} of {len(ids):,} selected (not finished, or "
            "a dependant still needs it).",
            messages.SUCCESS if deleted else messages.WARNING,
        )
        return None

    @staticmethod
    def _report(
        request: HttpRequest, action: str, ids: list[int], changed: list[int], history: str
    ) -> None:
        logger.info(
            "%s: %s changed %d of %d selected jobs",
            action,
            request.user.get_username(),
            len(changed),
            len(ids),
            extra={"action": action, "job_ids": changed, **actor(request)},
        )
        if history:
            log_change(request, changed, history)
