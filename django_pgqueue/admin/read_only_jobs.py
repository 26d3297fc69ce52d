"""``ReadOnlyJobAdmin``: the read-only job pages the job list and the dead-letter list
share (columns, detail fieldsets, search, the cheap paginator, the posted selection)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.views.main import SEARCH_VAR, ChangeList
from django.db.models import QuerySet
from django.db.models.fields.json import KT
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.html import format_html, format_html_join

from .. import deadline
from ..exceptions import DeadlineExceeded
from ..models import Job
from . import search
from .base import (
    TOO_DEEP,
    GuardedAdmin,
    IndexedOrderChangeList,
    admin_database,
    error_line,
    job_id,
    pretty_json,
    shortened,
    storable,
    task_traceback,
    timestamp,
)
from .paginator import EstimatedCountPaginator
from .workflow import WORKFLOW, WorkflowDisplay, in_workflow

if TYPE_CHECKING:
    from django.contrib.admin.options import _FieldsetSpec


#: The JSON columns a user's data fills (the worker writes ``errors``, bounded).
PAYLOADS = ("args", "kwargs", "result", "progress")
#: The durable steps a job's page lists at most.
STEPS_SHOWN = 200

#: The job's times, each shown to the second with its offset (``timestamp``).
TIMESTAMPS = ("created_at", "run_at", "started_at", "last_attempted_at", "finished_at")


def _error_time(value: Any) -> str:
    """An error entry's ``at`` (ISO text) to the second, in the current time zone."""
    if not isinstance(value, str):
        return "—"
    try:
        return timestamp(dt.datetime.fromisoformat(value))
    except ValueError:
        return value


def _timestamp_display(name: str) -> Any:
    """A read-only field showing column ``name`` to the second (Django's own display
    stops at the minute, and a job's times are seconds apart)."""

    def show(self: Any, obj: Job) -> str:
        return timestamp(getattr(obj, name))

    show.__name__ = f"{name}_display"
    return admin.display(description=name.replace("_", " "))(show)


