"""The workflow of one job on its admin page: what it waits for, what waits for it, and
its chain's or group's progress (``workflows.py``). Read through the ORM from the
edges table (``JobDependency``), each list bounded."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from django.contrib import admin
from django.db.models import Count
from django.http import QueryDict
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from ..databases import pgqueue_backend_aliases
from ..models import Job, JobDependency
from ..states import Status

#: How many parents, or dependants, a job's page lists; the rest are counted.
SHOWN = 50
#: The detail page's section these fields are shown in.
WORKFLOW = "Workflow"


def in_workflow(obj: Job) -> bool:
    """Whether ``obj`` has a workflow to show: parents, a chain or group, or dependants
    (one index probe for a job that got them after it was created)."""
    if obj.workflow_id is not None or obj.parents_left is not None or obj.has_dependants:
        return True
    return JobDependency.objects.using(obj._state.db).filter(parent_id=obj.id).exists()


class WorkflowDisplay:
    """Read-only fields for ``ReadOnlyJobAdmin``: ``parents_display``,
    ``dependants_display``, ``workflow_display``."""

    admin_site: admin.AdminSite

    def _url(self, job_id: int, obj: Job, *, changelist: bool = False, **query: Any) -> str:
        """A link to job ``job_id`` (or to the job list, filtered by ``query``) of the
        jobs database ``obj`` came from (the page's backend choice, kept)."""
        name = "changelist" if changelist else "change"
        url = reverse(
            f"admin:django_pgqueue_job_{name}",
            args=() if changelist else [job_id],
            current_app=self.admin_site.name,
        )
        params = QueryDict(mutable=True)
        params.update(query)
        if obj.backend in pgqueue_backend_aliases():
            params["backend"] = obj.backend
        return f"{url}?{params.urlencode()}" if params else url

    def _links(self, obj: Job, ids: Iterable[int]) -> str:
        ids = list(ids)
        database = obj._state.db
        status = dict(Job.objects.using(database).filter(pk__in=ids).values_list("id", "status"))
        return format_html_join(
            ", ",
            '<a href="{}">#{}</a> <span class="pgqueue-status">{}</span>',
            ((self._url(i, obj), i, status.get(i, "pruned")) for i in ids),
        )

    @admin.display(description="waits for")
    def parents_display(self, obj: Job) -> str:
        """The jobs ``obj`` depends on, in order, each with its status, and how many
        have not finished."""
        if obj.parents_left is None:
            return "—"
        edges = JobDependency.objects.using(obj._state.db).filter(job_id=obj.id)
        shown = list(edges.order_by("position").values_list("parent_id", flat=True)[:SHOWN])
        total = len(shown) if len(shown) < SHOWN else edges.count()
        more = f" and {total - SHOWN:,} more" if total > SHOWN else ""
        how = {"value": ", given its result", "list": ", given their results"}.get(
            obj.parent_results or "", ""
        )
        failure = "run anyway" if obj.on_parent_failure == "run" else "cancelled"
        # (format_html escapes its arguments to text first: numbers are formatted here.)
        return format_html(
            "{}{} ({} of {} not finished{}; if one ends dead or cancelled: {})",
            self._links(obj, shown),
            more,
            f"{obj.parents_left:,}",
            f"{total:,}",
            how,
            failure,
        )

    @admin.display(description="then")
    def dependants_display(self, obj: Job) -> str:
        """The jobs that depend on ``obj``."""
        edges = JobDependency.objects.using(obj._state.db).filter(parent_id=obj.id)
        shown = list(edges.order_by("job_id").values_list("job_id", flat=True)[: SHOWN + 1])
        if not shown:
            return "—"
        more = ""
        if len(shown) > SHOWN:
            shown = shown[:SHOWN]
            more = f" and {edges.count() - SHOWN:,} more"
        return format_html("{}{}", self._links(obj, shown), more)

    @admin.display(description="workflow")
    def workflow_display(self, obj: Job) -> str:
        """The chain or group ``obj`` belongs to: how many of its jobs are done, by
        status, and a link to them all."""
        if obj.workflow_id is None:
            return "—"
        counts = Counter(
            dict(
                Job.objects.using(obj._state.db)
                .filter(workflow_id=obj.workflow_id)
                .values_list("status")
                .annotate(n=Count("id"))
                .values_list("status", "n")
            )
        )
        total = sum(counts.values())
        others = ", ".join(
            f"{counts[s]:,} {s}" for s in Status.values if s != Status.DONE and counts[s]
        )
        return format_html(
            '<a href="{}">workflow {}</a>: {} of {} done{}',
            self._url(obj.workflow_id, obj, changelist=True, workflow_id=obj.workflow_id),
            obj.workflow_id,
            f"{counts[Status.DONE]:,}",
            f"{total:,}",
            f" ({others})" if others else "",
        )
