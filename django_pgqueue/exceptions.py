"""The exceptions django-pgqueue raises, under one base class, and how any exception
is told in one log line."""

from __future__ import annotations

import datetime as dt
import math

from django.db import ProgrammingError


class PgQueueError(Exception):
    """Base class of every django-pgqueue error."""


class InvalidJob(PgQueueError, ValueError):  # noqa: N818 - mirrors django.tasks.InvalidTask
    """A job was rejected before anything was written; the message names the bad value."""


class InvalidResult(InvalidJob):
    """A task's return value cannot be its job's result: not JSON (a set, NaN, an
    object), nested more than 500 levels, over ``PGQUEUE_MAX_RESULT_BYTES``, or refused
    by PostgreSQL's jsonb. The message says what and where in the value. The attempt
    fails and the job is dead at once, not retried: the task would return the same."""


class InvalidStep(InvalidJob):
    """A durable step, cursor or sleep that cannot be recorded (``current_job().run_step``
    and friends): a bad name, a name used twice in one run, a value JSON cannot hold or
    one too large. The message names the step; nothing was recorded."""


class LeaseLost(PgQueueError):  # noqa: N818 - it names the event, like Django's DoesNotExist
    """The worker no longer owns the job: its lease expired and the job moved on.

    Raised inside a transactional task's transaction so its effects roll back."""


class LeaseExpired(PgQueueError):  # noqa: N818 - recorded as an error entry by the sweeper
    """Recorded in a job's ``errors`` when the sweeper took it back from a worker whose
    lease ran out (the worker crashed, hung, or lost the database)."""


class TaskNotFound(PgQueueError):  # noqa: N818
    """A job's task path does not import to a ``django.tasks.Task``; the job is dead."""


class TransactionLeak(PgQueueError):  # noqa: N818 - names the event
    """A task returned with a transaction still open on a connection it used (to the
    jobs database or any other; Django's or one the driver reports: a raw ``BEGIN``,
    autocommit turned off), or with session state left on it (``SET ROLE``, a session
    ``SET`` of a setting that changes what SQL means, an advisory lock, an open cursor,
    ``PREPARE``, ``LISTEN``, a temporary table). The worker discarded the connection
    (resetting the server session first behind a pooler), which rolls the transaction
    back and drops the state, and the attempt failed; the message names what was left
    and on which database."""


class UnsupportedServerError(PgQueueError):
    """The database server is older than django-pgqueue supports (PostgreSQL 14); the
    message names both versions. Raised before anything is written."""


class NotMigrated(PgQueueError, ProgrammingError):  # noqa: N818 - names the state
    """The jobs database lacks django-pgqueue's tables (or a migration of them): the
    message names the database and says to run ``manage.py migrate``. A Django
    ``ProgrammingError`` too, so code that catches database errors still does; the
    worker and the sweeper treat it as fatal, not as a fault to retry."""


class JobCancelled(PgQueueError):  # noqa: N818 - names the event, like LeaseExpired
    """Recorded in the ``errors`` of a job that was cancelled (``Job.objects.cancel``).

    A transactional task whose cancellation is seen before it commits raises it inside
    its transaction, so its effects roll back; a cooperative task may raise it too."""


class JobTimeout(PgQueueError):  # noqa: N818 - names the event, like LeaseExpired
    """A task ran past its timeout (``@task(timeout=...)``,
    ``PGQUEUE_JOB_TIMEOUT_SECONDS``): the attempt fails (and is retried with backoff).
    A coroutine task is cancelled at its timeout. A task on a thread slot cannot be
    stopped: its lease is no longer extended, so the sweeper takes the job back once it
    expires, and if the task returns after its timeout (lease or not), its attempt
    fails with this error, its value discarded, rather than being done."""


class SoftTimeLimitExceeded(PgQueueError):  # noqa: N818 - Celery's name, the issue's contract
    """Raised inside a task that ran past its soft time limit (``@task(soft_time_limit=
    ...)``, ``Job.objects.enqueue(..., soft_time_limit=...)``, ``PGQUEUE_SOFT_TIME_LIMIT``):
    in a sync task's thread as an asynchronous exception (it lands at the next Python
    bytecode, not inside a C call such as ``time.sleep``), in a coroutine task as its
    cancellation. The task may catch it to clean up; if it escapes, the attempt fails
    with it and is retried like any failure."""

    def __init__(self, *args: object) -> None:
        # Raised as a class by the asynchronous exception: a message of its own.
        super().__init__(*(args or ("the task ran past its soft time limit",)))


