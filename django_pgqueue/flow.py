"""Flow control: limits per concurrency key and per queue, fair turns, paused queues.

What is in force is a :class:`FlowView`: the limits (``PGQUEUE_LIMITS``, the declared
defaults, with the rows of ``pgqueue_limit`` set at run time on top), the paused
queues (rows of ``pgqueue_queue``) and the fair queues (``PGQUEUE_FAIR_QUEUES``). A
worker loads it at start and again about once a second (:class:`FlowState`), at once
when ``Job.objects.set_limit()``, ``pause_queue()`` and the like notify it (a NOTIFY
on the worker channel whose payload starts with :data:`NOTIFY_PREFIX`), and claims
through today's statements while nothing is in force for its queues.

A limit's key is one of:

``"stripe"``
    an exact concurrency key: one budget shared by all its jobs;
``"tenant:*"``
    a prefix: every concurrency key that starts with ``"tenant:"`` is a budget of its
    own (``"*"`` alone: every key);
``"queue:emails"``
    a queue: one budget for all of the queue's jobs.

and its value ``{"concurrency": N, "rate": "R/s" | "R/m" | "R/h"}`` (either or both):
at most N of the budget's jobs running at once, at most R started in any sliding
window of one second, minute or hour, by the database's clock. A job obeys every limit
that matches it. How the claim enforces them is in ``sql.JOB_CLAIM_LIMITED``.

This module runs the statements of ``sql/flow.py`` (the claims under flow control) and
``sql/flow_control.py`` (limits and pauses set at run time), for ``Job.objects``.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import connections, transaction

from . import db, enqueue, validation
from .conf import settings
from .sql import flow as sql
from .sql import flow_control

#: A NOTIFY payload starting with this (a colon: no queue name has one) tells workers
#: that limits or paused queues changed: they load them again before their next claim.
NOTIFY_PREFIX = "flow:"
#: How often a worker loads the limits and paused queues when not told sooner.
REFRESH_SECONDS = 1.0
#: The periods a rate may be given in, by their letter.
RATE_PERIODS = {"s": 1.0, "m": 60.0, "h": 3600.0}
#: The largest R of a rate: a budget's window keeps one timestamp per start in it.
MAX_RATE = 100_000
#: The largest concurrency bound (the column is an int; a fleet runs far fewer).
MAX_CONCURRENCY = 1_000_000
#: A queue limit's key is this and the queue's name.
QUEUE_PREFIX = validation.QUEUE_LIMIT_PREFIX
#: Longest limit key, as long as a concurrency key (the column's length).
MAX_KEY_LENGTH = validation.MAX_CONCURRENCY_KEY_LENGTH

_RATE_RE = re.compile(r"\s*(\d+)\s*/\s*([smh])\s*")


@dataclass(frozen=True, slots=True)
class LimitSpec:
    """One limit: its key as declared, its bound on what runs at once (None: none) and
    its rate as (starts, window seconds) (None: none). Neither: it lifts a declared
    limit of the same key (a row set at run time)."""

    key: str
    concurrency: int | None = None
    rate: tuple[int, float] | None = None

    @property
    def queue(self) -> str | None:
        """The queue of a ``queue:NAME`` limit; None for a key limit."""
        return self.key[len(QUEUE_PREFIX) :] if self.key.startswith(QUEUE_PREFIX) else None

    @property
    def prefix(self) -> bool:
        """Whether the key ends in ``*``: every matching key has a budget of its own."""
        return self.key.endswith("*")

    @property
    def lifts(self) -> bool:
        """A limit with no bound: it removes the declared limit of its key."""
        return self.concurrency is None and self.rate is None

    def matches(self, key: str) -> bool:
        """Whether this (key) limit applies to jobs of concurrency key ``key``."""
        if not key or self.queue is not None:
            return False
        return key.startswith(self.key[:-1]) if self.prefix else key == self.key

    def describe(self) -> str:
        """``concurrency 2, rate 4/s``, as the status command and the admin show it."""
        parts = []
        if self.concurrency is not None:
            parts.append(f"concurrency {self.concurrency}")
        if self.rate is not None:
            parts.append(f"rate {format_rate(self.rate)}")
        return ", ".join(parts) or "no limit"


def format_rate(rate: tuple[int, float]) -> str:
    """``(4, 1.0)`` as ``"4/s"``."""
    count, seconds = rate
    letter = next((k for k, v in RATE_PERIODS.items() if v == seconds), None)
    return f"{count}/{letter}" if letter else f"{count}/{seconds:g}s"


def parse_rate(value: Any) -> tuple[int, float]:
    """``"R/s"``, ``"R/m"`` or ``"R/h"`` as (R, window seconds); ``ValueError`` naming
    what is wrong otherwise (R a positive int up to :data:`MAX_RATE`)."""
    match = _RATE_RE.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError(
            f'rate must be "R/s", "R/m" or "R/h" with R a positive int, not '
            f"{validation.show(value)}"
        )
    count = int(match.group(1))
    if not 1 <= count <= MAX_RATE:
        raise ValueError(f"rate {value!r}: R must be from 1 to {MAX_RATE}")
    return count, RATE_PERIODS[match.group(2)]


def check_key(key: Any) -> str:
    """A limit's key, checked: an exact concurrency key, a prefix ending in ``*``, or
    ``queue:NAME``; ``ValueError`` naming what is wrong otherwise."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"a limit's key must be a non-empty str, not {validation.show(key)}")
    if len(key) > MAX_KEY_LENGTH:
        raise ValueError(f"limit key {validation.show(key)} is longer than {MAX_KEY_LENGTH}")
    if key.startswith(QUEUE_PREFIX):
        name = key[len(QUEUE_PREFIX) :]
        if not validation.QUEUE_NAME_RE.fullmatch(name):
            raise ValueError(
                f"limit key {key!r}: {name!r} is no queue name (1 to 64 of A-Z a-z 0-9 _ . -)"
            )
        return key
    if "*" in key[:-1]:
        raise ValueError(
            f"limit key {key!r}: a '*' may only end a key (\"tenant:*\" limits each key "
            'that starts with "tenant:")'
        )
    if "\x00" in key:
        raise ValueError(f"limit key {validation.show(key)} contains a NUL character")
    if not key.isascii():
        try:
            key.encode("utf-8")
        except UnicodeEncodeError as exc:
            # It could never be sent to PostgreSQL: every claim would fail on it.
            raise ValueError(
                f"limit key {key!r} contains a lone surrogate {key[exc.start]!r}: "
                "not valid Unicode"
            ) from None
    return key


