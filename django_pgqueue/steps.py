"""Durable steps: a long task that resumes where it stopped, each step's effects once.

* ``current_job().run_step(name, fn, *args, **kwargs)``: the first run of a job that
  reaches the step calls ``fn`` and records its return value (JSON, at most
  ``PGQUEUE_MAX_RESULT_BYTES``) under ``name``, fenced (``sql.STEP_RECORD``: only the
  job's owner at its current attempt writes); every later run of the job (a retry, a
  rescue, a snooze, a requeued dead letter) gets the recorded value back without
  calling ``fn``. A plain step runs at least once (a crash after ``fn`` and before the
  record runs it again). ``transactional=True`` runs ``fn`` and the record in one
  transaction on the jobs database, so its database writes commit exactly once.
* ``current_job().cursor(name)``: a value a long loop saves as it goes (``save``) and a
  later run starts from (``value``); inside a transaction (a transactional step, or
  the task's own ``atomic()``) a save commits with the writes beside it.
* ``current_job().sleep(seconds)``: a step that puts the job back to ``scheduled``
  until then, spending no attempt (a ``Snooze``); a later run passes it.

A job's recorded steps are read once per run, when the first is asked for
(``sql.STEP_LIST``); each step then costs its one fenced INSERT. Every write locks the
job's row ``FOR SHARE`` until its transaction ends, so a rescue waits for a
transactional step to commit (and the worker's heartbeat too: keep those short).
"""

from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import sync_to_async
from django.db import transaction

from . import db, validation
from .exceptions import InvalidJob, InvalidStep, LeaseLost, Snooze
from .sql import steps as sql

#: The longest name a step or a cursor may have (the column's length).
MAX_NAME_LENGTH = 200

STEP, CURSOR, SLEEP = "step", "cursor", "sleep"


@dataclass(slots=True)
class StepState:
    """What one run of a job knows of its steps: those recorded (read once, lazily),
    the names this run used, how many sleeps it reached."""

    stored: dict[tuple[str, str], Any] | None = None
    read_at: dt.datetime | None = None
    used: set[str] = field(default_factory=set)
    sleeps: int = 0
    cursors: dict[str, Cursor] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Owner:
    """Who writes: the job, the worker and the attempt (with its claim time) of the
    fence, on the jobs database ``alias``."""

    alias: str
    job_id: int
    worker_id: str
    attempt: int
    claimed_at: dt.datetime | None

    def params(self) -> dict[str, Any]:
        return {
            "id": self.job_id,
            "worker_id": self.worker_id,
            "attempt": self.attempt,
            "claimed_at": self.claimed_at,
        }


def check_name(name: object, what: str = "step") -> str:
    """``name`` if it is a non-empty str of at most ``MAX_NAME_LENGTH`` characters."""
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME_LENGTH:
        raise InvalidStep(
            f"{what} name must be a non-empty str of at most {MAX_NAME_LENGTH} "
            f"characters, not {validation_repr(name)}"
        )
    return name