class ReadOnlyJobAdmin(WorkflowDisplay, GuardedAdmin):
    """Read-only display of jobs, shared by the job list and the dead-letter list."""

    paginator = EstimatedCountPaginator
    show_full_result_count = False  # the "N total" link would COUNT(*) the table
    show_facets = admin.ShowFacets.NEVER  # facet counts are COUNT(*)s per filter choice
    list_per_page = 50
    list_max_show_all = 500
    sortable_by = ("id",)  # the primary key: the only order every list can use an index for
    ordering = ("-id",)
    search_fields = ("task",)  # enables the box; get_search_results decides what it means
    search_help_text = (
        "A job id, a task path (or its beginning), an idempotency key, a tag, or an "
        "argument's value: a word (positional), name=value (keyword), or JSON "
        '([42] of args, {"customer_id": 42} of kwargs). Part of a task path and error '
        "text are searched on small tables only."
    )
    readonly_fields: ClassVar[tuple[str, ...]] = (
        "id",
        "task",
        "status",
        "queue",
        "priority",
        "backend",
        "idempotency_key",
        "concurrency_key_display",
        "tags",
        "attempts_display",
        "last_worker",
        "lease_expires_at_display",
        "cancel_requested_display",
        *(f"{name}_display" for name in TIMESTAMPS),
        "args_pretty",
        "kwargs_pretty",
        "errors_pretty",
        "result_pretty",
        "snoozes",
        "soft_time_limit",
        "time_limit",
        "progress_pretty",
        "steps_display",
        "workflow_display",
        "parents_display",
        "dependants_display",
    )
    fieldsets: ClassVar[_FieldsetSpec] = (
        (
            None,
            {
                "fields": (
                    "id",
                    "task",
                    "status",
                    "queue",
                    "priority",
                    "concurrency_key_display",
                    "backend",
                )
            },
        ),
        (
            "Attempts",
            {
                "fields": (
                    "attempts_display",
                    "snoozes",
                    "last_worker",
                    "lease_expires_at_display",
                    "cancel_requested_display",
                    "soft_time_limit",
                    "time_limit",
                )
            },
        ),
        ("Timestamps", {"fields": tuple(f"{name}_display" for name in TIMESTAMPS)}),
        ("Payload", {"fields": ("args_pretty", "kwargs_pretty", "idempotency_key", "tags")}),
        (WORKFLOW, {"fields": ("workflow_display", "parents_display", "dependants_display")}),
        ("Errors, newest first", {"fields": ("errors_pretty",)}),
        ("Progress", {"fields": ("progress_pretty",)}),
        ("Durable steps", {"fields": ("steps_display",)}),
        ("Result", {"fields": ("result_pretty",)}),
    )

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        """The detail page's sections; the workflow's only for a job that has one (a
        parent, a dependant, a chain's or group's job)."""
        fieldsets = super().get_fieldsets(request, obj)
        if obj is None or in_workflow(obj):
            return fieldsets
        return [section for section in fieldsets if section[0] != WORKFLOW]

    # No one adds or edits a job by hand: the task path decides what code runs, and a
    # running job belongs to the worker holding its lease.
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return IndexedOrderChangeList

    def response_action(
        self, request: HttpRequest, queryset: QuerySet, *args: Any, **kwargs: Any
    ) -> Any:
        """Django's action dispatch, with the posted selection reduced to valid job ids
        first: Django filters ``pk__in`` with whatever was posted, and a value that is
        not a bigint ("x", "1.5", 2**63) raised there, a 500."""
        posted = request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)
        ids = [i for i in map(job_id, posted) if i is not None]
        if len(ids) != len(posted):
            post = request.POST.copy()
            post.setlist(helpers.ACTION_CHECKBOX_NAME, [str(i) for i in ids])
            request.POST = post  # type: ignore[assignment]
        return super().response_action(request, queryset, *args, **kwargs)

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        queryset = super().get_queryset(request).using(admin_database(request))
        if getattr(request, "pgqueue_defer_payloads", False):
            return queryset.defer(*PAYLOADS)
        match = request.resolver_match
        if match is not None and (match.url_name or "").endswith("_changelist"):
            # A list row needs only the newest traceback, not payloads of up to 1 MB.
            queryset = queryset.defer("args", "kwargs", "result", "errors").annotate(
                last_traceback=KT("errors__-1__traceback")
            )
        return queryset

    def get_object(
        self, request: HttpRequest, object_id: str, from_field: str | None = None
    ) -> Any:
        try:
            return super().get_object(request, object_id, from_field)
        except RecursionError:
            # Enqueue took up to ~1,490 levels before it refused more than 500, deeper
            # than Python's JSON decoder goes: load the row without such payloads.
            setattr(request, "pgqueue_defer_payloads", True)  # noqa: B010 - not an attribute of HttpRequest
            job = super().get_object(request, object_id, from_field)
            for name in PAYLOADS:
                try:
                    getattr(job, name)
                except RecursionError:
                    setattr(job, name, TOO_DEEP)
            return job

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet, search_term: str
    ) -> tuple[QuerySet, bool]:
        """What a term means is ``search.search_q``'s: index lookups only on a big
        table. A search that ran out of time (``changelist_view``) lists nothing."""
        term = search_term.strip()
        if not term:
            return queryset, False
        if getattr(request, "pgqueue_search_cut", False):
            return queryset.none(), False
        return queryset.filter(search.search_q(term, using=admin_database(request))), False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> Any:
        """A list with a search term is drawn under ``search.SEARCH_SECONDS`` for all its
        statements (``deadline.within``); when they run out, the list is drawn again
        without rows, saying the search was cut."""
        term = request.GET.get(SEARCH_VAR, "").strip()
        if request.method != "GET" or not term or not storable(term):
            return super().changelist_view(request, extra_context)
        try:
            with deadline.within(admin_database(request), search.SEARCH_SECONDS):
                response = super().changelist_view(request, extra_context)
                if isinstance(response, TemplateResponse):
                    response.render()
            return response
        except DeadlineExceeded:
            setattr(request, "pgqueue_search_cut", True)  # noqa: B010 - not an attribute of HttpRequest
            self.message_user(
                request, search.CUT_MESSAGE.format(seconds=search.SEARCH_SECONDS), messages.WARNING
            )
            return super().changelist_view(request, extra_context)

    created_at_display = _timestamp_display("created_at")
    run_at_display = _timestamp_display("run_at")
    started_at_display = _timestamp_display("started_at")
    last_attempted_at_display = _timestamp_display("last_attempted_at")
    finished_at_display = _timestamp_display("finished_at")
    lease_expires_at_display = _timestamp_display("lease_expires_at")

    @admin.display(description="concurrency key")
    def concurrency_key_display(self, obj: Job) -> str:
        return obj.concurrency_key or "—"

    @admin.display(description="cancellation requested")
    def cancel_requested_display(self, obj: Job) -> str:
        """When ``Job.objects.cancel()`` asked this job (running then) to stop."""
        return timestamp(obj.cancel_requested_at)

    @admin.display(description="attempts")
    def attempts_display(self, obj: Job) -> str:
        return f"{obj.attempts}/{obj.max_attempts}"

    @admin.display(description="last error")
    def last_error_line(self, obj: Job) -> str:
        if hasattr(obj, "last_traceback"):
            return error_line(obj.last_traceback)
        last = obj.last_error
        return error_line(last.get("traceback")) if isinstance(last, dict) else ""

    @admin.display(description="lease owner (last attempt)")
    def last_worker(self, obj: Job) -> str:
        if obj.lease_owner:
            return obj.lease_owner
        last = obj.last_error
        return str(last.get("worker_id", "")) if isinstance(last, dict) else ""

    @admin.display(description="args")
    def args_pretty(self, obj: Job) -> str:
        return format_html('<pre class="pgqueue-json">{}</pre>', pretty_json(shortened(obj.args)))

    @admin.display(description="kwargs")
    def kwargs_pretty(self, obj: Job) -> str:
        return format_html(
            '<pre class="pgqueue-json">{}</pre>', pretty_json(shortened(obj.kwargs))
        )

    @admin.display(description="progress")
    def progress_pretty(self, obj: Job) -> str:
        """What the task last said with ``current_job().set_progress()``."""
        if obj.progress is None:
            return "—"
        return format_html('<pre class="pgqueue-json">{}</pre>', pretty_json(obj.progress))

    @admin.display(description="steps")
    def steps_display(self, obj: Job) -> str:
        """The job's recorded steps, cursors and sleeps in order (``current_job().
        run_step`` and kin): what a later run of it skips. The first STEPS_SHOWN only."""
        rows = list(
            obj.steps.order_by("id").values_list("kind", "name", "attempt", "size", "finished_at")[
                : STEPS_SHOWN + 1
            ]
        )
        if not rows:
            return "—"
        more = len(rows) > STEPS_SHOWN
        body = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            rows[:STEPS_SHOWN],
        )
        tail = format_html("<p>… and more (first {} shown)</p>", STEPS_SHOWN) if more else ""
        return format_html(
            '<table class="pgqueue-steps"><thead><tr><th>kind</th><th>name</th>'
            "<th>attempt</th><th>bytes</th><th>recorded</th></tr></thead>"
            "<tbody>{}</tbody></table>{}",
            body,
            tail,
        )

    @admin.display(description="result")
    def result_pretty(self, obj: Job) -> str:
        if obj.result is None:
            return "—"
        return format_html('<pre class="pgqueue-json">{}</pre>', pretty_json(obj.result))

    @admin.display(description="errors")
    def errors_pretty(self, obj: Job) -> str:
        errors = obj.errors if isinstance(obj.errors, list) else [obj.errors]
        if not errors:
            return "—"
        rows = []
        for entry in reversed(errors):
            if not isinstance(entry, dict):
                entry = {"traceback": pretty_json(entry)}
            worker = entry.get("worker_id") or ""
            rows.append(
                (
                    entry.get("attempt", "?"),
                    f"on {worker}" if worker else "(no worker: recorded without a run)",
                    entry.get("exception_class_path", "?"),
                    _error_time(entry.get("at")),
                    task_traceback(entry.get("traceback", "")),
                )
            )
        return format_html_join(
            "",
            '<div class="pgqueue-error"><p><strong>Attempt {}</strong> {}: {}, {}</p>'
            '<pre class="pgqueue-traceback">{}</pre></div>',
            rows,
        )

    @staticmethod
    def selected_ids(request: HttpRequest, queryset: QuerySet) -> list[int]:
        """The ids the operator selected, as posted: a row that stopped being dead since
        the page was drawn still counts as selected, so the guarded statement (not a
        filtered queryset) decides, and the message can say it changed nothing.
        "Select all" selects what the list's queryset holds now."""
        posted: Iterable[str] = request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)
        if request.POST.get("select_across") == "1":
            return list(queryset.values_list("pk", flat=True))
        return sorted({i for i in map(job_id, posted) if i is not None})