class TimeLimitExceeded(PgQueueError):  # noqa: N818 - Celery's name, beside the soft one
    """Recorded for a job still running at its hard time limit (``@task(time_limit=...)``,
    ``Job.objects.enqueue(..., time_limit=...)``, ``PGQUEUE_TIME_LIMIT``): a task stuck
    in a C call, or one that swallowed ``SoftTimeLimitExceeded``. The attempt fails
    with it (retried like any failure); the worker process holding it is replaced."""


class DeadlineExceeded(PgQueueError):  # noqa: N818 - names the event
    """A probe's statements did not finish within its time limit (``deadline.within``):
    the database is overloaded, unreachable in time, or a table they read is locked
    (``LOCK TABLE pgqueue_job``, a long ``ALTER TABLE``). The message names the database
    and the limit; the statement that was waiting has been cancelled."""


class Snooze(PgQueueError):  # noqa: N818 - a request, like StopIteration
    """Raised by a task: "not now, again in ``seconds``" (at most
    ``MAX_DELAY_SECONDS``; more raises ``ValueError``). The job goes back to
    ``scheduled`` at the database's now + ``seconds``, the attempt it was claimed with is
    given back and ``Job.snoozes`` counts it; no error is recorded. A transactional
    task's effects roll back. More than ``PGQUEUE_MAX_SNOOZES`` snoozes of one job fail
    it with :class:`SnoozeLimitExceeded`."""

    def __init__(self, seconds: float | dt.timedelta) -> None:
        self.seconds = delay_seconds(seconds, "Snooze")
        super().__init__(f"snooze for {self.seconds:g}s")


class Retry(PgQueueError):  # noqa: N818 - a request, like Snooze
    """Raised by a task: this attempt failed, try again once ``seconds`` have passed
    (instead of the backoff; at most ``MAX_DELAY_SECONDS``). Recorded as an error entry
    and counted against ``max_attempts`` like any failure; ``reason`` is the entry's
    message."""

    def __init__(self, seconds: float | dt.timedelta, reason: str | None = None) -> None:
        self.seconds = delay_seconds(seconds, "Retry")
        self.reason = reason
        text = f"retry in {self.seconds:g}s"
        super().__init__(f"{text}: {reason}" if reason else text)


class SnoozeLimitExceeded(PgQueueError):  # noqa: N818 - names the event
    """Recorded when a job snoozed more than ``PGQUEUE_MAX_SNOOZES`` times: the attempt
    fails, and is not retried (a retry would only snooze again)."""


class NotRecorded(PgQueueError):  # noqa: N818 - names the event
    """``testing.run_jobs`` ran a job but could not write its outcome (a database error
    in the write): the job was given back to ``pending`` (its attempt not charged)
    rather than left ``running``. The error that stopped the write is its cause."""


class TooManyJobs(PgQueueError):  # noqa: N818 - names the event
    """``testing.run_jobs`` without a ``limit`` ran its safety cap of jobs
    (``testing.MAX_JOBS``) and more were still due: most likely a task that enqueues
    itself (or a cycle of tasks) for ever. Pass ``limit=`` to run a bounded number."""


#: The longest delay a ``Snooze``, a ``Retry`` or a task's ``backoff`` may ask for: ten
#: years (365-day ones). A longer one is refused when it is made, like a negative one:
#: past it, a run time soon leaves what a PostgreSQL timestamp holds.
MAX_DELAY_SECONDS = 10 * 365 * 24 * 3600.0


def delay_seconds(value: object, what: str) -> float:
    """A delay given as seconds or a ``timedelta``, checked: finite, not negative, and
    at most ``MAX_DELAY_SECONDS``."""
    if isinstance(value, dt.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what}(seconds) takes a number of seconds or a timedelta, not {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what}(seconds) must be finite and >= 0, not {value!r}")
    if value > MAX_DELAY_SECONDS:
        raise ValueError(
            f"{what}(seconds) must be at most {MAX_DELAY_SECONDS:.0f} (ten years), not {value!r}"
        )
    return float(value)


def first_line(exc: BaseException) -> str:
    """An error's first line: enough for a log line without traceback spam."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def exception_line(exc: BaseException) -> str:
    """``"ValueError: boom"``: the exception's class and the first line of its message."""
    text = str(exc).strip()
    name = type(exc).__qualname__
    return f"{name}: {text.splitlines()[0]}" if text else name
