"""Helpers for the database connection of one worker or sweeper thread.

Every worker thread (claim, heartbeat, runners, completer) uses its own Django
connection to the jobs database. These helpers label it, recycle it between jobs, drop
it after an error, throw it away when a task left a transaction open on it, and pace
reconnect loops.
"""

from __future__ import annotations

import random
import time

from django.db import DatabaseError, connections

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
