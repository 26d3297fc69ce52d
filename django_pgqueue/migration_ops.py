"""Migration operations that never stall a working fleet behind one open transaction.

An ``ALTER TABLE pgqueue_job`` (a new column, a constraint swapped) needs an ACCESS
EXCLUSIVE lock, held for an instant once granted. But while it *waits* for that lock,
behind any transaction that so much as read the table (a view under
``ATOMIC_REQUESTS`` waiting on an API, a report, an idle-in-transaction session), every
later claim, completion and enqueue queues behind the ALTER: the whole fleet stops for
as long as that transaction stays open. :class:`BrieflyLocked` runs its operations with
a short ``lock_timeout`` instead: an attempt that cannot get its lock in time gives up
(the queue behind it flows again), waits, and tries again, and after its last attempt
the migration fails with an error that says what to do, rather than stalling.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from django.db import OperationalError, transaction
from django.db.migrations.operations.base import Operation

from . import db
from .sql import migration as sql

logger = logging.getLogger(__name__)

#: SQLSTATE lock_not_available: a statement gave up waiting after ``lock_timeout``.
LOCK_NOT_AVAILABLE = "55P03"
#: How long one attempt may wait for its lock (seconds): the longest the fleet waits.
LOCK_TIMEOUT_SECONDS = 2.0
#: How many attempts before the migration fails.
ATTEMPTS = 30
#: The pause after the n-th failed attempt is n times this, at most ``MAX_PAUSE_SECONDS``.
PAUSE_SECONDS = 1.0
MAX_PAUSE_SECONDS = 10.0


def lock_not_available(exc: BaseException) -> bool:
    """Whether ``exc`` (or its cause) is PostgreSQL's "could not obtain lock"."""
    for error in (exc, exc.__cause__):
        if getattr(error, "sqlstate", None) == LOCK_NOT_AVAILABLE:
            return True
    return False


class BrieflyLocked(Operation):
    """Run ``operations`` (each an operation that locks a table in use: ``AddField``,
    ``RunSQL("ALTER TABLE ...")``) one by one, each in attempts of at most
    ``lock_timeout`` seconds of waiting for its locks: an attempt that times out is
    rolled back (to a savepoint inside an atomic migration) and tried again after a
    pause, up to ``attempts`` times; then the migration fails, naming the sessions that
    held the table. The project state is the operations' own; ``sqlmigrate`` shows their
    SQL as it is."""

    reduces_to_sql = True
    reversible = True

    def __init__(
        self,
        *operations: Operation,
        lock_timeout: float = LOCK_TIMEOUT_SECONDS,
        attempts: int = ATTEMPTS,
        pause: float = PAUSE_SECONDS,
        wrapped: Sequence[Operation] = (),
    ) -> None:
        # ``wrapped``: the operations by keyword, as deconstruct() gives them (Django's
        # migration writer, for squashmigrations, writes keywords for varargs it
        # cannot name).
        self.operations = [*operations, *wrapped]
        self.lock_timeout = lock_timeout
        self.attempts = attempts
        self.pause = pause

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        kwargs = {
            "wrapped": self.operations,
            "lock_timeout": self.lock_timeout,
            "attempts": self.attempts,
            "pause": self.pause,
        }
        return (self.__class__.__qualname__, [], kwargs)

    def describe(self) -> str:
        inner = "; ".join(op.describe() for op in self.operations)
        return f"{inner} (lock_timeout {self.lock_timeout:g}s, retried)"

    def state_forwards(self, app_label: str, state: Any) -> None:
        for operation in self.operations:
            operation.state_forwards(app_label, state)

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        for operation in self.operations:
            after = from_state.clone()
            operation.state_forwards(app_label, after)
            forwards = functools.partial(
                operation.database_forwards, app_label, schema_editor, from_state, after
            )
            self._attempts(schema_editor, operation, forwards)
            from_state = after

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        # As SeparateDatabaseAndState: each operation's state before it, undone last first.
        states = [to_state]
        for operation in self.operations[:-1]:
            state = states[-1].clone()
            operation.state_forwards(app_label, state)
            states.append(state)
        for operation, before in reversed(list(zip(self.operations, states, strict=True))):
            after = before.clone()
            operation.state_forwards(app_label, after)
            backwards = functools.partial(
                operation.database_backwards, app_label, schema_editor, after, before
            )
            self._attempts(schema_editor, operation, backwards)

    def _attempts(self, schema_editor: Any, operation: Operation, run: Callable[[], None]) -> None:
        """Run ``run`` under the lock timeout until it gets its locks, or give up."""
        if schema_editor.collect_sql:  # sqlmigrate: the SQL only
            run()
            return
        connection = schema_editor.connection
        for attempt in range(1, self.attempts + 1):
            deferred = len(schema_editor.deferred_sql)
            try:
                with transaction.atomic(using=connection.alias):
                    limit = f"{max(1, round(self.lock_timeout * 1000))}ms"
                    previous = db.row(
                        connection.alias, sql.MIGRATION_LOCK_TIMEOUT, {"lock_timeout": limit}
                    )[0]
                    run()
                    db.row(
                        connection.alias, sql.MIGRATION_LOCK_TIMEOUT, {"lock_timeout": previous}
                    )
                return
            except OperationalError as exc:
                if not lock_not_available(exc):
                    raise
                del schema_editor.deferred_sql[deferred:]
                if attempt == self.attempts:
                    raise OperationalError(self._gave_up(connection, operation)) from exc
                pause = min(MAX_PAUSE_SECONDS, self.pause * attempt)
                logger.warning(
                    "%s: lock not granted within %gs (attempt %d/%d): another transaction "
                    "holds the table; trying again in %gs",
                    operation.describe(),
                    self.lock_timeout,
                    attempt,
                    self.attempts,
                    pause,
                )
                time.sleep(pause)

    def _gave_up(self, connection: Any, operation: Operation) -> str:
        """The error of the last attempt: what waited, and who held the lock."""
        holders = ""
        try:
            holders = db.row(connection.alias, sql.MIGRATION_LOCK_HOLDERS, {})[0] or ""
        except Exception:  # noqa: BLE001, S110 - the message is best effort
            pass
        return (
            f"{operation.describe()}: no lock within {self.lock_timeout:g}s in "
            f"{self.attempts} attempts; a transaction kept the table "
            f"(pgqueue_job{': ' + holders if holders else ''}). Nothing of this operation "
            "was applied: end that transaction (or wait for it), then migrate again."
        )
