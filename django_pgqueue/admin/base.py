"""What every page of the admin shares: which backend's jobs a page reads, the display
helpers (durations, JSON, the last error line), the history entry an action writes, and
``ViewOnlyAdmin`` for the pages that only show what the queue itself writes.

The bottom of the package: it imports no other admin module.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import django
from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList
from django.db import DataError, NotSupportedError, ProgrammingError, transaction
from django.http import HttpRequest, QueryDict
from django.utils import timezone

from ..databases import backend_database, default_database, pgqueue_backend_aliases
from ..models import Job

#: Longest "last error" shown in a list cell.
ERROR_LINE_CHARS = 200
#: Digits of the largest job id (a bigint).
MAX_ID_DIGITS = 19
#: Django 6.1 draws (and styles) the admin's breadcrumbs as ``ol.breadcrumbs``, earlier
#: versions as a ``div``: the app's own pages follow the version in use.
BREADCRUMBS_AS_LIST = django.VERSION >= (6, 1)
#: What a list's query raises when a lookup in the URL cannot run: a value PostgreSQL
#: refuses (DataError), a lookup it lacks (an extension not installed), a value Python
#: cannot convert (a year out of range, invalid Unicode) or a range that is not a pair.
QUERY_ERRORS = (
    DataError,
    NotSupportedError,
    ProgrammingError,
    ValueError,
    OverflowError,
    LookupError,
    TypeError,
)


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


# --- display helpers -------------------------------------------------------------------


#: Stands for a stored payload nested deeper than Python's JSON decoder goes
#: (``ReadOnlyJobAdmin.get_object``); :func:`pretty_json` shows a note instead.
TOO_DEEP = object()


def pretty_json(value: Any) -> str:
    """Indented JSON for reading; escaping is the caller's (``format_html``) job."""
    if value is not TOO_DEEP:
        try:
            return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)
        except RecursionError:
            pass  # stored before enqueue refused more than 500 levels: show the page
    return "(nested too deep to show here)"


#: Most items of a list or dict shown on a job page (the rest summed up in one line).
SHOWN_ITEMS = 50


def shortened(value: Any, items: int = SHOWN_ITEMS, depth: int = 20) -> Any:
    """``value`` with each list and dict cut to its first ``items`` entries and a last
    one saying how many more there are: a 1,200-item argument list is not printed one
    item per line down a 5,800-pixel page (the row holds all of it). Below ``depth``
    levels a value is left whole (``pretty_json`` copes with one nested too deep)."""
    if depth <= 0:
        return value
    if isinstance(value, list):
        shown = [shortened(v, items, depth - 1) for v in value[:items]]
        more = len(value) - items
        return [*shown, f"… {more:,} more items"] if more > 0 else shown
    if isinstance(value, dict):
        keys = list(value)[:items]
        cut: dict[Any, Any] = {k: shortened(value[k], items, depth - 1) for k in keys}
        more = len(value) - items
        if more > 0:
            cut["…"] = f"{more:,} more keys"
        return cut
    return value


#: Source files of the worker's own frames, dropped from the top of a shown traceback.
WORKER_FRAME = "django_pgqueue/worker/"


def task_traceback(text: Any) -> str:
    """A stored traceback as shown: the worker's own frames at its top (the runner that
    called the task) left out and counted, so it starts at the task's code."""
    if not isinstance(text, str):
        return "" if text is None else str(text)
    lines = text.splitlines()
    if not lines or not lines[0].startswith("Traceback"):
        return text
    i, dropped = 1, 0
    while i < len(lines) and lines[i].startswith('  File "'):
        if WORKER_FRAME not in lines[i].replace("\\", "/"):
            break
        i += 1
        while i < len(lines) and lines[i].startswith("    "):
            i += 1  # the frame's source line (and any caret line)
        dropped += 1
    if not dropped:
        return text
    note = f"  ({dropped} frame{'s' if dropped != 1 else ''} of the worker left out)"
    return "\n".join([lines[0], note, *lines[i:]])


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


def timestamp(value: dt.datetime | None) -> str:
    """A time to the second in the current time zone, with its offset
    ("2026-12-04 20:20:20 +00:00"): what an operator compares with a log line."""
    if value is None:
        return "—"
    local = timezone.localtime(value) if timezone.is_aware(value) else value
    offset = local.strftime("%z")  # "+0100", or "" for a naive time
    text = local.strftime("%Y-%m-%d %H:%M:%S")
    return f"{text} {offset[:3]}:{offset[3:]}" if offset else text


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


# --- shared read-only admin --------------------------------------------------------------


class GuardedChangeList(ChangeList):
    """A change list whose query runs while the list is built, in a savepoint: Django
    takes any field and lookup of the model as a query parameter and checks only that
    the filter can be built, so a value PostgreSQL refuses (an array literal that is
    not one, a bad regular expression, a year past 9999) failed while the page was
    rendered, a 500. Here it is an invalid filter (Django's ``?e=1`` redirect)."""

    def get_results(self, request: HttpRequest) -> None:
        try:
            with transaction.atomic(using=self.queryset.db):
                super().get_results(request)
                len(self.result_list)  # runs the page's query now; the page reuses its rows
        except QUERY_ERRORS as exc:
            if not self.filter_params:
                raise  # not the URL's fault: no parameter to blame
            raise IncorrectLookupParameters(exc) from exc


class IndexedOrderChangeList(GuardedChangeList):
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


class GuardedAdmin(admin.ModelAdmin):
    """A model admin that answers a query string or primary key the database cannot
    take with the list's "invalid filter" redirect or the admin's "not found", never
    with a 500; every page of the app derives from it."""

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return GuardedChangeList

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
                    "Unicode, which no stored text can hold.",
                    messages.WARNING,
                )
                raise IncorrectLookupParameters(f"unstorable text in {name!r}")
        return super().get_changelist_instance(request)

    def get_object(
        self, request: HttpRequest, object_id: str, from_field: str | None = None
    ) -> Any:
        # A key no row can hold is no row (Django then says "not found"), not a query
        # PostgreSQL refuses. An empty ?_to_field= made Django look up a field named ""
        # (a 500); an empty value means no field, as it does on the list page.
        if not storable(object_id):
            return None
        return super().get_object(request, object_id, from_field or None)


class ViewOnlyAdmin(GuardedAdmin):
    """A page that only shows rows the queue itself writes (schedules from settings,
    worker processes, the dashboard): nobody adds, edits or deletes them by hand."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
