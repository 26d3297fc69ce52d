"""Periodic jobs: the ``PGQUEUE_PERIODIC`` entries, their cron ticks, and enqueueing them.

Each entry names a task and a cron expression. Every sweep pass computes, for each
enabled entry, its latest tick at or before the database's clock, and one conditional
statement for all entries (``sql.SCHEDULE_ENQUEUE_TICKS``) advances each entry's row in
``pgqueue_schedule`` and inserts its job together, only if that row's last tick is older.
However many sweepers run, each tick is enqueued once, and never before its time by the
database's clock. Catch-up: a sweeper that starts after missed ticks (or a clock that
steps forward) enqueues only the latest of them, no flood of catch-up jobs. A clock that
steps back behind an entry's last tick rewinds the entry to its latest tick by the
corrected clock (so it keeps ticking) and sends the not yet started job of that future
tick back to ``scheduled``, to run at its time.

Sweepers that disagree on an entry (a rolling deploy: another cron, time zone or
``enabled``) do not starve it: the row takes the definition of the sweeper that syncs or
ticks it, and a changed definition skips only ticks older than ``CHANGE_GRACE`` (a tick
before the change), so each side's fresh ticks are still enqueued, once per instant.

Cron expressions are parsed and evaluated by ``cronsim``, which follows Debian's cron,
daylight saving time included (see ``docs/howto/periodic-jobs.md``):

* an entry at a fixed time (both the minute and hour fields are numbers or lists, e.g.
  ``30 2 * * *``) whose time falls in a skipped hour runs right after the jump (03:00),
  and in a repeated hour runs once, at the first occurrence;
* an entry whose minute or hour field starts with ``*`` (``0 * * * *``, ``*/15 * * * *``,
  ``0 */2 * * *``) follows real elapsed time: nothing in a skipped hour (it does not
  exist), and both occurrences of a repeated hour.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import zoneinfo
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cronsim import CronSim, CronSimError
from django.apps import apps
from django.conf import settings as django_settings
from django.db import transaction

from . import db, defaults, enqueue, validation
from .conf import settings
from .databases import backend_database, pgqueue_backend_aliases
from .exceptions import InvalidJob
from .sql import periodic as sql

logger = logging.getLogger(__name__)

#: The usual shorthands (Vixie cron's), spelled out as the 5-field expressions they mean.
ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
ENTRY_KEYS = frozenset(
    {
        "task",
        "cron",
        "args",
        "kwargs",
        "queue",
        "priority",
        "timezone",
        "max_attempts",
        "enabled",
        "backend",
        "unique_for",
    }
)
#: Lengths of the ``pgqueue_schedule`` columns these strings are stored in.
MAX_NAME_LENGTH = 200
MAX_TASK_LENGTH = 255
MAX_CRON_LENGTH = 255
MAX_TIMEZONE_LENGTH = 64
#: A sweeper whose definition of an entry differs from the row's (changed, or another
#: side of a rolling deploy) enqueues its latest tick only if it is this recent: older,
#: it came before the change. Longer than the time between two passes of one sweeper.
CHANGE_GRACE = dt.timedelta(minutes=1)
#: Longer than any daylight saving shift: ticks are re-walked forwards over this window
#: so the latest tick is the one a forward walk gives (see ``latest_tick``).
DST_WINDOW = dt.timedelta(hours=3)


@dataclass(frozen=True)
class PeriodicEntry:
    """One validated ``PGQUEUE_PERIODIC`` entry."""

    name: str
    task: str
    cron: str  # as written (an alias stays an alias)
    timezone: str
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    queue: str | None = None  # None: the task's own queue_name
    priority: int | None = None  # None: the task's own priority
    max_attempts: int | None = None  # None: the task's option, else PGQUEUE_MAX_ATTEMPTS
    enabled: bool = True
    backend: str = "default"  # the TASKS alias its jobs' results are read back through
    #: Seconds: its ticks share the key ``periodic:<name>`` and a tick inside the window
    #: of the last job it made enqueues nothing (``enqueue(unique_for=...)``).
    unique_for: float | None = None

    @property
    def unique_key(self) -> str:
        """The idempotency key of its jobs when ``unique_for`` is set; an ``enqueue``
        with this key and ``unique_for`` shares their window."""
        return f"periodic:{self.name}"

    @property
    def expression(self) -> str:
        """The 5-field expression the cron string means."""
        return ALIASES.get(self.cron.strip().lower(), self.cron)

    @property
    def zone(self) -> zoneinfo.ZoneInfo:
        return zoneinfo.ZoneInfo(self.timezone)

    def latest_tick(self, now: dt.datetime) -> dt.datetime | None:
        """The latest tick at or before ``now`` (None: none in the past 50 years)."""
        return latest_tick(self.expression, now.astimezone(self.zone))

    def next_tick(self, now: dt.datetime) -> dt.datetime | None:
        """The first tick after ``now`` (None: none in the next 50 years)."""
        try:
            return next(CronSim(self.expression, now.astimezone(self.zone))).astimezone(dt.UTC)
        except StopIteration:
            return None


def parse_cron(cron: Any) -> str:
    """Return the 5-field expression of ``cron``; raise ``InvalidJob`` saying what is
    wrong with it. Only standard 5-field expressions and the ``@daily``-style aliases are
    accepted (cronsim would also take a seconds field; sweeps are seconds apart)."""
    if not isinstance(cron, str) or not cron.strip():
        raise InvalidJob(f"cron must be a non-empty string, not {cron!r}")
    expression = ALIASES.get(cron.strip().lower())
    if expression is None:
        if cron.strip().startswith("@"):
            raise InvalidJob(
                f"cron {cron!r} is not a known alias (use one of {', '.join(sorted(ALIASES))})"
            )
        expression = cron
        if len(expression.split()) != 5:
            raise InvalidJob(
                f"cron {cron!r} has {len(expression.split())} fields; give the 5 of "
                "standard cron: minute hour day-of-month month day-of-week"
            )
    try:
        CronSim(expression, dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
    except CronSimError as exc:
        raise InvalidJob(f"cron {cron!r} is invalid: {exc}") from None
    return expression


def latest_tick(expression: str, now: dt.datetime) -> dt.datetime | None:
    """The latest tick of ``expression`` at or before the aware datetime ``now`` (whose
    time zone is the entry's), returned in UTC.

    Found backwards (cheap for a yearly entry), then, if the UTC offset changed since a
    few hours before it, confirmed by walking forwards from there: cronsim's backward
    walk gives the first occurrence of a repeated hour where the forward walk gives
    both, and ticks must be the forward ones.
    Compared in UTC: Python compares two times of one zone by wall clock, fold ignored.
    """
    limit = now.astimezone(dt.UTC)
    try:
        candidate = next(CronSim(expression, now + dt.timedelta(seconds=1), reverse=True))
    except StopIteration:
        return None
    latest = candidate.astimezone(dt.UTC)
    start = (latest - DST_WINDOW).astimezone(now.tzinfo)
    if start.utcoffset() == now.utcoffset():
        return latest  # no clock change in between: the backward walk is right
    for tick in CronSim(expression, start):
        tick_utc = tick.astimezone(dt.UTC)
        if tick_utc > limit:
            break
        latest = max(latest, tick_utc)
    return latest


def storable(value: Any, what: str, max_length: int) -> None:
    """Raise ``InvalidJob`` unless the str ``value`` fits a text column of ``max_length``:
    PostgreSQL refuses NUL in text (a DataError that would fail the whole sweep pass),
    and a lone surrogate cannot even be encoded to be sent."""
    if not isinstance(value, str):
        return  # the caller's own type check says what is wrong
    if "\x00" in value:
        raise InvalidJob(f"{what} {value!r} contains a NUL character (\\x00)")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidJob(
                f"{what} {value!r} contains a lone surrogate {value[exc.start]!r}: "
                "not valid Unicode"
            ) from None
    if len(value) > max_length:
        raise InvalidJob(f"{what} is {len(value)} characters, over the limit of {max_length}")


def import_task(path: Any) -> str:
    """``validation.task_path`` for an entry's task, whatever importing it raises: a
    module that fails at import with any error is one bad entry, reported with the
    exception, never a crash of the checks or the sweeper."""
    storable(path, "task", MAX_TASK_LENGTH)
    try:
        resolved = validation.task_path(path)
    except InvalidJob:
        raise
    except (Exception, SystemExit) as exc:  # SystemExit too: a module calling sys.exit()
        raise InvalidJob(f"task {path!r} raised at import: {type(exc).__name__}: {exc}") from None
    storable(resolved, "task", MAX_TASK_LENGTH)
    return resolved


def parse_entry(name: Any, raw: Any) -> PeriodicEntry:
    """Validate one ``PGQUEUE_PERIODIC`` entry; raise ``InvalidJob`` naming the problem.
    Every string that is stored is checked to be storable, so one bad entry cannot fail
    the statements that sync and tick all the others."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_LENGTH:
        raise InvalidJob(f"the name must be a non-empty str of at most {MAX_NAME_LENGTH} chars")
    storable(name, "the name", MAX_NAME_LENGTH)
    if not isinstance(raw, Mapping):
        raise InvalidJob(f"an entry must be a dict, not {type(raw).__name__}")
    unknown = sorted(set(raw) - ENTRY_KEYS)
    if unknown:
        raise InvalidJob(
            f"unknown key(s) {', '.join(map(repr, unknown))}; "
            f"allowed: {', '.join(sorted(ENTRY_KEYS))}"
        )
    for key in ("task", "cron"):
        if key not in raw:
            raise InvalidJob(f"the {key!r} key is missing")
    task_path = import_task(raw["task"])
    storable(raw["cron"], "cron", MAX_CRON_LENGTH)
    parse_cron(raw["cron"])
    tz_name = raw.get("timezone", django_settings.TIME_ZONE or "UTC")
    if not isinstance(tz_name, str):
        raise InvalidJob(f"timezone must be a zone name such as 'Europe/Paris', not {tz_name!r}")
    storable(tz_name, "timezone", MAX_TIMEZONE_LENGTH)
    try:
        zoneinfo.ZoneInfo(tz_name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise InvalidJob(f"timezone {tz_name!r} is not a known time zone") from None
    args = raw.get("args", [])
    kwargs = raw.get("kwargs", {})
    if not isinstance(args, list | tuple):
        raise InvalidJob(f"args must be a list, not {type(args).__name__}")
    if not isinstance(kwargs, Mapping):
        raise InvalidJob(f"kwargs must be a dict, not {type(kwargs).__name__}")
    validation.payload(list(args), dict(kwargs), max_bytes=settings.MAX_PAYLOAD_BYTES)
    queue = raw.get("queue")
    priority = raw.get("priority")
    max_attempts = raw.get("max_attempts")
    enabled = raw.get("enabled", True)
    if not isinstance(enabled, bool):
        raise InvalidJob(f"enabled must be True or False, not {enabled!r}")
    unique_for = raw.get("unique_for")
    return PeriodicEntry(
        name=name,
        task=task_path,
        cron=raw["cron"],
        timezone=tz_name,
        args=list(args),
        kwargs=dict(kwargs),
        queue=None if queue is None else validation.queue_name(queue),
        priority=None if priority is None else validation.priority(priority),
        max_attempts=None if max_attempts is None else validation.max_attempts(max_attempts),
        enabled=enabled,
        backend=validation.backend_alias(raw.get("backend", "default")),
        unique_for=None if unique_for is None else enqueue.period(unique_for, "unique_for"),
    )


def entries() -> tuple[list[PeriodicEntry], dict[str, str]]:
    """The valid entries of ``PGQUEUE_PERIODIC``, and a message per invalid one (by name).

    The system checks report the invalid ones at start; a sweeper skips them."""
    raw = settings.PERIODIC
    if raw is None:
        return [], {}
    if not isinstance(raw, Mapping):
        return [], {"": f"PGQUEUE_PERIODIC must be a dict of entries, not {type(raw).__name__}"}
    valid: list[PeriodicEntry] = []
    errors: dict[str, str] = {}
    for name, entry in raw.items():
        try:
            valid.append(parse_entry(name, entry))
        except InvalidJob as exc:
            errors[str(name)] = str(exc)
    return valid, errors


def backend_of(using: str) -> str:
    """The backend alias whose jobs database is ``using`` (a schedule's jobs are read
    back through it)."""
    return next((a for a in pgqueue_backend_aliases() if backend_database(a) == using), "default")


def database_entries(using: str) -> tuple[list[PeriodicEntry], dict[str, str]]:
    """The database's schedules (``django_pgqueue.schedules``) as periodic entries,
    and a message per one that is no longer valid (its task gone, or its name now taken
    by ``PGQUEUE_PERIODIC``), keyed ``database:<name>``. Read by each sweep pass."""
    backend = backend_of(using)
    taken = settings.PERIODIC or {}
    valid: list[PeriodicEntry] = []
    errors: dict[str, str] = {}
    model = apps.get_model("django_pgqueue", "ScheduleDefinition")
    for row in model.objects.using(using).order_by("name"):
        if row.name in taken:
            errors[f"database:{row.name}"] = "shadowed by the PGQUEUE_PERIODIC entry of that name"
            continue
        raw = {
            "task": row.task,
            "cron": row.cron,
            "timezone": row.timezone,
            "args": row.args,
            "kwargs": row.kwargs,
            "enabled": row.enabled,
            "backend": backend,
        }
        raw.update({k: getattr(row, k) for k in ("queue", "priority", "unique_for")})
        raw = {k: v for k, v in raw.items() if v is not None}
        try:
            valid.append(parse_entry(row.name, raw))
        except InvalidJob as exc:
            errors[f"database:{row.name}"] = str(exc)
    return valid, errors


@dataclass(frozen=True)
class EnqueuedTick:
    """A tick this sweeper enqueued: which entry, which tick, which job."""

    name: str
    tick: dt.datetime
    job_id: int
    queue: str


def enqueue_due(
    *,
    using: str,
    now: dt.datetime | None = None,
    reported: dict[str, str] | None = None,
    grace: dt.timedelta = CHANGE_GRACE,
) -> list[EnqueuedTick]:
    """Enqueue the latest due tick of every enabled entry, once across all sweepers.

    The clock is the database's (``now`` pins it, for tests). Four statements a pass,
    however many entries: the database's schedules (``schedules.entries``); the clock;
    one sync of their rows (a new entry starts from its latest past tick without a job;
    a changed cron, time zone or ``enabled`` skips its latest tick if older than
    ``grace``, so the change takes effect at its next tick; a row whose last tick is
    after the clock, which went back, is rewound); one conditional statement that
    advances each due row and inserts its job.

    Invalid entries are skipped and logged at error level; ``reported`` (the caller's,
    kept across passes) maps each already logged one to its message, so a sweeper logs
    a bad entry once, and again only if its problem changes. Returns what this call
    enqueued."""
    valid = _valid_entries(using, reported)
    if not valid:
        return []
    clock = db.clock(using, now)
    ticked = sorted(
        ((entry, tick) for entry in valid if (tick := entry.latest_tick(clock)) is not None),
        key=lambda pair: pair[0].name,
    )
    if not ticked:
        return []
    db.rows(
        using,
        sql.SCHEDULE_SYNC,
        {
            "names": [e.name for e, _ in ticked],
            "tasks": [e.task for e, _ in ticked],
            "crons": [e.cron for e, _ in ticked],
            "timezones": [e.timezone for e, _ in ticked],
            "enabled": [e.enabled for e, _ in ticked],
            "ticks": [tick for _, tick in ticked],
            "grace": grace.total_seconds(),
            "now": now,
        },
    )
    due = [(e, tick) for e, tick in ticked if e.enabled]
    if not due:
        return []
    columns = _tick_columns(due)
    enqueued, kept = _enqueue_ticks(using, columns, now)
    _log_ticks(columns, enqueued, kept)
    return enqueued


def _valid_entries(using: str, reported: dict[str, str] | None) -> list[PeriodicEntry]:
    """The entries this database's sweepers tick: the settings' entries of the backends
    stored here (a sweeper of another database would put their jobs where no worker of
    that backend looks) and the schedules kept here (``django_pgqueue.schedules``).
    Invalid ones are logged, each once while its problem stays the same (``reported``)."""
    valid, errors = entries()
    valid = [entry for entry in valid if backend_database(entry.backend) == using]
    stored, stored_errors = database_entries(using)
    valid.extend(stored)
    errors = {**errors, **stored_errors}
    for name, message in errors.items():
        if reported is not None and reported.get(name) == message:
            continue
        logger.error(
            "periodic entry %r skipped: %s",
            name,
            message,
            extra={"action": "periodic_invalid"},
        )
    if reported is not None:
        reported.clear()
        reported.update(errors)
    return valid


def _tick_columns(due: list[tuple[PeriodicEntry, dt.datetime]]) -> dict[str, list[Any]]:
    """SCHEDULE_ENQUEUE_TICKS's arrays: one job per due tick, prepared as any job is
    (``defaults.job_payload``). An entry whose task's key callable refuses its arguments
    is left out and logged: its ticks wait (its row is not advanced), the others run."""
    columns: dict[str, list[Any]] = {
        key: []
        for key in (
            "names crons timezones ticks keys backends queues tasks args kwargs "
            "priorities max_attempts concurrency_keys unique_fors tags"
        ).split()
    }
    for entry, tick in due:
        resolved = defaults.resolve(
            entry.task,
            backend=entry.backend,
            queue=entry.queue,
            priority=entry.priority,
            max_attempts=entry.max_attempts,
        )
        try:
            args, kwargs, key = defaults.job_payload(resolved, entry.args, entry.kwargs)
        except InvalidJob as exc:
            logger.error(
                "periodic %s: %s; skipped",
                entry.name,
                exc,
                extra={"action": "periodic", "schedule": entry.name},
            )
            continue
        unique_key = (
            f"periodic:{entry.name}:{tick.isoformat()}"
            if entry.unique_for is None
            else entry.unique_key
        )
        for name, value in (
            ("concurrency_keys", key),
            ("names", entry.name),
            ("crons", entry.cron),
            ("timezones", entry.timezone),
            ("ticks", tick),
            ("keys", unique_key),
            ("unique_fors", entry.unique_for),
            ("backends", resolved.backend),
            ("queues", resolved.queue),
            ("tasks", resolved.task),
            ("args", args),
            ("kwargs", kwargs),
            ("priorities", resolved.priority),
            ("max_attempts", resolved.max_attempts),
            ("tags", json.dumps(list(resolved.tags))),  # the task's own
        ):
            columns[name].append(value)
    return columns


def _enqueue_ticks(
    using: str, columns: dict[str, list[Any]], now: dt.datetime | None
) -> tuple[list[EnqueuedTick], list[tuple[str, int | None]]]:
    """Advance each due row and insert its job: what was enqueued, and the ticks skipped
    because a live job (or the open window of a ``unique_for`` job) holds their key."""
    tick_of = dict(zip(columns["names"], columns["ticks"], strict=True))
    key_of = dict(zip(columns["names"], columns["keys"], strict=True))
    enqueued: list[EnqueuedTick] = []
    kept: list[tuple[str, int | None]] = []  # (name, job of the open window) per tick skipped
    # With a unique_for entry a second statement may give its window back: one
    # transaction, so that no other enqueue sees that window meanwhile.
    unique = any(seconds is not None for seconds in columns["unique_fors"])
    with transaction.atomic(using=using) if unique else contextlib.nullcontext():
        rows = db.rows(
            using,
            sql.SCHEDULE_ENQUEUE_TICKS,
            {**columns, "channel": settings.NOTIFY_CHANNEL, "now": now},
        )
        given_back: dict[str, list[Any]] = {"queues": [], "keys": [], "job_ids": []}
        for name, new_id, job_id, queue, window_job in rows:
            if job_id is not None:
                enqueued.append(EnqueuedTick(name, tick_of[name], job_id, queue))
                continue
            if window_job == new_id:  # its window was opened, but a live job holds the key
                given_back["queues"].append(queue)
                given_back["keys"].append(key_of[name])
                given_back["job_ids"].append(new_id)
                window_job = None
            kept.append((name, window_job))
        if given_back["job_ids"]:
            db.rows(using, sql.SCHEDULE_GIVE_BACK_KEYS, given_back)
    return enqueued, kept


def _log_ticks(
    columns: dict[str, list[Any]],
    enqueued: list[EnqueuedTick],
    kept: list[tuple[str, int | None]],
) -> None:
    tick_of = dict(zip(columns["names"], columns["ticks"], strict=True))
    key_of = dict(zip(columns["names"], columns["keys"], strict=True))
    for made in enqueued:
        logger.info(
            "periodic %s: enqueued tick %s as job %s",
            made.name,
            made.tick.isoformat(),
            made.job_id,
            extra={"action": "periodic", "job_id": made.job_id, "schedule": made.name},
        )
    for name, window_job in kept:
        logger.info(
            "periodic %s: tick %s not enqueued: %s holds its key %s",
            name,
            tick_of[name].isoformat(),
            f"the window of job {window_job}" if window_job else "a live job",
            key_of[name],
            extra={"action": "periodic", "job_id": window_job, "schedule": name},
        )
