"""The admin: every job read-only, and dead letters with requeue and discard.

Rules this module keeps (docs/admin.md explains them to operators):

* Nothing is added or edited by hand: no add, no change, so no one can point a job at
  another callable or touch a running job that a worker holds a lease on.
* Every state change is one guarded statement from ``sql.py`` through the manager
  (``requeue_dead``, ``discard_dead``): a stale page or a second operator changes
  zero rows, and the message says how many rows changed.
* Every action has its own permission (requeue: ``django_pgqueue.requeue_job``;
  discard: the dead letter's delete permission), is POST only and CSRF-protected
  (Django's admin), and is logged with the user's name.
* Job data is shown through ``format_html`` or plain strings only, so it is escaped.
* List pages stay fast on millions of rows: no ``COUNT(*)`` (estimate paginator),
  sorting only by indexed ``id``, filter choices from planner statistics, no facets.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.actions import delete_selected as django_delete_selected
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.utils import quote
from django.contrib.admin.views.main import ChangeList
from django.db import IntegrityError
from django.db.models import Q, QuerySet
from django.db.models.fields.json import KT
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, QueryDict
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from . import periodic
from .databases import backend_database, default_database, pgqueue_backend_aliases
from .exceptions import InvalidJob
from .models import LIVE_STATUSES, DeadLetter, Job, Schedule, WorkerProcess, WorkerQuerySet
from .monitoring import common_values, queue_summary
from .paginator import EstimatedCountPaginator

if TYPE_CHECKING:
    from django.contrib.admin.options import _FieldsetSpec

logger = logging.getLogger(__name__)

REQUEUE_PERMISSION = "django_pgqueue.requeue_job"
CANCEL_PERMISSION = "django_pgqueue.cancel_job"
#: Jobs listed by name on the cancel confirmation page (all of them are posted back).
CANCEL_SHOWN = 100
#: Longest "last error" shown in a list cell.
ERROR_LINE_CHARS = 200
#: Digits of the largest job id (a bigint).
MAX_ID_DIGITS = 19


# --- which backend's jobs ----------------------------------------------------------------


def request_backend(request: HttpRequest) -> str | None:
    """The ``TASKS`` alias the page is about (the ``backend`` filter, also kept in the
    ``_changelist_filters`` of change and delete pages); None: the default's database."""
    value = request.GET.get("backend")
    if value is None and request.GET.get("_changelist_filters"):
        value = QueryDict(request.GET["_changelist_filters"]).get("backend")
    return value if value in pgqueue_backend_aliases() else None


def admin_database(request: HttpRequest) -> str:
    """The jobs database the page reads and writes: the chosen backend's, else the
    default backend's (each backend may keep its jobs in a database of its own)."""
    alias = request_backend(request)
    return backend_database(alias) if alias else default_database()


def with_backend(url: str, request: HttpRequest) -> str:
    """``url`` keeping the page's ``backend`` choice, for redirects after an action."""
    alias = request_backend(request)
    if alias is None:
        return url
    query = QueryDict(mutable=True)
    query["backend"] = alias
    return f"{url}?{query.urlencode()}"


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


# --- display helpers -------------------------------------------------------------------


def pretty_json(value: Any) -> str:
    """Indented JSON for reading; escaping is the caller's (``format_html``) job."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def error_line(traceback_text: Any) -> str:
    """The exception line of a formatted traceback ("ValueError: boom"), not its
    "Traceback (most recent call last):" header: the first line after the last
    indented (frame) line, since a chained traceback ends with the final exception."""
    if not isinstance(traceback_text, str):
        return ""
    lines = [line for line in traceback_text.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    frames = [i for i, line in enumerate(lines) if line[0].isspace()]
    start = frames[-1] + 1 if frames and frames[-1] + 1 < len(lines) else 0
    return lines[start][:ERROR_LINE_CHARS]


def human_duration(value: dt.timedelta | None) -> str:
    """'2 d 3 h', '4 min 5 s', '0 s': an operator reads this at a glance."""
    if value is None:
        return "—"
    seconds = int(value.total_seconds())
    days, seconds = divmod(seconds, 86400)
    hours, seconds = divmod(seconds, 3600)
    minutes, seconds = divmod(seconds, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "min"), (seconds, "s")]
    shown = [f"{n} {unit}" for n, unit in parts if n][:2]
    return " ".join(shown) or "0 s"


def job_id(text: str) -> int | None:
    """The job id ``text`` spells in ASCII digits (a bigint), else None: never an
    exception, and never a number the database would refuse as out of range."""
    text = text.strip()
    if not (text.isascii() and text.isdecimal()) or len(text) > MAX_ID_DIGITS:
        return None
    number = int(text)
    return number if 0 < number < 2**63 else None


def storable(text: str) -> bool:
    """Whether PostgreSQL can take ``text`` as a text parameter: no NUL character, and
    valid Unicode (no lone surrogate)."""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def actor(request: HttpRequest) -> dict[str, Any]:
    """Who did it, for log records' ``extra``."""
    user = request.user
    return {"user": user.get_username(), "user_id": user.pk}