def parse_limit(key: Any, spec: Any, *, allow_empty: bool = False) -> LimitSpec:
    """One ``PGQUEUE_LIMITS`` entry (or a run-time limit) as a :class:`LimitSpec`;
    ``ValueError`` naming the key and what is wrong otherwise. ``allow_empty``: a spec
    with neither bound is allowed (it lifts the declared limit of the key)."""
    key = check_key(key)
    if not isinstance(spec, Mapping):
        raise ValueError(
            f'limit {key!r} must be a dict like {{"concurrency": 2, "rate": "10/s"}}, '
            f"not {validation.show(spec)}"
        )
    unknown = set(spec) - {"concurrency", "rate"}
    if unknown:
        names = ", ".join(sorted(map(repr, unknown)))
        raise ValueError(f'limit {key!r}: unknown {names}: use "concurrency" and "rate"')
    concurrency = spec.get("concurrency")
    if concurrency is not None and (
        isinstance(concurrency, bool)
        or not isinstance(concurrency, int)
        or not 1 <= concurrency <= MAX_CONCURRENCY
    ):
        raise ValueError(
            f"limit {key!r}: concurrency must be an int from 1 to {MAX_CONCURRENCY}, not "
            f"{validation.show(concurrency)}"
        )
    rate_value = spec.get("rate")
    try:
        rate = None if rate_value in (None, "") else parse_rate(rate_value)
    except ValueError as exc:
        raise ValueError(f"limit {key!r}: {exc}") from None
    if concurrency is None and rate is None and not allow_empty:
        raise ValueError(f'limit {key!r} has neither "concurrency" nor "rate"')
    return LimitSpec(key, concurrency, rate)


