"""The job lists' search box: what a term means, served by indexes, bounded in time.

A term is looked for as

* a job id (ASCII digits, a bigint): the primary key, and nothing else;
* a task path, whole or its beginning: ``pgqueue_job_task_search_idx``
  (``text_pattern_ops``);
* an idempotency key: ``pgqueue_job_key_search_idx``;
* a tag: ``pgqueue_job_tags_search_idx`` (GIN);
* a value inside the job's arguments, by containment through
  ``pgqueue_job_args_search_idx`` and ``pgqueue_job_kwargs_search_idx`` (GIN,
  ``jsonb_path_ops``): a bare word is a positional
  string argument (``eu`` finds ``args`` holding "eu"), ``name=value`` a keyword
  argument (``customer_id=42``: 42 or "42"), and JSON text a part of either (``[42]``,
  ``[42, "eu"]`` of args, ``{"customer": {"id": 42}}`` of kwargs).

Every one of these is an index lookup (the planner ORs them in a bitmap), so no count
and no scan of the table is needed. The tag, argument and task indexes leave running
jobs out (``models.SEARCHABLE``, so that a claim adds no entry to them): a search is
asked as :func:`searched` shapes it, the running jobs (a worker fleet's concurrency
at most) read through ``pgqueue_job_lease_idx`` and filtered. Part of a task path and
error text, which no index serves, are searched too while the table is small
(``SMALL_TABLE`` rows); on a big one they would read every row. The whole page runs
under a time limit (``deadline.within``): a search cut by it shows no rows and a
message saying so.
"""

from __future__ import annotations

import json
from typing import Any

from django.db.models import Q

from .. import validation
from ..exceptions import InvalidJob
from ..models import SEARCHABLE, Job
from ..monitoring import column_stats

#: Up to this many rows (the planner's estimate) a search also matches part of a task
#: path and error text, which read every row.
SMALL_TABLE = 100_000
#: Longest term taken as JSON (a part of args or kwargs).
MAX_JSON_TERM = 2000
#: Longest page of a search, in seconds: the list's statements together.
SEARCH_SECONDS = 3.0
#: What the page says when the search ran out of time.
CUT_MESSAGE = (
    "The search was stopped after {seconds:g} s, before it found every match: no rows "
    "are shown. Narrow it: a whole task path, a tag, an id, name=value for an argument, "
    "or a filter."
)


def job_id(text: str) -> int | None:
    """The job id ``text`` spells in ASCII digits (a bigint), else None (as
    ``base.job_id``; this module sits below ``base``)."""
    if not (text.isascii() and text.isdecimal()) or len(text) > 19:
        return None
    number = int(text)
    return number if 0 < number < 2**63 else None


def searched(q: Q) -> Q:
    """``q`` (the same rows) in the shape the search indexes serve. They leave running
    jobs out, so each alternative of ``q`` is asked of the jobs they hold (``a AND NOT
    running``: the arm implies an index's predicate, and the planner ORs the arms'
    index scans in a bitmap), and ``q`` whole of the running jobs, through
    ``pgqueue_job_lease_idx``. Not ``(q AND NOT running) OR (q AND running)``:
    PostgreSQL factors a clause common to every arm out of an OR, leaving ``q AND
    (NOT running OR running)``, whose alternatives no partial index is proven to serve
    (``bench/search.py`` then read the table through its primary key, 250 ms)."""
    found = q & Q(status=Job.Status.RUNNING)
    for alternative in _alternatives(q):
        found |= alternative & SEARCHABLE
    return found


def _alternatives(q: Q) -> list[Q]:
    """The arms of ``q`` if it is an OR (nested ORs flattened), else ``[q]``."""
    if q.connector != Q.OR or q.negated:
        return [q]
    arms: list[Q] = []
    for child in q.children:
        arms.extend(_alternatives(child) if isinstance(child, Q) else [Q(child)])
    return arms


def search_q(term: str, *, using: str) -> Q:
    """Where ``term`` (stripped, not empty, storable text) may match a job."""
    q = Q(task=term) | Q(task__startswith=term) | Q(idempotency_key=term)
    number = job_id(term)
    if number is not None:
        return Q(pk=number)  # a number is a job id; [42] looks for the argument 42
    if len(term) <= validation.MAX_TAG_LENGTH and validation.TAG_RE.fullmatch(term):
        q |= Q(tags__contains=[term])
    q |= Q(args__contains=[term]) | _json_q(term) | _keyword_q(term)
    if column_stats(using, "task").small(SMALL_TABLE):
        q |= Q(task__icontains=term) | Q(errors__icontains=term)
    return searched(q)


def _storable(value: Any) -> bool:
    """Whether jsonb can take ``value`` (what enqueue checks: no NUL, valid Unicode,
    not too deep, numbers it can hold)."""
    try:
        validation.payload([value], None, max_bytes=MAX_JSON_TERM * 2)
    except (InvalidJob, RecursionError, ValueError):
        return False
    return True


def _json_q(term: str) -> Q:
    """``[...]``: a part of args; ``{...}``: a part of kwargs. Nothing otherwise."""
    if len(term) > MAX_JSON_TERM or term[:1] not in "[{":
        return Q(pk__in=[])
    try:
        value = json.loads(term)
    except (ValueError, RecursionError):
        return Q(pk__in=[])
    if not _storable(value):
        return Q(pk__in=[])
    if isinstance(value, list):
        return Q(args__contains=value)
    if isinstance(value, dict):
        return Q(kwargs__contains=value)
    return Q(pk__in=[])


def _keyword_q(term: str) -> Q:
    """``name=value``: kwargs holding ``name`` with ``value``, as JSON (``42``,
    ``true``, ``"x"``) and as the text typed."""
    name, equals, text = term.partition("=")
    name, text = name.strip(), text.strip()
    if not equals or not name or not text or len(term) > MAX_JSON_TERM:
        return Q(pk__in=[])
    q = Q(kwargs__contains={name: text})
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return q
    if value != text and _storable(value):
        q |= Q(kwargs__contains={name: value})
    return q
