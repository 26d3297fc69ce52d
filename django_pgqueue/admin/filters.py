"""The list filters: which backend, task and queue choices without ``SELECT DISTINCT``
over a big table, and the dead letters' time of death."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from ..databases import backend_database, pgqueue_backend_aliases
from ..models import Job
from ..monitoring import common_values
from .base import admin_database, request_backend

#: Dead letters whose task and queue the dead-letter filters offer (the newest).
DEAD_SCANNED = 10_000
#: Most choices a dead-letter filter offers.
CHOICES = 100


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

    def values(self, request: HttpRequest) -> list[str]:
        return common_values(admin_database(request), self.column)

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        values = self.values(request)
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


class DeadValueFilter(CommonValueFilter):
    """Choices only from dead letters: the newest ``DEAD_SCANNED`` of them, read
    backwards along ``pgqueue_job_dead_idx``, so the query is bounded however many
    jobs and dead letters there are (a value only older ones hold: type it or search)."""

    def values(self, request: HttpRequest) -> list[str]:
        jobs = Job.objects.db_manager(admin_database(request))
        newest = jobs.filter(status=Job.Status.DEAD).order_by("-id").values("id")[:DEAD_SCANNED]
        return list(
            jobs.filter(id__in=newest)
            .order_by(self.column)
            .values_list(self.column, flat=True)
            .distinct()[:CHOICES]
        )


class DeadQueueFilter(DeadValueFilter):
    title = "queue"
    parameter_name = "queue"
    column = "queue"


class DeadTaskFilter(DeadValueFilter):
    title = "task"
    parameter_name = "task"
    column = "task"


class DiedFilter(admin.DateFieldListFilter):
    """The finished_at date filter, named for what it means on a dead letter."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.title = "time of death"
        # Every dead letter has one: no "No date" / "Has date" choices.
        self.links = tuple(
            (title, params)
            for title, params in self.links
            if self.lookup_kwarg_isnull not in params
        )