def limit_problems(value: Any) -> list[str]:
    """What is wrong with a ``PGQUEUE_LIMITS`` value, one message per problem."""
    if value is None:
        return []
    if not isinstance(value, Mapping):
        return [f"must be a dict of limits by key, not {validation.show(value)}"]
    problems = []
    for key, spec in value.items():
        try:
            parse_limit(key, spec)
        except ValueError as exc:
            problems.append(str(exc))
    return problems


def limit_near_misses(value: Any) -> list[str]:
    """``PGQUEUE_LIMITS`` keys that are valid exact keys but read like a queue's budget
    (``"Queue:emails"``, ``" queue:emails"``): almost surely a typo, since no job's key
    is written so, and an exact key limits only jobs that carry it."""
    if not isinstance(value, Mapping):
        return []
    misses = []
    for key in value:
        if not isinstance(key, str) or key.startswith(QUEUE_PREFIX):
            continue
        if key.strip().lower().startswith(QUEUE_PREFIX):
            misses.append(
                f"{key!r} is an exact concurrency key, not a queue's budget: did you mean "
                f"{QUEUE_PREFIX + key.strip()[len(QUEUE_PREFIX) :]!r}?"
            )
    return misses


def fair_problems(value: Any) -> list[str]:
    """What is wrong with a ``PGQUEUE_FAIR_QUEUES`` value."""
    if value is None:
        return []
    if isinstance(value, str) or not isinstance(value, Collection):
        # (A generator, say, would be used up by this very check: no queue fair.)
        return [f"must be a list of queue names, not {validation.show(value)}"]
    return [
        f"{validation.show(name)} is no queue name (1 to 64 of A-Z a-z 0-9 _ . -)"
        for name in value
        if not isinstance(name, str) or not validation.QUEUE_NAME_RE.fullmatch(name)
    ]


def declared() -> dict[str, LimitSpec]:
    """``PGQUEUE_LIMITS``, parsed; ``ImproperlyConfigured`` if it is wrong (the system
    check pgqueue.E063 says so first)."""
    value = settings.LIMITS
    problems = limit_problems(value)
    if problems:
        raise ImproperlyConfigured(f"PGQUEUE_LIMITS: {problems[0]}")
    return {key: parse_limit(key, spec) for key, spec in (value or {}).items()}


def declared_fair() -> frozenset[str]:
    """``PGQUEUE_FAIR_QUEUES``, checked."""
    value = settings.FAIR_QUEUES
    problems = fair_problems(value)
    if problems:
        raise ImproperlyConfigured(f"PGQUEUE_FAIR_QUEUES: {problems[0]}")
    return frozenset(value or ())