# --- filters ---------------------------------------------------------------------------


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


# --- shared read-only admin --------------------------------------------------------------


class IndexedOrderChangeList(ChangeList):
    """A change list that sorts only by ``sortable_by`` columns, even when the ``o``
    parameter in the URL asks for another (Django only hides the other headers): on a
    big table any other order is a full scan and sort."""

    def get_ordering_field(self, field_name: Any) -> Any:
        if self.sortable_by is not None and field_name not in self.sortable_by:
            return None
        return super().get_ordering_field(field_name)


def log_change(request: HttpRequest, ids: list[int], message: str) -> None:
    """Record an action on jobs in the admin's history (LogEntry), one entry per job
    it changed; nothing when it changed none."""
    if not ids:
        return
    assert request.user.pk is not None  # the admin lets only staff users in
    LogEntry.objects.log_actions(
        user_id=request.user.pk,
        queryset=Job.objects.using(admin_database(request)).filter(pk__in=ids),
        action_flag=CHANGE,
        change_message=message,
    )


class ViewOnlyAdmin(admin.ModelAdmin):
    """A page that only shows rows the queue itself writes (schedules from settings,
    worker processes, the dashboard): nobody adds, edits or deletes them by hand."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ReadOnlyJobAdmin(admin.ModelAdmin):
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
        "progress_pretty",
    )
    fieldsets: ClassVar[_FieldsetSpec] = (
        (None, {"fields": ("id", "task", "status", "queue", "priority", "backend")}),
        (
            "Attempts",
            {"fields": ("attempts_display", "snoozes", "last_worker", "lease_expires_at")},
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
        ("Errors, newest first", {"fields": ("errors_pretty",)}),
        ("Progress", {"fields": ("progress_pretty",)}),
        ("Result", {"fields": ("result_pretty",)}),
    )

    # No one adds or edits a job by hand: the task path decides what code runs, and a
    # running job belongs to the worker holding its lease.
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return IndexedOrderChangeList

    def get_object(
        self, request: HttpRequest, object_id: str, from_field: str | None = None
    ) -> Any:
        # An empty ?_to_field= makes Django look up a field named "" (a 500); an empty
        # value means no field, as it does on the list page.
        return super().get_object(request, object_id, from_field or None)

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

    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        """Refuse a filter or search no text column can match, before any query:
        PostgreSQL rejects a NUL character in a text parameter with an error (a 500),
        not with "no rows". Django's admin then shows the unfiltered list (``?e=1``),
        and the message says which parameter was dropped."""
        for name, values in request.GET.lists():
            bad = next((v for v in (name, *values) if not storable(v)), None)
            if bad is not None:
                self.message_user(
                    request,
                    f"Ignored the filters: {name[:40]!r} holds a NUL character or invalid "
                    "Unicode, which no job's text can hold.",
                    messages.WARNING,
                )
                raise IncorrectLookupParameters(f"unstorable text in {name!r}")
        return super().get_changelist_instance(request)

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        queryset = super().get_queryset(request).using(admin_database(request))
        match = request.resolver_match
        if match is not None and (match.url_name or "").endswith("_changelist"):
            # A list row needs only the newest traceback, not payloads of up to 1 MB.
            queryset = queryset.defer("args", "kwargs", "result", "errors").annotate(
                last_traceback=KT("errors__-1__traceback")
            )
        return queryset

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


# --- all jobs ---------------------------------------------------------------------------


@admin.register(Job)
class JobAdmin(ReadOnlyJobAdmin):
    """Every job, read-only, with a summary of the queue's health above the list."""

    change_list_template = "admin/django_pgqueue/job/change_list.html"
    list_display = (
        "id",
        "task",
        "queue",
        "status",
        "priority",
        "attempts_display",
        "run_at",
        "worker_link",
        "last_error_line",
    )
    list_filter = (
        BackendFilter,
        "status",
        QueueFilter,
        TaskFilter,
        ("created_at", admin.DateFieldListFilter),
    )
    actions = ("cancel_selected",)
    readonly_fields = (*ReadOnlyJobAdmin.readonly_fields, "status_display")
    fieldsets = tuple(
        (name, {"fields": tuple("status_display" if f == "status" else f for f in opts["fields"])})
        for name, opts in ReadOnlyJobAdmin.fieldsets
    )

    @admin.display(description="status")
    def status_display(self, obj: Job) -> str:
        """A dead job's status links to its dead-letter page, where it can be requeued."""
        if obj.status != Job.Status.DEAD:
            return obj.get_status_display()
        url = reverse(
            "admin:django_pgqueue_deadletter_change",
            args=[obj.pk],
            current_app=self.admin_site.name,
        )
        return format_html('{} (<a href="{}">requeue or discard it</a>)', "Dead", url)

    @admin.display(description="worker")
    def worker_link(self, obj: Job) -> str:
        """A running job's lease owner, linked to its row in the workers list."""
        if obj.status != Job.Status.RUNNING or not obj.lease_owner:
            return ""
        url = reverse(
            "admin:django_pgqueue_workerprocess_change",
            args=[quote(obj.lease_owner)],
            current_app=self.admin_site.name,
        )
        return format_html('<a href="{}">{}</a>', url, obj.lease_owner)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Dead letters are discarded from their own page; other jobs are not deleted
        # by hand (done jobs are pruned by the sweeper).
        return False

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(CANCEL_PERMISSION)

    @admin.action(permissions=["cancel"], description="Cancel selected jobs")
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        """A confirmation page first; then one guarded statement per batch
        (``Job.objects.cancel``), and a message saying what changed and what did not."""
        ids = DeadLetterAdmin.selected_ids(request, queryset)
        if not request.POST.get("post"):
            jobs = list(
                Job.objects.using(admin_database(request))
                .filter(pk__in=ids)
                .order_by("id")
                .only("id", "task", "status", "queue")
            )
            return TemplateResponse(
                request,
                "admin/django_pgqueue/job/cancel_selected_confirmation.html",
                {
                    **self.admin_site.each_context(request),
                    "title": "Cancel jobs",
                    "opts": self.model._meta,
                    "jobs": jobs,
                    "shown": jobs[:CANCEL_SHOWN],
                    "more": max(0, len(jobs) - CANCEL_SHOWN),
                    "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
                },
            )
        result = Job.objects.db_manager(admin_database(request)).cancel(ids)
        logger.info(
            "%s cancelled %d and requested cancellation of %d of %d selected jobs: %s %s",
            request.user.get_username(),
            len(result.cancelled),
            len(result.requested),
            len(ids),
            result.cancelled,
            result.requested,
            extra={
                "action": "cancel",
                "job_ids": result.cancelled + result.requested,
                **actor(request),
            },
        )
        changed = result.cancelled + result.requested
        log_change(request, changed, "Cancelled from the admin.")
        parts = [
            f"Cancelled {len(result.cancelled)} job{'s' if len(result.cancelled) != 1 else ''}"
        ]
        if result.requested:
            parts.append(
                f"asked {len(result.requested)} running job"
                f"{'s' if len(result.requested) != 1 else ''} to stop (job "
                + ", ".join(str(i) for i in result.requested[:10])
                + ")"
            )
        missed = len(ids) - len(changed)
        if missed:
            parts.append(
                f"{missed} of {len(ids)} selected not cancelled: already finished (done, "
                "dead or cancelled) or busy at that instant"
            )
        self.message_user(
            request, "; ".join(parts) + ".", messages.SUCCESS if changed else messages.WARNING
        )
        return None

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if self.has_view_permission(request):
            extra_context = {**(extra_context or {}), **self.summary_context(request)}
        return super().changelist_view(request, extra_context)

    def summary_context(self, request: HttpRequest) -> dict[str, Any]:
        """Counts per status and queue, the longest wait and expired leases."""
        summary = queue_summary(admin_database(request))
        totals = []
        for status, label in Job.Status.choices:
            total = summary.totals.get(status)
            if status in summary.estimated and total is not None:
                shown = f"≈ {total:,}"
            elif status in summary.capped:
                shown = f"≥ {total:,}"
            else:
                shown = "?" if total is None else f"{total:,}"
            totals.append({"status": status, "label": label, "shown": shown})
        queue_rows = [
            {"queue": queue, "counts": [summary.live.get((s, queue), 0) for s in LIVE_STATUSES]}
            for queue in summary.queues
        ]
        return {
            "pgqueue_summary": {
                "totals": totals,
                "live_statuses": LIVE_STATUSES,
                "queue_rows": queue_rows,
                "cap": summary.cap,
                "capped": bool(summary.capped),
                "oldest_pending_wait": human_duration(summary.oldest_pending_wait),
                "wait_is_lower_bound": "pending" in summary.capped,
                "expired_leases": summary.expired_leases,
                "dead_letters_url": reverse(
                    "admin:django_pgqueue_deadletter_changelist", current_app=self.admin_site.name
                ),
            }
        }


