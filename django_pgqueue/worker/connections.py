"""Helpers for the database connection of one worker or sweeper thread.

Every worker thread (claim, heartbeat, runners, completer) uses its own Django
connection to the jobs database. These helpers label it, recycle it between jobs, drop
it after an error, throw it away when a task left a transaction or session state on
it, and pace reconnect loops.
"""

from __future__ import annotations

import random
import time
from typing import Any

from django.db import DatabaseError, connections
from psycopg import pq

from ..conf import settings
from ..models import Job

#: Longest wait between reconnection attempts after a database error.
MAX_BACKOFF = 30.0


def backoff_delay(failures: int) -> float:
    """Exponential backoff with jitter for reconnect loops: 0.5 s, 1 s, 2 s ... 30 s."""
    return min(MAX_BACKOFF, 0.5 * 2 ** min(failures - 1, 10)) * random.uniform(0.8, 1.2)


def first_line(exc: BaseException) -> str:
    """A database error's first line: enough for a log line without traceback spam."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def configure_session(
    alias: str, role: str, worker_id: str, statement_timeout: float | None = None
) -> None:
    """Label (and bound) this thread's connection once per physical connection.

    The label is ``pgqueue <role> <worker id>`` in ``pg_stat_activity.application_name``;
    ``statement_timeout`` is in seconds (None: keep the connection's own). The claim
    connection is also set up for claiming (``sql.SESSION_CONFIGURE_CLAIM``)."""
    wrapper = connections[alias]
    raw = wrapper.connection
    if raw is not None and getattr(wrapper, "_pgqueue_session", None) is raw:
        return
    wrapper.ensure_connection()
    manager = Job.objects.db_manager(alias)
    manager.configure_session(
        f"pgqueue {role} {worker_id}",
        statement_timeout_ms=None if statement_timeout is None else int(statement_timeout * 1000),
    )
    if role == "claim":
        manager.configure_claim_session()
    wrapper._pgqueue_session = wrapper.connection  # type: ignore[attr-defined]


def recycle_connections() -> None:
    """Between jobs: drop this thread's connections that broke or outlived CONN_MAX_AGE.

    Unlike ``close_old_connections()``, a connection is kept when CONN_MAX_AGE is 0:
    a worker is one long "request", and reconnecting per job would cost more than
    most jobs (measured: about 125 jobs/s with a reconnect per job)."""
    for conn in connections.all(initialized_only=True):
        if conn.connection is None:
            continue
        if conn.errors_occurred:
            if conn.is_usable():
                conn.errors_occurred = False
            else:
                conn.close()
                continue
        if conn.settings_dict["CONN_MAX_AGE"] and conn.close_at is not None:
            if time.monotonic() >= conn.close_at:
                conn.close()


def close_connection(alias: str) -> None:
    """Drop this thread's connection so the next query reconnects."""
    try:
        connections[alias].close()
    except DatabaseError:
        pass


def discard_connection(alias: str) -> None:
    """Throw away this thread's connection even if a task left an ``atomic`` block open
    on it: the server rolls the transaction back when the socket closes, and the next
    query starts on a fresh connection with clean transaction state."""
    wrapper = connections[alias]
    try:
        if wrapper.connection is not None:
            wrapper.connection.close()
    except Exception:  # noqa: BLE001, S110 - it is being thrown away
        pass
    # Django refuses to forget a connection inside atomic(); reset its bookkeeping.
    wrapper.connection = None
    wrapper.in_atomic_block = False
    wrapper.atomic_blocks = []
    wrapper.savepoint_ids = []
    wrapper.needs_rollback = False
    wrapper.closed_in_transaction = False
    wrapper.run_on_commit = []


# Cursor classes that count their creations on their connection, by the class they wrap.
_COUNTING: dict[type, type] = {}


def _counting(base: type[Any]) -> type:
    """A subclass of the cursor class ``base`` that counts, on its psycopg connection,
    every cursor made: Django's cursors, ``connection.connection.execute()`` and named
    cursors all pass through the connection's cursor factories."""
    cls = _COUNTING.get(base)
    if cls is None:

        def __init__(self: Any, connection: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807
            base.__init__(self, connection, *args, **kwargs)
            connection._pgqueue_cursors = getattr(connection, "_pgqueue_cursors", 0) + 1

        cls = type(base.__name__, (base,), {"__init__": __init__, "__module__": base.__module__})
        _COUNTING[base] = cls
    return cls


def watch_session(alias: str) -> Any:
    """Before a task runs on this thread's (connected, labelled) connection: remember,
    once per physical connection, what a clean session looks like, and start counting
    cursors. Return the psycopg connection, for :func:`session_leftovers`."""
    raw = connections[alias].connection
    if getattr(raw, "_pgqueue_baseline", None) is None:
        raw.cursor_factory = _counting(raw.cursor_factory)
        raw.server_cursor_factory = _counting(raw.server_cursor_factory)
        raw._pgqueue_baseline = Job.objects.db_manager(alias).session_state()
    raw._pgqueue_cursors = 0
    return raw


def session_leftovers(alias: str, raw: Any) -> list[str]:
    """What the task that just ran left on this thread's connection, by name (empty:
    nothing). ``raw`` is what :func:`watch_session` returned before it ran.

    Free checks first, on the client: Django's transaction state and the driver's own
    (``transaction_status``, ``autocommit``), which see a raw ``BEGIN`` or
    ``connection.connection.autocommit = False`` that Django does not. Then, only if
    the task opened a cursor on the connection, one statement (``sql.SESSION_GET_STATE``)
    compared to the connection's baseline: roles, settings, advisory locks, cursors,
    prepared statements, LISTEN, temporary tables. A connection the task replaced (it
    closed Django's and queried again), or one whose check fails (a terminated backend,
    a ``statement_timeout`` too short for the check), cannot be compared: it is
    discarded here, without blaming the task, so the next job still starts clean."""
    wrapper = connections[alias]
    current = wrapper.connection
    found: list[str] = []
    if wrapper.in_atomic_block:
        found.append("an atomic block open")
    elif current is not None and not wrapper.autocommit:
        found.append("autocommit off (Django)")
    if current is None or current.closed or current.broken:
        return found  # closed or lost: nothing of its session survives
    status = current.info.transaction_status
    if status != pq.TransactionStatus.IDLE:
        found.append(f"a transaction open ({status.name})")
    if not current.autocommit:
        found.append("autocommit off (driver)")
    if found:
        return found
    if current is not raw:
        discard_connection(alias)  # no baseline to compare it with
        return found
    if not getattr(raw, "_pgqueue_cursors", 0) or not settings.CHECK_SESSION_STATE:
        return found
    try:
        state = Job.objects.db_manager(alias).session_state()
    except DatabaseError:
        discard_connection(alias)
        return found
    baseline = raw._pgqueue_baseline
    return [
        f"SET {name}" if isinstance(value, str) else str(name)
        for name, value in state.items()
        if value != baseline.get(name)
    ]
