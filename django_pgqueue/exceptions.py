"""The exceptions django-pgqueue raises, under one base class, and how any exception
is told in one log line."""

from __future__ import annotations

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


class DeadlineExceeded(PgQueueError):  # noqa: N818 - names the event
    """A probe's statements did not finish within its time limit (``deadline.within``):
    the database is overloaded, unreachable in time, or a table they read is locked
    (``LOCK TABLE pgqueue_job``, a long ``ALTER TABLE``). The message names the database
    and the limit; the statement that was waiting has been cancelled."""


def first_line(exc: BaseException) -> str:
    """An error's first line: enough for a log line without traceback spam."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def exception_line(exc: BaseException) -> str:
    """``"ValueError: boom"``: the exception's class and the first line of its message."""
    text = str(exc).strip()
    name = type(exc).__qualname__
    return f"{name}: {text.splitlines()[0]}" if text else name