def validation_repr(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def value_json(kind: str, name: str, value: Any) -> str:
    """``value`` as the JSON text a step or cursor stores, checked like a result."""
    try:
        return validation.returned(value)[1]
    except InvalidJob as exc:
        problem = str(exc).replace("the task's return value", "its value")
        raise InvalidStep(f"{kind} {name!r} not recorded: {problem}") from None


def stored(state: StepState, owner: Owner) -> dict[tuple[str, str], Any]:
    """The job's recorded steps, read on the first call of the run."""
    if state.stored is None:
        found: dict[tuple[str, str], Any] = {}
        read_at = None
        for kind, name, value, now in db.rows(
            owner.alias, sql.STEP_LIST, {"id": owner.job_id}, prepare=True
        ):
            found[(kind, name)] = json.loads(value) if isinstance(value, str) else value
            read_at = now
        state.stored, state.read_at = found, read_at
    return state.stored


def record(owner: Owner, kind: str, name: str, text: str, *, replace: bool = False) -> None:
    """Write a step's (or a cursor's) JSON ``text``, fenced; ``LeaseLost`` if nothing
    was written (the worker lost the job, or another run recorded the step)."""
    params = owner.params()
    params.update(kind=kind, name=name, value=text, size=len(text), replace=replace)
    if not db.rows(owner.alias, sql.STEP_RECORD, params, prepare=True):
        raise LeaseLost(
            f"job {owner.job_id}: {kind} {name!r} not recorded: the lease was lost "
            "(another run owns the job)"
        )


def begin(state: StepState, name: object) -> str:
    """Check a step's name and that this run did not use it already."""
    name = check_name(name)
    if name in state.used:
        raise InvalidStep(
            f"step {name!r} was already run in this run of the job: each step needs "
            "its own name (add an index for steps in a loop)"
        )
    state.used.add(name)
    return name


def run_step(
    state: StepState,
    owner: Owner,
    name: str,
    fn: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    transactional: bool,
) -> Any:
    """The body of ``CurrentJob.run_step`` (name checked by :func:`begin`)."""
    recorded = stored(state, owner)
    key = (STEP, name)
    if key in recorded:
        return recorded[key]
    if transactional:
        with transaction.atomic(using=owner.alias):
            text = value_json(STEP, name, fn(*args, **kwargs))
            record(owner, STEP, name, text)
    else:
        text = value_json(STEP, name, fn(*args, **kwargs))
        record(owner, STEP, name, text)
    value = recorded[key] = json.loads(text)
    return value


def finish_step(state: StepState, owner: Owner, name: str, value: Any) -> Any:
    """Record the value a (coroutine) step's function returned; the value as stored."""
    text = value_json(STEP, name, value)
    record(owner, STEP, name, text)
    recorded = stored(state, owner)
    stored_value = recorded[(STEP, name)] = json.loads(text)
    return stored_value


def recorded_step(state: StepState, owner: Owner, name: str) -> tuple[bool, Any]:
    """Whether step ``name`` was recorded by an earlier run, and its value."""
    recorded = stored(state, owner)
    key = (STEP, name)
    return (key in recorded, recorded.get(key))


class Cursor:
    """A position a long loop saves as it goes: ``value`` is the last one saved by any
    run of the job (None at first), ``save(value)`` stores a new one, fenced. Inside a
    transaction on the jobs database (a transactional step, or ``atomic()``) the save
    commits with the writes beside it: save last, as it locks the job's row until
    the commit."""

    __slots__ = ("_owner", "_value", "name")

    def __init__(self, owner: Owner, name: str, value: Any) -> None:
        self._owner = owner
        self.name = name
        self._value = value

    @property
    def value(self) -> Any:
        return self._value

    def save(self, value: Any) -> None:
        """Store ``value`` (JSON, at most ``PGQUEUE_MAX_RESULT_BYTES``), fenced;
        ``InvalidStep`` for a bad value, ``LeaseLost`` if the job is no longer ours."""
        text = value_json(CURSOR, self.name, value)
        record(self._owner, CURSOR, self.name, text, replace=True)
        self._value = json.loads(text)

    async def asave(self, value: Any) -> None:
        """``save`` from a coroutine task."""
        await sync_to_async(self.save, thread_sensitive=True)(value)

    def __repr__(self) -> str:
        return f"<Cursor {self.name!r} = {validation_repr(self._value)}>"


def cursor(state: StepState, owner: Owner, name: object) -> Cursor:
    """The cursor ``name`` of the job (one object per run and name)."""
    name = check_name(name, "cursor")
    made = state.cursors.get(name)
    if made is None:
        value = stored(state, owner).get((CURSOR, name))
        made = state.cursors[name] = Cursor(owner, name, value)
    return made


def sleep(
    state: StepState, owner: Owner, seconds: float | None, until: dt.datetime | None
) -> None:
    """A durable sleep: this run's n-th sleep is the step ``sleep n``. Recorded (its end
    by the database's clock) and the job snoozed until then; passed at once by a later
    run once that end is reached (snoozed again for what is left, if early)."""
    state.sleeps += 1
    name = f"sleep {state.sleeps}"
    recorded = stored(state, owner).get((SLEEP, name))
    if recorded is not None:
        end = dt.datetime.fromisoformat(recorded["until"])
        assert state.read_at is not None
        left = (end - state.read_at).total_seconds()
        if left > 0:  # by the time the steps were read: ask the clock now
            left = (end - db.clock(owner.alias)).total_seconds()
        if left <= 0:
            return
        raise Snooze(left)
    params = owner.params()
    params.update(name=name, seconds=seconds or 0.0, until=until)
    rows = db.rows(owner.alias, sql.STEP_SLEEP, params, prepare=True)
    if not rows:
        raise LeaseLost(f"job {owner.job_id}: {name!r} not recorded: the lease was lost")
    raise Snooze(rows[0][0])


def sleep_seconds(seconds: object) -> float:
    """A durable sleep's seconds, or a timedelta's, checked: finite and >= 0."""
    if isinstance(seconds, dt.timedelta):
        seconds = seconds.total_seconds()
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or seconds < 0
    ):
        raise InvalidStep(f"sleep(seconds) takes a finite number >= 0, not {seconds!r}")
    return float(seconds)


def sleep_until(when: object) -> dt.datetime:
    """A durable sleep's end, checked: an aware datetime."""
    if not isinstance(when, dt.datetime) or when.tzinfo is None:
        raise InvalidStep(f"sleep_until(when) takes an aware datetime, not {when!r}")
    return when


def clear(alias: str, job_ids: list[int]) -> int:
    """Forget every step of ``job_ids`` (a requeue "from the start"); how many rows."""
    return db.rowcount(alias, sql.STEP_CLEAR, {"ids": list(job_ids)})
