"""Periodic schedules: every entry the sweepers have seen, read-only (the settings are
where entries are added, changed and removed)."""

from __future__ import annotations

import datetime as dt

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from .. import periodic
from ..conf import settings
from ..models import Schedule
from .base import ViewOnlyAdmin


def zoned(when: dt.datetime) -> str:
    """'2026-12-05 03:00:00 CET (UTC+01:00)': a tick in its own time zone."""
    offset = when.strftime("%z")
    name = when.tzname() or ""
    text = when.strftime("%Y-%m-%d %H:%M:%S")
    if not offset:
        return text
    return f"{text} {name} (UTC{offset[:3]}:{offset[3:]})".replace("  ", " ")


@admin.register(Schedule)
class ScheduleAdmin(ViewOnlyAdmin):
    """Every periodic entry the sweepers have seen, read-only: the settings
    (``PGQUEUE_PERIODIC``) are where entries are added, changed and removed."""

    list_display = (
        "name",
        "task",
        "cron",
        "timezone",
        "state",
        "next_tick",
        "last_tick",
        "last_job_link",
    )
    readonly_fields = (
        *list_display,
        "enabled",
        "created_at",
        "updated_at",
    )
    fields = readonly_fields
    sortable_by = ("name",)
    ordering = ("name",)
    search_fields = ("name", "task")

    def _entry(self, obj: Schedule) -> periodic.PeriodicEntry | None:
        valid, _ = periodic.entries()
        found = next((e for e in valid if e.name == obj.name), None)
        if found is None and obj.name not in (settings.PERIODIC or {}):
            stored, _ = periodic.database_entries(obj._state.db or "default")
            found = next((e for e in stored if e.name == obj.name), None)
        return found

    @admin.display(description="state")
    def state(self, obj: Schedule) -> str:
        """Enabled or not, and where the entry comes from: the settings (read-only
        here) or the database (edited on the database schedules page)."""
        entry = self._entry(obj)
        if entry is None:
            return "removed from settings (no longer enqueued)"
        source = "from settings" if obj.name in (settings.PERIODIC or {}) else "database"
        return f"{'enabled' if entry.enabled else 'disabled'}, {source}"

    @admin.display(description="next tick")
    def next_tick(self, obj: Schedule) -> str:
        """From the entry as the settings give it now (a changed cron shows here at once),
        in the schedule's own time zone, named, with its offset."""
        entry = self._entry(obj)
        if entry is None or not entry.enabled:
            return "—"
        tick = entry.next_tick(dt.datetime.now(dt.UTC))
        return "—" if tick is None else zoned(tick)

    @admin.display(description="last job")
    def last_job_link(self, obj: Schedule) -> str:
        if obj.last_job_id is None:
            return "—"
        url = reverse(
            "admin:django_pgqueue_job_change",
            args=[obj.last_job_id],
            current_app=self.admin_site.name,
        )
        return format_html('<a href="{}">job {}</a>', url, obj.last_job_id)
