"""``ReadOnlyJobAdmin``: the read-only job pages the job list and the dead-letter list
share (columns, detail fieldsets, search, the cheap paginator, the posted selection)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

from django.contrib import admin
from django.contrib.admin import helpers
from django.contrib.admin.views.main import ChangeList
from django.db.models import Q, QuerySet
from django.db.models.fields.json import KT
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join

from ..models import Job
from .base import (
    MAX_ID_DIGITS,
    TOO_DEEP,
    GuardedAdmin,
    IndexedOrderChangeList,
    admin_database,
    error_line,
    job_id,
    pretty_json,
)
from .paginator import EstimatedCountPaginator
from .workflow import WORKFLOW, WorkflowDisplay, in_workflow

if TYPE_CHECKING:
    from django.contrib.admin.options import _FieldsetSpec


#: The JSON columns a user's data fills (the worker writes ``errors``, bounded).
PAYLOADS = ("args", "kwargs", "result", "progress")


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
    search_help_text = "A job id, part of a task path, an idempotency key, or error text."
    readonly_fields: ClassVar[tuple[str, ...]] = (
        "id",
        "task",
        "status",
        "queue",
        "priority",
        "backend",
        "idempotency_key",
        "attempts_display",
        "last_worker",
        "lease_expires_at",
        "created_at",
        "run_at",
        "started_at",
        "last_attempted_at",
        "finished_at",
        "args_pretty",
        "kwargs_pretty",
        "errors_pretty",
        "result_pretty",
        "snoozes",
        "soft_time_limit",
        "time_limit",
        "progress_pretty",
        "workflow_display",
        "parents_display",
        "dependants_display",
    )
    fieldsets: ClassVar[_FieldsetSpec] = (
        (None, {"fields": ("id", "task", "status", "queue", "priority", "backend")}),
        (
            "Attempts",
            {
                "fields": (
                    "attempts_display",
                    "snoozes",
                    "last_worker",
                    "lease_expires_at",
                    "soft_time_limit",
                    "time_limit",
                )
            },
        ),
        (
            "Timestamps",
            {
                "fields": (
                    "created_at",
                    "run_at",
                    "started_at",
                    "last_attempted_at",
                    "finished_at",
                )
            },
        ),
        ("Payload", {"fields": ("args_pretty", "kwargs_pretty", "idempotency_key")}),
        (WORKFLOW, {"fields": ("workflow_display", "parents_display", "dependants_display")}),
        ("Errors, newest first", {"fields": ("errors_pretty",)}),
        ("Progress", {"fields": ("progress_pretty",)}),
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
        """A number is a job id (a primary-key lookup); anything else is looked for in
        the task path, the idempotency key and the errors (these scan)."""
        term = search_term.strip()
        if not term:
            return queryset, False
        # isdecimal(), not isdigit(): "²" is a digit that int() refuses. At most 19
        # digits: a bigint, and never past Python's int-to-str digit limit.
        if term.isdecimal() and len(term) <= MAX_ID_DIGITS and int(term) < 2**63:
            return queryset.filter(pk=int(term)), False
        return (
            queryset.filter(
                Q(task__icontains=term) | Q(idempotency_key=term) | Q(errors__icontains=term)
            ),
            False,
        )

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
        return format_html('<pre class="pgqueue-json">{}</pre>', pretty_json(obj.args))

    @admin.display(description="kwargs")
    def kwargs_pretty(self, obj: Job) -> str:
        return format_html('<pre class="pgqueue-json">{}</pre>', pretty_json(obj.kwargs))

    @admin.display(description="progress")
    def progress_pretty(self, obj: Job) -> str:
        """What the task last said with ``current_job().set_progress()``."""
        if obj.progress is None:
            return "—"
        return format_html('<pre class="pgqueue-json">{}</pre>', pretty_json(obj.progress))

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
            rows.append(
                (
                    entry.get("attempt", "?"),
                    entry.get("worker_id", "?"),
                    entry.get("exception_class_path", "?"),
                    entry.get("at", ""),
                    entry.get("traceback", ""),
                )
            )
        return format_html_join(
            "",
            '<div class="pgqueue-error"><p><strong>Attempt {}</strong> on {}: {} {}</p>'
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
