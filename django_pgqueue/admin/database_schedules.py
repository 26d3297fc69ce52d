"""Schedules kept in the database, from the admin: add, edit (the cron checked, the next
five run times shown in the schedule's time zone), pause, resume, run now, delete.
Every write goes through ``django_pgqueue.schedules``, which checks each value as a
settings entry's is and names the field; the settings' entries are listed read-only on
the periodic schedules page ("from settings")."""

from __future__ import annotations

import datetime as dt
import logging
import zoneinfo
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join

from .. import periodic, schedules
from ..models import ScheduleDefinition
from .base import GuardedAdmin, actor, admin_database

logger = logging.getLogger(__name__)

#: How many next run times the change page shows.
NEXT_RUNS = 5
RUN_PERMISSION = "django_pgqueue.run_scheduledefinition"


def next_runs(obj: ScheduleDefinition, count: int = NEXT_RUNS) -> list[dt.datetime]:
    """The schedule's next ``count`` run times after now, in its own time zone."""
    try:
        expression = periodic.parse_cron(obj.cron)
        zone = zoneinfo.ZoneInfo(obj.timezone)
    except (ValueError, zoneinfo.ZoneInfoNotFoundError):
        return []
    entry = periodic.PeriodicEntry(
        name=obj.name, task=obj.task, cron=expression, timezone=obj.timezone
    )
    runs: list[dt.datetime] = []
    at = dt.datetime.now(dt.UTC)
    while len(runs) < count:
        tick = entry.next_tick(at)
        if tick is None:
            break
        runs.append(tick.astimezone(zone))
        at = tick
    return runs


class PayloadField(forms.JSONField):
    """Django's JSON form field, which lets ``ValueError`` (an integer of over 4,300
    digits) and ``RecursionError`` (deep nesting) out of ``json.loads`` as a 500: here
    they are the field's error."""

    def to_python(self, value: Any) -> Any:
        try:
            return super().to_python(value)
        except (ValueError, RecursionError):
            raise forms.ValidationError("Enter a valid JSON value.", code="invalid") from None

    def bound_data(self, data: Any, initial: Any) -> Any:
        try:
            return super().bound_data(data, initial)
        except (ValueError, RecursionError):
            return forms.fields.InvalidJSONInput(data)


class ScheduleForm(forms.ModelForm):
    """The model's fields, checked by ``schedules.check`` (each error on its field)."""

    args = PayloadField(required=False, initial=list)
    kwargs = PayloadField(required=False, initial=dict)

    class Meta:
        model = ScheduleDefinition
        fields = (
            "name",
            "task",
            "cron",
            "timezone",
            "args",
            "kwargs",
            "queue",
            "priority",
            "enabled",
            "unique_for",
        )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        name = data.get("name", getattr(self.instance, "name", None))
        fields = {f: data.get(f) for f in schedules.FIELDS if f in data}
        if fields.get("kwargs") is None and "kwargs" in fields:
            fields["kwargs"] = {}
        if fields.get("args") is None and "args" in fields:
            fields["args"] = []
        if not fields.get("queue"):
            fields["queue"] = None
        try:
            checked = schedules.check(name, fields)
        except schedules.ScheduleError as exc:
            for field, message in exc.errors.items():
                self.add_error(field if field in self.fields else None, message)
            return data
        data.update(checked)
        return data


@admin.register(ScheduleDefinition)
class ScheduleDefinitionAdmin(GuardedAdmin):
    """Database schedules: add, edit, pause, resume, run now, delete."""

    form = ScheduleForm
    list_display = ("name", "task", "cron", "timezone", "enabled", "next_run")
    list_filter = ("enabled",)
    search_fields = ("name", "task")
    readonly_fields = ("next_runs_display", "created_at", "updated_at")
    actions = ("pause_selected", "resume_selected", "run_now_selected", "delete_selected")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is not None:  # the name is the key its tick state is kept under
            return ("name", *self.readonly_fields)
        return self.readonly_fields

    @admin.display(description="next run")
    def next_run(self, obj: ScheduleDefinition) -> Any:
        if not obj.enabled:
            return "paused"
        runs = next_runs(obj, 1)
        return runs[0] if runs else "—"

    @admin.display(description=f"next {NEXT_RUNS} run times (schedule's time zone)")
    def next_runs_display(self, obj: ScheduleDefinition) -> str:
        runs = next_runs(obj)
        if not runs:
            return "—"
        paused = " (paused: none runs until it is resumed)" if not obj.enabled else ""
        items = format_html_join(
            "", "<li>{}</li>", ((r.strftime("%Y-%m-%d %H:%M %Z"),) for r in runs)
        )
        return format_html("<ul>{}</ul>{}", items, paused)

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        using = admin_database(request)
        values = {f: form.cleaned_data[f] for f in schedules.FIELDS if f in form.cleaned_data}
        if change:
            schedules.update(obj.name, using=using, **values)
        else:
            schedules.create(obj.name, using=using, **values)
        logger.info(
            "%s %s database schedule %s",
            request.user.get_username(),
            "changed" if change else "added",
            obj.name,
            extra={"action": "schedule", "schedule": obj.name, **actor(request)},
        )

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        schedules.delete(obj.name, using=admin_database(request))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet) -> None:
        for name in queryset.values_list("name", flat=True):
            schedules.delete(name, using=admin_database(request))

    def has_run_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(RUN_PERMISSION)

    def _each(self, request: HttpRequest, queryset: QuerySet, do: Any, done: str) -> None:
        names = list(queryset.values_list("name", flat=True))
        for name in names:
            do(name, using=admin_database(request))
        self.message_user(request, f"{done}: {', '.join(names)}.", messages.SUCCESS)

    @admin.action(permissions=["change"], description="Pause selected schedules")
    def pause_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._each(request, queryset, schedules.pause, "Paused")

    @admin.action(permissions=["change"], description="Resume selected schedules")
    def resume_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._each(request, queryset, schedules.resume, "Resumed (from their next tick)")

    @admin.action(permissions=["run"], description="Run selected schedules now")
    def run_now_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._each(request, queryset, schedules.run_now, "Enqueued one job now for")