@dataclass(frozen=True)
class FlowView:
    """What is in force: the limits (settings merged with run-time rows), the paused
    queues and the fair queues. Immutable; a worker swaps it for a newer one."""

    limits: tuple[LimitSpec, ...] = ()
    paused: frozenset[str] = frozenset()
    fair: frozenset[str] = frozenset()
    #: The claim statements' parameters that say all this (sql._FLOW_LIMITS).
    params: dict[str, Any] = field(init=False, repr=False, compare=False)
    #: The limits of keys, and the queues with a limit (asked on every claim).
    key_limits: tuple[LimitSpec, ...] = field(init=False, repr=False, compare=False)
    limited_queues: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        keys = [limit for limit in self.limits if limit.queue is None]
        queues = [limit for limit in self.limits if limit.queue is not None]
        object.__setattr__(self, "key_limits", tuple(keys))
        object.__setattr__(self, "limited_queues", frozenset(str(limit.queue) for limit in queues))
        limits = {
            "keys": [
                {
                    "name": limit.key,
                    "pattern": limit.key[:-1] if limit.prefix else limit.key,
                    "prefix": limit.prefix,
                    "concurrency": limit.concurrency,
                    "rate": None if limit.rate is None else limit.rate[0],
                    "period": None if limit.rate is None else limit.rate[1],
                }
                for limit in keys
            ],
            "queues": [
                {
                    "queue": limit.queue,
                    "concurrency": limit.concurrency,
                    "rate": None if limit.rate is None else limit.rate[0],
                    "period": None if limit.rate is None else limit.rate[1],
                }
                for limit in queues
            ],
        }
        params = {
            "paused": sorted(self.paused),
            "fair": sorted(self.fair),
            "queue_names": sorted(str(limit.queue) for limit in queues),
            "limits": json.dumps(limits, sort_keys=True),
        }
        object.__setattr__(self, "params", params)

    def queue_limit(self, queue: str) -> LimitSpec | None:
        """The ``queue:NAME`` limit of ``queue``, if any."""
        return next((limit for limit in self.limits if limit.queue == queue), None)

    def key_limits_of(self, key: str) -> list[LimitSpec]:
        """The key limits that apply to jobs of concurrency key ``key``."""
        return [limit for limit in self.key_limits if limit.matches(key)]

    @staticmethod
    def _touches(names: frozenset[str], queues: Iterable[str] | None) -> bool:
        return bool(names) and (queues is None or not names.isdisjoint(queues))

    def limited(self, queues: Iterable[str] | None) -> bool:
        """Whether a claim from ``queues`` (None: every queue) must respect limits: any
        key limit (a keyed job may be in any queue), or a limit of one of its queues."""
        return bool(self.key_limits) or self._touches(self.limited_queues, queues)

    def keys_only(self, queues: Iterable[str] | None) -> bool:
        """Whether the only limits a claim from ``queues`` obeys are concurrency bounds
        of keys: no rate, no limit of one of its queues (a smaller claim statement)."""
        return all(limit.rate is None for limit in self.key_limits) and not self._touches(
            self.limited_queues, queues
        )

    def fair_among(self, queues: Iterable[str] | None) -> bool:
        """Whether a fair queue is among ``queues`` (None: every queue): its jobs are
        taken by turns of their keys, never from the head of the line."""
        return self._touches(self.fair, queues)

    def in_force(self, queues: Iterable[str] | None) -> bool:
        """Whether a claim from ``queues`` cannot take today's plain statements: limits,
        a paused or a fair queue among them."""
        if not (self.limits or self.paused or self.fair):
            return False
        return (
            self.limited(queues)
            or self._touches(self.paused, queues)
            or self._touches(self.fair, queues)
        )


_settings_views: dict[tuple[int, int], tuple[Any, Any, FlowView]] = {}


def settings_view() -> FlowView:
    """The view of the settings alone (no run-time limits, nothing paused); made again
    only when the settings' objects change (``override_settings`` in tests)."""
    limits, fair = settings.LIMITS, settings.FAIR_QUEUES
    cached = _settings_views.get((id(limits), id(fair)))
    if cached is not None and cached[0] is limits and cached[1] is fair:
        return cached[2]
    view = FlowView(limits=tuple(declared().values()), fair=declared_fair())
    _settings_views.clear()
    _settings_views[id(limits), id(fair)] = (limits, fair, view)
    return view


def merge(
    declared_limits: Mapping[str, LimitSpec], rows: Iterable[tuple[Any, ...]]
) -> tuple[tuple[LimitSpec, ...], frozenset[str]]:
    """The limits in force and the paused queues, from the settings' limits and the
    rows of ``sql.FLOW_GET_STATE``: a limit row replaces the declared limit of its key
    (one with no bound removes it); a row that no longer parses is skipped."""
    limits = dict(declared_limits)
    paused = set()
    for kind, key, concurrency, rate in rows:
        if kind == "paused":
            paused.add(key)
            continue
        try:
            spec = parse_limit(key, {"concurrency": concurrency, "rate": rate}, allow_empty=True)
        except ValueError:
            continue  # written by hand around the API; the admin and set_limit check
        if spec.lifts:
            limits.pop(key, None)
        else:
            limits[key] = spec
    return tuple(limits[key] for key in sorted(limits)), frozenset(paused)


def load(alias: str) -> FlowView:
    """The view in force on jobs database ``alias``, read now (one statement)."""
    rows = db.rows(alias, flow_control.FLOW_GET_STATE, {})
    limits, paused = merge(declared(), rows)
    return FlowView(limits=limits, paused=paused, fair=declared_fair())


