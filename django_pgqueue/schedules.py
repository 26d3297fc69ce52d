"""Periodic schedules kept in the database, changed at run time without a deploy::

    from django_pgqueue import schedules

    schedules.create("report-42", "reports.tasks.build", "0 6 * * *",
                     timezone="Europe/Paris", kwargs={"customer_id": 42})
    schedules.pause("report-42")      # during an incident
    schedules.resume("report-42")
    schedules.update("report-42", cron="30 6 * * 1-5")
    schedules.run_now("report-42")    # one job now, the schedule unchanged
    schedules.delete("report-42")

A schedule is a row of ``pgqueue_schedule_definition`` holding what a
``PGQUEUE_PERIODIC`` entry says. Each sweep pass reads the rows of its database and
ticks them with the settings' entries, through the same statements
(``periodic.enqueue_due``), so every guarantee of a settings entry holds: one job per
tick however many sweepers run, daylight saving time, clock steps, a change taking
effect at the next tick (a pause skips ticks; a resume starts at the next one), and
``unique_for``. Every value is checked as a settings entry's is; a bad one raises
:class:`ScheduleError` (an ``InvalidJob``) naming the field, and nothing is saved. A
name that ``PGQUEUE_PERIODIC`` uses is refused: the settings' entries are read-only here.
Schedules live in the default backend's jobs database (``using=`` names another).
"""

from __future__ import annotations

import datetime as dt
import zoneinfo
from collections.abc import Mapping, Sequence
from typing import Any

from django.apps import apps
from django.db import IntegrityError, transaction
from django.db.models import DateTimeField, Func

from . import enqueue, periodic, validation
from .conf import settings
from .databases import default_database
from .exceptions import InvalidJob

#: What ``update()`` may change (the name is the schedule's key).
FIELDS = (
    "task",
    "cron",
    "timezone",
    "args",
    "kwargs",
    "queue",
    "priority",
    "enabled",
    "unique_for",
)


class ScheduleError(InvalidJob):
    """Bad values for a schedule: ``errors`` maps each bad field to what is wrong."""

    def __init__(self, errors: Mapping[str, str]) -> None:
        self.errors = dict(errors)
        super().__init__("; ".join(f"{field}: {message}" for field, message in errors.items()))


class ClockTimestamp(Func):
    """``clock_timestamp()`` (as ``models.ClockTimestamp``, which this module cannot
    import at load time: the package loads it before Django's apps are ready)."""

    template = "clock_timestamp()"
    output_field = DateTimeField()


def _model() -> Any:
    return apps.get_model("django_pgqueue", "ScheduleDefinition")


def _check_one(field: str, value: Any) -> Any:
    """The checked value of one field (``InvalidJob`` saying what is wrong)."""
    if field == "task":
        return periodic.import_task(value)
    if field == "cron":
        periodic.storable(value, "cron", periodic.MAX_CRON_LENGTH)
        periodic.parse_cron(value)
        return value
    if field == "timezone":
        if not isinstance(value, str):
            raise InvalidJob(f"a zone name such as 'Europe/Paris', not {value!r}")
        periodic.storable(value, "timezone", periodic.MAX_TIMEZONE_LENGTH)
        try:
            zoneinfo.ZoneInfo(value)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise InvalidJob(f"{value!r} is not a known time zone") from None
        return value
    if field == "args":
        if isinstance(value, str | bytes) or not isinstance(value, Sequence):
            raise InvalidJob(f"args must be a list, not {type(value).__name__}")
        validation.payload(list(value), {}, max_bytes=settings.MAX_PAYLOAD_BYTES)
        return list(value)
    if field == "kwargs":
        value = {} if value is None else value
        if not isinstance(value, Mapping):
            raise InvalidJob(f"kwargs must be a dict, not {type(value).__name__}")
        validation.payload([], dict(value), max_bytes=settings.MAX_PAYLOAD_BYTES)
        return dict(value)
    if field == "queue":
        return None if value is None else validation.queue_name(value)
    if field == "priority":
        return None if value is None else validation.priority(value)
    if field == "enabled":
        if not isinstance(value, bool):
            raise InvalidJob(f"enabled must be True or False, not {value!r}")
        return value
    if field == "unique_for":
        return None if value is None else enqueue.period(value, "unique_for")
    raise InvalidJob(f"unknown field {field!r}; allowed: {', '.join(FIELDS)}")


