"""Dead letters: jobs that used up their attempts. Inspect, requeue (to the same or
another queue and priority) and discard, each one guarded statement through the manager,
logged and recorded in the admin's history."""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.actions import delete_selected as django_delete_selected
from django.db import IntegrityError
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from ..exceptions import InvalidJob
from ..models import DeadLetter, Job
from .base import actor, admin_database, log_change, with_backend
from .filters import BackendFilter, DeadQueueFilter, DeadTaskFilter, DiedFilter
from .read_only_jobs import ReadOnlyJobAdmin
from .tags import TagFilter, TagsColumn

logger = logging.getLogger(__name__)

REQUEUE_PERMISSION = "django_pgqueue.requeue_job"


class RequeueActionForm(helpers.ActionForm):
    """The action bar, with the requeue options: blank keeps the job's own values."""

    requeue_queue = forms.CharField(
        required=False,
        label="Requeue to queue",
        widget=forms.TextInput(attrs={"placeholder": "same", "size": 10}),
    )
    requeue_priority = forms.CharField(
        required=False,
        label="with priority",
        widget=forms.TextInput(attrs={"placeholder": "same", "size": 4}),
    )


#: Django 6.1 offers admin actions on the change form too (``ActionLocation``); on 5.2
#: and 6.0 the dead letters' actions are on the list page only.
CHANGE_FORM_ACTIONS = hasattr(admin, "ActionLocation")
ACTION_LOCATIONS: dict[str, Any] = (
    {"location": [admin.ActionLocation.CHANGE_LIST, admin.ActionLocation.CHANGE_FORM]}
    if CHANGE_FORM_ACTIONS
    else {}
)
#: How Django prefixes the fields of the change form's action form.
CHANGE_FORM_PREFIX = "CHANGE_FORM-"


def requeue_options(request: HttpRequest) -> tuple[str | None, int | None]:
    """Queue and priority typed into whichever action form was submitted (the list's
    or the detail page's, which Django prefixes). Raises ``InvalidJob`` naming a bad
    value; the manager validates the range and the queue name."""
    prefix = CHANGE_FORM_PREFIX
    if f"{prefix}action" not in request.POST:
        prefix = ""
    queue = request.POST.get(f"{prefix}requeue_queue", "").strip() or None
    raw_priority = request.POST.get(f"{prefix}requeue_priority", "").strip()
    try:
        priority = int(raw_priority) if raw_priority else None
    except ValueError:
        raise InvalidJob(f"priority must be a whole number, not {raw_priority!r}") from None
    return queue, priority