class FlowState:
    """A worker's view, loaded again when due: :data:`REFRESH_SECONDS` after the last
    load, or at once after :meth:`changed` (the listener heard a flow notification).
    ``current()`` runs on the claim thread, on its connection; ``changed()`` on any."""

    def __init__(self, alias: str, *, refresh_seconds: float = REFRESH_SECONDS) -> None:
        self.alias = alias
        self.refresh_seconds = refresh_seconds
        self._view: FlowView | None = None
        self._loaded_at = float("-inf")
        self._changed = threading.Event()

    def changed(self) -> None:
        """Limits or pauses changed: load them again before the next claim."""
        self._changed.set()

    def current(self) -> FlowView:
        """The view, loaded again first if it is due (raises a ``DatabaseError`` the
        claim loop handles as a failed claim)."""
        now = time.monotonic()
        if (
            self._view is None
            or self._changed.is_set()
            or now - self._loaded_at >= self.refresh_seconds
        ):
            self._changed.clear()
            self._view = load(self.alias)
            self._loaded_at = now
        return self._view


def rotation_cursor(old: str, keys: Iterable[str]) -> str:
    """Where a queue's next walk starts after taking groups of ``keys``: the furthest
    of them in the walk's order from ``old`` (keys after it, then round from the
    start)."""
    after = [key for key in keys if key > old]
    if after:
        return max(after)
    before = [key for key in keys if key <= old]
    return max(before) if before else old


# --- claims under flow control --------------------------------------------------------

#: The position of a queue a resumed claim starts at its head: above every priority (the
#: CHECK constraint keeps them within -100 to 100) and every id, so that only its range
#: below the position, the whole line, holds anything (``sql.JOB_CLAIM_QUEUES_AFTER``).
QUEUE_HEAD = (101, 2**63 - 1)

#: The columns a limited claim (``sql.JOB_CLAIM_LIMITED``) returns after the job's: the
#: lap of the walk that took a job (0: the head of the line), and on a row of its own
#: the queue and the key its walk reached.
FLOW_COLUMNS = ("flow_lap", "flow_queue", "flow_key")

#: Rows the head of a flow claim looks at, per job asked for (and at least this many
#: more): enough to fill the claim when a few keys at the head are full.
FLOW_WINDOW_FACTOR = 1
FLOW_WINDOW_EXTRA = 16
#: Groups (keys) a flow claim's walk steps over per queue, per job asked for (and at
#: least this many more), before it returns short.
FLOW_STEPS_FACTOR = 4
FLOW_STEPS_EXTRA = 64


@dataclass(frozen=True)
class FlowClaim:
    """What a flow claim did (``Job.objects.claim_flow``): the ``jobs`` leased, each
    queue's ``cursors`` for the next claim (where its walk over keys resumes), and
    whether pending jobs were seen that limits kept back (``blocked``: keys at their
    limits, or whose budget another claim held that instant)."""

    jobs: list[Any]
    cursors: dict[str, str]
    blocked: bool = False
    #: Where the next claim from the head of the line may start (``claim_flow``'s
    #: ``after``): the first job in claim order this one read and did not lease, as
    #: (priority, id), the position included; None: where it started.
    resume: tuple[int, int] | None = None
    #: Whether this claim took jobs by walking the keys (the head of the line did not
    #: fill it): the next may as well start with the walk (``claim_flow``'s ``walk``).
    walked: bool = False


def _window(limit: int) -> dict[str, int]:
    """How far a claim of ``limit`` jobs reads the head and walks the keys."""
    return {
        "limit": limit,
        "window": FLOW_WINDOW_FACTOR * limit + FLOW_WINDOW_EXTRA,
        "max_steps": FLOW_STEPS_FACTOR * limit + FLOW_STEPS_EXTRA,
    }


