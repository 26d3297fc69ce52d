"""Helpers for the database connection of one worker or sweeper thread.

Every worker thread (claim, heartbeat, runners, completer) uses its own Django
connection to the jobs database. These helpers label it, recycle it between jobs, drop
it after an error, throw it away when a task left a transaction or session state on
it, and pace reconnect loops.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import DatabaseError, connections, transaction
from psycopg import pq

from .. import db, sql
from ..conf import settings
from ..databases import is_pooled


def configure_session(
    alias: str, role: str, worker_id: str, statement_timeout: float | None = None
) -> None:
    """Label (and bound) this thread's connection once per physical connection.

    The label is ``pgqueue <role> <worker id>`` in ``pg_stat_activity.application_name``;
    ``statement_timeout`` is in seconds (None: keep the connection's own). The claim
    connection is also set up for claiming (``sql.SESSION_CONFIGURE_CLAIM``). Behind a
    transaction pooler neither the bound nor the claim set-up is a session setting
    here: :func:`bounded` sets them per transaction."""
    pooled = is_pooled(alias)
    if statement_timeout is not None and pooled:
        statement_timeout = None
    wrapper = connections[alias]
    raw = wrapper.connection
    if raw is not None and getattr(wrapper, "_pgqueue_session", None) is raw:
        return
    wrapper.ensure_connection()
    label_session(
        alias,
        f"pgqueue {role} {worker_id}",
        statement_timeout_ms=None if statement_timeout is None else int(statement_timeout * 1000),
    )
    if role == "claim" and not pooled:
        configure_claim_session(alias)
    wrapper._pgqueue_session = wrapper.connection  # type: ignore[attr-defined]


def label_session(
    alias: str, application_name: str, *, statement_timeout_ms: int | None = None
) -> None:
    """Label this thread's connection (``pg_stat_activity.application_name``, cut to 63
    bytes by PostgreSQL) and optionally bound its statements."""
    db.rows(
        alias,
        sql.SESSION_CONFIGURE,
        {
            "application_name": application_name[:63],
            "statement_timeout": None
            if statement_timeout_ms is None
            else f"{int(statement_timeout_ms)}ms",
        },
    )


def configure_claim_session(alias: str) -> None:
    """Set up a worker's claim connection: claims keep to the claim index whatever the
    statistics say, and commit without waiting for the disk (see
    ``sql.SESSION_CONFIGURE_CLAIM`` for why that loses nothing)."""
    db.rows(alias, sql.SESSION_CONFIGURE_CLAIM, {})
    # Claims on this very connection may be prepared (generic plans: see the
    # statement); a new connection starts without the mark, as without the set-up.
    connections[alias].connection._pgqueue_claims_prepared = True


def session_state(alias: str) -> dict[str, Any]:
    """What this thread's connection carries beyond its transaction: roles, the
    settings that change later statements, and session-level objects held (see
    ``sql.SESSION_GET_STATE``), by name."""
    with connections[alias].cursor() as cursor:
        cursor.execute(sql.SESSION_GET_STATE, {})
        names = [column.name for column in cursor.description or ()]
        return dict(zip(names, cursor.fetchone() or (), strict=True))


@contextmanager
def bounded(alias: str, role: str, worker_id: str, statement_timeout: float) -> Iterator[None]:
    """Run the block's statements with ``statement_timeout`` seconds as their bound.

    On a direct connection the bound is a session setting, set once per connection
    (no extra round trip per statement). Behind a transaction pooler a session setting
    would outlive our transaction on a server connection the pooler hands to someone
    else, so the block becomes one transaction with a ``SET LOCAL`` bound instead (and,
    for the claim role, the claim connection's set-up too, in the same statement)."""
    if not is_pooled(alias):
        configure_session(alias, role, worker_id, statement_timeout)
        yield
        return
    configure_session(alias, role, worker_id)
    bound = {"statement_timeout": f"{int(statement_timeout * 1000)}ms"}
    with transaction.atomic(using=alias):
        # The claim's set-up and the bound, for this transaction only (SET LOCAL).
        if role == "claim":
            db.rows(alias, sql.SESSION_CONFIGURE_CLAIM_LOCAL, bound)
        else:
            db.rows(alias, sql.SESSION_BOUND_TRANSACTION, bound)
        yield


def recycle_connections() -> None:
    """Between jobs: drop this thread's connections that broke or outlived CONN_MAX_AGE.

    Unlike ``close_old_connections()``, a connection is kept when CONN_MAX_AGE is 0:
    a worker is one long "request", and reconnecting per job would cost more than
    most jobs."""
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
        raw._pgqueue_baseline = session_state(alias)
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
        state = session_state(alias)
    except DatabaseError:
        discard_connection(alias)
        return found
    baseline = raw._pgqueue_baseline
    return [
        f"SET {name}" if isinstance(value, str) else str(name)
        for name, value in state.items()
        if value != baseline.get(name)
    ]