def check(name: Any, fields: Mapping[str, Any]) -> dict[str, Any]:
    """Every field checked (``ScheduleError`` naming each bad one, the name included);
    the values to store."""
    errors: dict[str, str] = {}
    checked: dict[str, Any] = {}
    try:
        if not isinstance(name, str) or not name:
            raise InvalidJob(f"a non-empty str of at most {periodic.MAX_NAME_LENGTH} characters")
        periodic.storable(name, "the name", periodic.MAX_NAME_LENGTH)
        if name in (settings.PERIODIC or {}):
            raise InvalidJob(
                f"{name!r} is an entry of PGQUEUE_PERIODIC: the settings' entries are "
                "read-only; choose another name"
            )
    except InvalidJob as exc:
        errors["name"] = str(exc)
    for field, value in fields.items():
        try:
            checked[field] = _check_one(field, value)
        except (InvalidJob, RecursionError, ValueError) as exc:
            errors[field] = str(exc)
    if errors:
        raise ScheduleError(errors)
    return checked


def create(
    name: str,
    task: Any,
    cron: str,
    *,
    timezone: str = "UTC",
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    queue: str | None = None,
    priority: int | None = None,
    enabled: bool = True,
    unique_for: float | dt.timedelta | None = None,
    using: str | None = None,
) -> Any:
    """Store a new schedule; its first tick is the next one after the sweeper first
    sees it (as a new settings entry). Returns its ``ScheduleDefinition``."""
    fields = {
        "task": task,
        "cron": cron,
        "timezone": timezone,
        "args": args,
        "kwargs": kwargs,
        "queue": queue,
        "priority": priority,
        "enabled": enabled,
        "unique_for": unique_for,
    }
    values = check(name, fields)
    alias = using or default_database()
    try:
        with transaction.atomic(using=alias):
            return _model().objects.using(alias).create(name=name, **values)
    except IntegrityError:
        raise ScheduleError({"name": f"a database schedule named {name!r} exists"}) from None


def get(name: str, *, using: str | None = None) -> Any:
    """The schedule ``name`` (``ScheduleError`` when there is none)."""
    found = _model().objects.using(using or default_database()).filter(name=name).first()
    if found is None:
        raise ScheduleError({"name": f"no database schedule is named {name!r}"})
    return found


def update(name: str, /, *, using: str | None = None, **fields: Any) -> Any:
    """Change some fields of schedule ``name``; the change takes effect at its next
    tick. Returns the ``ScheduleDefinition``."""
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        raise ScheduleError({f: f"unknown field; allowed: {', '.join(FIELDS)}" for f in unknown})
    alias = using or default_database()
    with transaction.atomic(using=alias):
        row = _model().objects.using(alias).select_for_update().filter(name=name).first()
        if row is None:
            raise ScheduleError({"name": f"no database schedule is named {name!r}"})
        values = check(name, fields)
        for field, value in values.items():
            setattr(row, field, value)
        row.save(using=alias, update_fields=[*values])
        _model().objects.using(alias).filter(name=name).update(updated_at=ClockTimestamp())
    return row


def pause(name: str, *, using: str | None = None) -> Any:
    """Stop enqueueing ``name``'s ticks until :func:`resume`."""
    return update(name, enabled=False, using=using)


def resume(name: str, *, using: str | None = None) -> Any:
    """Enqueue ``name``'s ticks again, from its next one (missed ticks are skipped)."""
    return update(name, enabled=True, using=using)


def delete(name: str, *, using: str | None = None) -> None:
    """Remove schedule ``name`` and its tick state; its jobs are left as they are."""
    alias = using or default_database()
    with transaction.atomic(using=alias):
        deleted, _ = _model().objects.using(alias).filter(name=name).delete()
        if not deleted:
            raise ScheduleError({"name": f"no database schedule is named {name!r}"})
        apps.get_model("django_pgqueue", "Schedule").objects.using(alias).filter(
            name=name
        ).delete()


def run_now(name: str, *, using: str | None = None) -> Any:
    """Enqueue one job of schedule ``name`` now (its task, arguments, queue and
    priority), outside its ticks: the schedule is unchanged. Returns the ``Job``."""
    alias = using or default_database()
    row = get(name, using=alias)
    job_model = apps.get_model("django_pgqueue", "Job")
    return job_model.objects.db_manager(alias).enqueue(
        row.task,
        row.args,
        row.kwargs,
        queue=row.queue,
        priority=row.priority,
        backend=periodic.backend_of(alias),
    )