# --- dead letters -----------------------------------------------------------------------


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
class DeadLetterAdmin(ReadOnlyJobAdmin):
    """Jobs that used up their attempts: inspect, requeue, discard."""

    list_display = (
        "id",
        "task",
        "queue",
        "attempts_display",
        "last_error_line",
        "died_at",
    )
    list_filter = (BackendFilter, TaskFilter, QueueFilter, ("finished_at", DiedFilter))
    action_form = RequeueActionForm
    actions = ("requeue", "delete_selected")

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
        """Back to pending, attempts reset, errors kept: one guarded statement."""
        try:
            queue, priority = requeue_options(request)
            ids = self.selected_ids(request, queryset)
            requeued = Job.objects.db_manager(admin_database(request)).requeue_dead(
                ids, queue=queue, priority=priority
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
            f"priority={'same' if priority is None else priority}).",
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


# --- periodic schedules -----------------------------------------------------------------


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
        return next((e for e in valid if e.name == obj.name), None)

    @admin.display(description="state")
    def state(self, obj: Schedule) -> str:
        entry = self._entry(obj)
        if entry is None:
            return "removed from settings (no longer enqueued)"
        return "enabled" if entry.enabled else "disabled"

    @admin.display(description="next tick")
    def next_tick(self, obj: Schedule) -> dt.datetime | str:
        """From the entry as the settings give it now (a changed cron shows here at once)."""
        entry = self._entry(obj)
        if entry is None or not entry.enabled:
            return "—"
        tick = entry.next_tick(dt.datetime.now(dt.UTC))
        return "—" if tick is None else tick

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


# --- workers ------------------------------------------------------------------------------


@admin.register(WorkerProcess)
class WorkerProcessAdmin(ViewOnlyAdmin):
    """The workers table, read-only: who runs, where, since when, holding how many jobs.

    Rows are written by the workers themselves (and pruned by the sweeper), never here.
    """

    list_display = (
        "id",
        "state",
        "hostname",
        "pid",
        "queues_display",
        "concurrency",
        "version",
        "started_at",
        "last_seen_at",
        "jobs_held",
        "jobs_done",
        "jobs_failed",
    )
    readonly_fields = (
        "id",
        "state",
        "hostname",
        "pid",
        "queues_display",
        "concurrency",
        "lease_seconds",
        "version",
        "started_at",
        "last_seen_at",
        "jobs_held",
        "jobs_done",
        "jobs_failed",
        "running_jobs",
    )
    fields = readonly_fields
    search_fields = ("id", "hostname")
    list_per_page = 100
    sortable_by = ("id", "hostname", "started_at", "last_seen_at")

    # Not deleted by hand either: a live worker would register again at its next beat.

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        queryset = super().get_queryset(request)
        assert isinstance(queryset, WorkerQuerySet)
        return queryset.with_state()

    @admin.display(description="state", boolean=False)
    def state(self, obj: WorkerProcess) -> str:
        """Lost: not seen for longer than its lease (judged by the database clock)."""
        return "lost" if getattr(obj, "lost", False) else "live"

    @admin.display(description="queues")
    def queues_display(self, obj: WorkerProcess) -> str:
        return ", ".join(obj.queues) if obj.queues else "all"

    @admin.display(description="running jobs")
    def running_jobs(self, obj: WorkerProcess) -> str:
        url = reverse("admin:django_pgqueue_job_changelist", current_app=self.admin_site.name)
        return format_html(
            '<a href="{}?status__exact=running&amp;lease_owner={}">jobs this worker holds</a>',
            url,
            obj.id,
        )


# The dashboard page registers itself (its own module: a view, not a model admin).
from . import dashboard  # noqa: E402, F401
