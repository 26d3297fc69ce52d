"""The list filters: which backend, task and queue choices without ``SELECT DISTINCT``
over a big table, and the dead letters' time of death."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from ..databases import backend_database, pgqueue_backend_aliases
from ..monitoring import common_values
from .base import admin_database, request_backend


class BackendFilter(admin.SimpleListFilter):
    """One choice per ``PgQueueBackend`` alias, shown when there are several: the list
    then reads that backend's jobs database (and only jobs enqueued through it)."""

    title = "backend"
    parameter_name = "backend"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        aliases = pgqueue_backend_aliases()
        if len(aliases) < 2:
            return []
        return [(alias, f"{alias} ({backend_database(alias)})") for alias in aliases]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        # get_queryset() already reads the chosen backend's database.
        alias = request_backend(request)
        return queryset.filter(backend=alias) if alias else queryset


class CommonValueFilter(admin.SimpleListFilter):
    """Choices for a text column without ``SELECT DISTINCT`` over a big table: exact on a
    small table, the planner's most common values on a big one (see
    ``monitoring.common_values``). The value in the URL is always offered."""

    column = ""

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        values = common_values(admin_database(request), self.column)
        current = self.value()
        if current and current not in values:
            values = [current, *values]
        return [(value, value) for value in values]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        return queryset.filter(**{self.column: value}) if value else queryset


class QueueFilter(CommonValueFilter):
    title = "queue"
    parameter_name = "queue"
    column = "queue"


class TaskFilter(CommonValueFilter):
    title = "task"
    parameter_name = "task"
    column = "task"


class DiedFilter(admin.DateFieldListFilter):
    """The finished_at date filter, named for what it means on a dead letter."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.title = "time of death"
