"""Flow control at run time: the queues (pause and resume, as admin actions) and the
limits set at run time (add, change, lift).

Every change goes through the manager (``Job.objects.pause_queue``, ``resume_queue``,
``set_limit``, ``reset_limit``): one statement each, and a NOTIFY that tells the
workers at commit; they apply it at their next claim (within about a second without
the NOTIFY). Pausing needs the queue's change permission, limits their own add, change
and delete permissions.
"""

from __future__ import annotations

import logging
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse

from .. import flow, monitoring, validation
from ..exceptions import InvalidJob
from ..models import Job, Limit, Queue
from .base import GuardedAdmin, actor, admin_database

logger = logging.getLogger(__name__)


class QueueForm(forms.ModelForm):
    """Adding a queue here pauses it (its name checked as enqueue checks it)."""

    class Meta:
        model = Queue
        fields = ("name",)

    def clean_name(self) -> str:
        try:
            return validation.queue_name(self.cleaned_data["name"])
        except InvalidJob as exc:
            raise forms.ValidationError(str(exc)) from None


@admin.register(Queue)
class QueueAdmin(GuardedAdmin):
    """Queues with a run-time state: pause or resume them (admin actions); add one by
    name to pause it. A paused queue's pending jobs stay pending, its running jobs
    finish, and no worker claims from it until it is resumed."""

    form = QueueForm
    change_list_template = "admin/django_pgqueue/queue/change_list.html"
    list_display = ("name", "state", "paused_at", "updated_at")
    ordering = ("name",)
    search_fields = ("name",)
    actions = ("pause", "resume")

    @admin.display(description="state")
    def state(self, obj: Queue) -> str:
        return "paused" if obj.paused_at else "running"

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        # An existing queue is changed by the actions only (and its name is its key).
        return ("name", "paused_at", "updated_at") if obj is not None else ()

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_add_permission(self, request: HttpRequest) -> bool:
        """Adding a queue pauses it: that takes the change permission too (the one the
        pause and resume actions need), not ``add_queue`` alone."""
        return super().has_add_permission(request) and self.has_change_permission(request)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """The rows (queues with a run-time state), and under them every other queue
        that holds live jobs or that a live worker serves: running, never paused."""
        alias = admin_database(request)
        known = set(Queue.objects.using(alias).values_list("name", flat=True))
        queues, _ = monitoring.live_values(alias)
        for worker in monitoring.workers(using=alias):
            if not worker.lost and worker.queues:
                queues.update(worker.queues)
        extra_context = {**(extra_context or {}), "pgqueue_other_queues": sorted(queues - known)}
        return super().changelist_view(request, extra_context)

    def add_view(
        self, request: HttpRequest, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        extra_context = {**(extra_context or {}), "title": "Pause a queue by name"}
        return super().add_view(request, form_url, extra_context)

    def response_add(
        self, request: HttpRequest, obj: Queue, post_url_continue: str | None = None
    ) -> HttpResponse:
        """Adding a queue pauses it: say that, not "was added successfully"."""
        self.message_user(
            request,
            f"Paused queue {obj.name!r}: no worker claims from it until it is resumed.",
            messages.SUCCESS,
        )
        return HttpResponseRedirect(
            reverse("admin:django_pgqueue_queue_changelist", current_app=self.admin_site.name)
        )

    def save_model(self, request: HttpRequest, obj: Queue, form: Any, change: bool) -> None:
        if not change:
            self._pause(request, [obj.name])

    def _pause(self, request: HttpRequest, names: list[str]) -> None:
        jobs = Job.objects.db_manager(admin_database(request))
        for name in names:
            jobs.pause_queue(name)
        logger.info(
            "%s paused queues %s",
            request.user.get_username(),
            names,
            extra={"action": "pause_queue", **actor(request)},
        )

    @admin.action(permissions=["change"], description="Pause selected queues")
    def pause(self, request: HttpRequest, queryset: QuerySet) -> None:
        names = sorted(queryset.values_list("name", flat=True))
        self._pause(request, names)
        self.message_user(
            request, f"Paused {len(names)} queue(s): {', '.join(names)}.", messages.SUCCESS
        )

    @admin.action(permissions=["change"], description="Resume selected queues")
    def resume(self, request: HttpRequest, queryset: QuerySet) -> None:
        jobs = Job.objects.db_manager(admin_database(request))
        names = sorted(queryset.values_list("name", flat=True))
        resumed = [name for name in names if jobs.resume_queue(name)]
        logger.info(
            "%s resumed queues %s",
            request.user.get_username(),
            resumed,
            extra={"action": "resume_queue", **actor(request)},
        )
        self.message_user(
            request,
            f"Resumed {len(resumed)} of {len(names)} selected queue(s)"
            + (f": {', '.join(resumed)}." if resumed else " (none was paused)."),
            messages.SUCCESS if resumed else messages.WARNING,
        )


class LimitForm(forms.ModelForm):
    """A limit, checked as ``PGQUEUE_LIMITS`` entries are (neither bound: no limit on
    the key, whatever the settings declare)."""

    class Meta:
        model = Limit
        fields = ("key", "concurrency", "rate")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        key = data.get("key") or (self.instance.key if self.instance.pk else None)
        try:
            flow.parse_limit(
                key,
                {"concurrency": data.get("concurrency"), "rate": data.get("rate") or None},
                allow_empty=True,
            )
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None
        return data


@admin.register(Limit)
class LimitAdmin(GuardedAdmin):
    """The limits set at run time, each in place of the ``PGQUEUE_LIMITS`` entry of its
    key (shown beside it); deleting one puts that entry back in force."""

    form = LimitForm
    change_list_template = "admin/django_pgqueue/limit/change_list.html"
    list_display = ("key", "concurrency", "rate", "declared", "updated_at")
    ordering = ("key",)
    search_fields = ("key",)

    @admin.display(description="PGQUEUE_LIMITS declares")
    def declared(self, obj: Limit) -> str:
        spec = flow.declared().get(obj.key)
        return "—" if spec is None else spec.describe()

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        return ("key",) if obj is not None else ()

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """The run-time rows, and under them the ``PGQUEUE_LIMITS`` entries in force
        (those no row replaces)."""
        replaced = set(Limit.objects.using(admin_database(request)).values_list("key", flat=True))
        declared = [
            {"key": key, "spec": spec.describe()}
            for key, spec in sorted(flow.declared().items())
            if key not in replaced
        ]
        extra_context = {**(extra_context or {}), "pgqueue_declared_limits": declared}
        return super().changelist_view(request, extra_context)

    def save_model(self, request: HttpRequest, obj: Limit, form: Any, change: bool) -> None:
        spec = Job.objects.db_manager(admin_database(request)).set_limit(
            obj.key, concurrency=obj.concurrency, rate=obj.rate or None
        )
        logger.info(
            "%s set limit %s: %s",
            request.user.get_username(),
            obj.key,
            spec.describe(),
            extra={"action": "set_limit", **actor(request)},
        )

    def delete_model(self, request: HttpRequest, obj: Limit) -> None:
        Job.objects.db_manager(admin_database(request)).reset_limit(obj.key)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet) -> None:
        jobs = Job.objects.db_manager(admin_database(request))
        for key in queryset.values_list("key", flat=True):
            jobs.reset_limit(key)