@admin.register(DeadLetter)
class DeadLetterAdmin(TagsColumn, ReadOnlyJobAdmin):
    """Jobs that used up their attempts: inspect, requeue, discard."""

    list_display = (
        "id",
        "task",
        "queue",
        "attempts_display",
        "tags_display",
        "last_error_line",
        "died_at",
    )
    list_filter = (
        BackendFilter,
        DeadTaskFilter,
        DeadQueueFilter,
        TagFilter,
        ("finished_at", DiedFilter),
    )
    action_form = RequeueActionForm
    actions = ("requeue", "requeue_from_start", "delete_selected")

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).filter(status=Job.Status.DEAD)

    def has_requeue_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(REQUEUE_PERMISSION)

    @admin.display(description="died")
    def died_at(self, obj: Job) -> dt.datetime | None:
        return obj.finished_at

    # --- requeue ------------------------------------------------------------------------

    @admin.action(
        permissions=["requeue"],
        description="Requeue selected dead letters",
        **ACTION_LOCATIONS,
    )
    def requeue(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        """Back to pending, attempts reset, errors and durable steps kept (the job
        resumes after its last recorded step): one guarded statement."""
        return self._requeue(request, queryset, from_start=False)

    @admin.action(
        permissions=["requeue"],
        description="Requeue selected dead letters from the start (clear their steps)",
        **ACTION_LOCATIONS,
    )
    def requeue_from_start(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        """``requeue``, and the jobs' durable steps deleted in the same transaction: every
        step runs again."""
        return self._requeue(request, queryset, from_start=True)

    def _requeue(
        self, request: HttpRequest, queryset: QuerySet, *, from_start: bool
    ) -> HttpResponse | None:
        try:
            queue, priority = requeue_options(request)
            ids = self.selected_ids(request, queryset)
            requeued = Job.objects.db_manager(admin_database(request)).requeue_dead(
                ids, queue=queue, priority=priority, from_start=from_start
            )
        except InvalidJob as exc:
            self.message_user(request, f"Nothing requeued: {exc}", messages.ERROR)
            return None
        except IntegrityError:
            self.message_user(
                request,
                "Nothing requeued: a job with the same idempotency key was enqueued "
                "at the same moment. Try again.",
                messages.ERROR,
            )
            return None
        logger.info(
            "%s requeued %d of %d selected dead letters (queue=%s priority=%s): %s",
            request.user.get_username(),
            len(requeued),
            len(ids),
            queue or "same",
            "same" if priority is None else priority,
            requeued,
            extra={"action": "requeue", "job_ids": requeued, **actor(request)},
        )
        log_change(
            request,
            requeued,
            f"Requeued from dead letters (queue={queue or 'same'}, "
            f"priority={'same' if priority is None else priority}"
            f"{', steps cleared' if from_start else ''}).",
        )
        self.report(request, "Requeued", requeued, ids, "requeued")
        if len(ids) == 1 and requeued and self.from_change_form(request):
            # The dead letter is gone from this page; follow the job it became.
            if self.admin_site.is_registered(Job) and request.user.has_perm(
                "django_pgqueue.view_job"
            ):
                return HttpResponseRedirect(
                    with_backend(
                        reverse(
                            "admin:django_pgqueue_job_change",
                            args=[requeued[0]],
                            current_app=self.admin_site.name,
                        ),
                        request,
                    )
                )
        if self.from_change_form(request):
            return HttpResponseRedirect(
                with_backend(
                    reverse(
                        "admin:django_pgqueue_deadletter_changelist",
                        current_app=self.admin_site.name,
                    ),
                    request,
                )
            )
        return None

    # --- discard ------------------------------------------------------------------------

    @admin.action(permissions=["delete"], description="Discard selected dead letters")
    def delete_selected(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        """Django's confirmation page first; then one guarded DELETE (only rows still
        dead), and a message with the number of rows actually deleted."""
        if not request.POST.get("post"):
            response = django_delete_selected(self, request, queryset)
            if isinstance(response, TemplateResponse) and response.context_data is not None:
                response.context_data["title"] = "Discard dead letters"
            return response
        ids = self.selected_ids(request, queryset)
        self.discard(request, ids)
        return None

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet) -> None:
        self.discard(request, self.selected_ids(request, queryset))

    def delete_model(self, request: HttpRequest, obj: Job) -> None:
        request._pgqueue_discarded = self.discard(request, [obj.pk], report=False)  # type: ignore[attr-defined]

    def response_delete(self, request: HttpRequest, obj_display: str, obj_id: Any) -> HttpResponse:
        discarded = getattr(request, "_pgqueue_discarded", [])
        self.report(request, "Discarded", discarded, [obj_id], "discarded")
        return HttpResponseRedirect(
            with_backend(
                reverse(
                    "admin:django_pgqueue_deadletter_changelist", current_app=self.admin_site.name
                ),
                request,
            )
        )

    def discard(self, request: HttpRequest, ids: list[int], *, report: bool = True) -> list[int]:
        deleted = Job.objects.db_manager(admin_database(request)).discard_dead(ids)
        logger.info(
            "%s discarded %d of %d selected dead letters: %s",
            request.user.get_username(),
            len(deleted),
            len(ids),
            deleted,
            extra={"action": "discard", "job_ids": deleted, **actor(request)},
        )
        if report:
            self.report(request, "Discarded", deleted, ids, "discarded")
        return deleted

    # --- plumbing -----------------------------------------------------------------------

    @staticmethod
    def from_change_form(request: HttpRequest) -> bool:
        return f"{CHANGE_FORM_PREFIX}action" in request.POST

    def report(
        self,
        request: HttpRequest,
        verb: str,
        changed: list[int],
        selected: list[int],
        participle: str,
    ) -> None:
        """Say how many rows changed, and why the others did not."""
        noun = "dead letter" if len(changed) == 1 else "dead letters"
        text = f"{verb} {len(changed)} {noun}"
        if changed and len(changed) <= 10:
            text += " (job " + ", ".join(str(i) for i in changed) + ")"
        missed = len(selected) - len(changed)
        if missed:
            text += (
                f"; {missed} of {len(selected)} selected not {participle}: no longer dead "
                "(requeued or discarded by someone else)"
            )
            if verb == "Requeued":
                text += " or a live job holds the same idempotency key"
        self.message_user(request, text + ".", messages.SUCCESS if changed else messages.WARNING)