def claim_flow(
    model: Any,
    alias: str,
    worker_id: str,
    *,
    limit: int,
    view: FlowView,
    queues: Iterable[str] | None = None,
    lease_seconds: float | None = None,
    cursors: Mapping[str, str] | None = None,
    after: tuple[int, int] | None = None,
    walk: bool = False,
    now: Any = None,
) -> FlowClaim:
    """Lease up to ``limit`` pending jobs under the flow control of ``view`` (see
    ``Job.objects.claim_flow``): without limits, one statement (``sql.JOB_CLAIM_FLOW``);
    with them, the head of the line first (``sql.JOB_CLAIM_LIMITED_HEAD``, or its
    ``_KEYS`` form), and the walk over keys (``sql.JOB_CLAIM_LIMITED``) only when limits
    kept part of a full head back or a fair queue is among ``queues``."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"claim limit must be an int >= 1, not {limit!r}")
    listed = None if queues is None else sorted(set(queues))
    cursors = dict(cursors or {})
    params: dict[str, Any] = {
        **view.params,
        **_window(limit),
        "worker_id": worker_id,
        "queues": listed,
        "cursors": json.dumps(cursors),
        "after_priority": (after or QUEUE_HEAD)[0],
        "after_id": (after or QUEUE_HEAD)[1],
        "lease_seconds": settings.LEASE_SECONDS if lease_seconds is None else lease_seconds,
        "now": now,
    }
    connection = connections[alias]
    connection.ensure_connection()
    # A claim connection is set up without JIT; any other gets that per transaction.
    set_up = getattr(connection.connection, "_pgqueue_claims_prepared", False)
    if not view.limited(listed):
        return _unlimited(model, alias, params, cursors, set_up)
    leased: list[tuple[Any, ...]] = []
    blocked = False
    resume = None
    # Without fair queues, the head of the line first: a small statement, enough
    # unless limits kept part of a full head back (then the walk, for the rest).
    if not (walk or view.fair_among(listed)):
        head_query = (
            sql.JOB_CLAIM_LIMITED_HEAD_KEYS
            if view.keys_only(listed)
            else sql.JOB_CLAIM_LIMITED_HEAD
        )
        columns, rows = _limited(alias, head_query, params, set_up)
        leased = [row for row in rows if row[0] is not None]
        head, kept, *first_left = next(row[-4:] for row in rows if row[0] is None)
        blocked = head > len(leased)
        resume = _resume(columns, leased, first_left)
        # The walk can only add keys beyond a full head, and only matters when
        # limits kept part of it back; rows whose budgets another claim held were
        # that claim's to take (claiming again finds what they leave), unless
        # they left this claim with nothing.
        if len(leased) == limit or head < params["window"] or not (kept or not leased):
            return _flow_claim(model, alias, columns, leased, cursors, {}, blocked, params, resume)
        params = {**params, **_window(limit - len(leased))}
    return _walked(model, alias, params, cursors, set_up, leased, blocked, resume)


def _unlimited(
    model: Any, alias: str, params: dict[str, Any], cursors: dict[str, str], set_up: bool
) -> FlowClaim:
    """A flow claim with no limit in force (paused or fair queues): one statement."""
    if set_up:
        jobs = db.jobs(model, alias, sql.JOB_CLAIM_FLOW, params)
    else:
        with transaction.atomic(using=alias, savepoint=False):
            db.rows(alias, sql.SESSION_FLOW_LOCAL, {})
            jobs = db.jobs(model, alias, sql.JOB_CLAIM_FLOW, params)
    for queue in {job.queue for job in jobs}:
        cursors[queue] = rotation_cursor(
            cursors.get(queue, ""),
            [job.concurrency_key for job in jobs if job.queue == queue],
        )
    jobs.sort(key=lambda job: (-job.priority, job.id))
    return FlowClaim(jobs, cursors)


def _walked(
    model: Any,
    alias: str,
    params: dict[str, Any],
    cursors: dict[str, str],
    set_up: bool,
    leased: list[tuple[Any, ...]],
    blocked: bool,
    resume: tuple[int, int] | None,
) -> FlowClaim:
    """The rest of a limited claim by the walk over keys (``sql.JOB_CLAIM_LIMITED``),
    after what the head of the line ``leased``."""
    reached: dict[str, list[str]] = {}
    columns, rows = _limited(alias, sql.JOB_CLAIM_LIMITED, params, set_up)
    # The leased jobs, then (id NULL) the group each queue's walk reached if the
    # claim came back short, and a row of NULLs if limits kept every candidate back.
    lap, queue_at, key_at = (columns.index(name) for name in FLOW_COLUMNS)
    walked = [row for row in rows if row[0] is not None]
    for row in rows:
        if row[0] is None and row[queue_at] is not None:  # resume after it
            reached[row[queue_at]] = [row[key_at]]
    for row in walked:
        if row[lap]:  # taken by the walk (not from the head of the line)
            reached.setdefault(row[columns.index("queue")], []).append(
                row[columns.index("concurrency_key")]
            )
    return _flow_claim(
        model,
        alias,
        columns,
        leased + walked,  # the job's columns come first in both: cut once
        cursors,
        reached,
        blocked or bool(rows),
        params,
        resume,
        walked=any(row[lap] for row in walked),
    )


def _resume(
    columns: tuple[str, ...], leased: list[tuple[Any, ...]], first_left: list[Any]
) -> tuple[int, int] | None:
    """Where the next claim from the head starts: the first job of the head not
    leased (``first_left``: its priority and id), else just after the last one
    leased; None if the head was empty."""
    if first_left[0] is not None:
        return (first_left[0], first_left[1])
    if not leased:
        return None
    priority, id_ = columns.index("priority"), columns.index("id")
    last = max(leased, key=lambda row: (-row[priority], row[id_]))
    return (last[priority], last[id_] + 1)


def _limited(
    alias: str, query: str, params: dict[str, Any], set_up: bool
) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
    """Run a limited claim statement: without JIT (a claim connection is set up
    so; any other connection for this transaction only)."""
    if set_up:
        return db.returned(alias, query, params)
    with transaction.atomic(using=alias, savepoint=False):
        db.rows(alias, sql.SESSION_FLOW_LOCAL, {})
        return db.returned(alias, query, params)


def _flow_claim(
    model: Any,
    alias: str,
    columns: tuple[str, ...],
    leased: list[tuple[Any, ...]],
    cursors: dict[str, str],
    reached: dict[str, list[str]],
    blocked: bool,
    params: dict[str, Any],
    resume: tuple[int, int] | None = None,
    walked: bool = False,
) -> FlowClaim:
    """The FlowClaim of the ``leased`` rows of a limited claim (their job columns
    first, as ``columns`` name them), each queue's cursor moved past the keys its
    walk ``reached``."""
    width = columns.index(FLOW_COLUMNS[0])
    jobs = db.load_jobs(
        model,
        alias,
        columns[:width],
        [row[:width] for row in leased],
        (sql.JOB_CLAIM_LIMITED, params),
    )
    for queue, keys_ in reached.items():
        cursors[queue] = rotation_cursor(cursors.get(queue, ""), keys_)
    jobs.sort(key=lambda job: (-job.priority, job.id))
    return FlowClaim(jobs, cursors, blocked=blocked and not jobs, resume=resume, walked=walked)


# --- limits and pauses at run time ------------------------------------------------------


def set_limit(
    alias: str,
    key: str,
    *,
    concurrency: int | None = None,
    rate: str | None = None,
    now: Any = None,
) -> LimitSpec:
    """Store the run-time limit of ``key`` (see ``Job.objects.set_limit``) and tell
    workers at commit; a bad value raises ``ValueError`` naming it, and nothing changes."""
    spec = parse_limit(key, {"concurrency": concurrency, "rate": rate}, allow_empty=True)
    db.rows(
        alias,
        flow_control.LIMIT_SET,
        {
            "key": spec.key,
            "concurrency": spec.concurrency,
            "rate": "" if spec.rate is None else format_rate(spec.rate),
            "now": now,
        },
    )
    changed(alias)
    return spec


def reset_limit(alias: str, key: str) -> bool:
    """Remove the run-time limit of ``key``; whether there was one."""
    found = bool(db.rows(alias, flow_control.LIMIT_DELETE, {"key": check_key(key)}))
    if found:
        changed(alias)
    return found


def pause_queue(alias: str, name: str, *, now: Any = None) -> None:
    """Pause queue ``name`` (stored in the database) and tell workers at commit."""
    db.rows(alias, flow_control.QUEUE_PAUSE, {"name": validation.queue_name(name), "now": now})
    changed(alias)


def resume_queue(alias: str, name: str, *, now: Any = None) -> bool:
    """Let workers claim from queue ``name`` again, and wake them; whether it was paused."""
    queue = validation.queue_name(name)
    resumed = bool(db.rows(alias, flow_control.QUEUE_RESUME, {"name": queue, "now": now}))
    if resumed:
        changed(alias)
        enqueue.notify(alias, queue)
    return resumed


def changed(alias: str) -> None:
    """Tell workers (at commit) to load limits and paused queues again."""
    db.rows(
        alias,
        flow_control.FLOW_NOTIFY,
        {"channel": settings.NOTIFY_CHANNEL, "payload": NOTIFY_PREFIX},
    )
