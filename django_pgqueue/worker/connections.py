"""Helpers for the database connection of one worker or sweeper thread.

Every worker thread (claim, heartbeat, runners, completer) uses its own Django
connection to the jobs database. These helpers label it, recycle it between jobs, drop
it after an error, and, on a runner thread, watch every connection a task uses (the
jobs database's and any other): what a task left on one is reset, or the connection is
thrown away (reset on the server first behind a transaction pooler).

``testing.run_jobs`` runs jobs on its caller's thread, with the caller's connections
(:func:`borrowed`). Where the caller has a transaction open (a ``TestCase``'s), the
connection cannot be thrown away: each job runs after a savepoint of its own
(:func:`hosted_job`), and "throw the connection away" means "roll back to that
savepoint" there (:func:`discard_connection`, :func:`drop_connection`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from django.db import DatabaseError, connections, transaction
from django.db.backends.signals import connection_created
from psycopg import pq
from psycopg import sql as pgsql

from .. import db, deadline
from ..conf import settings
from ..databases import is_pooled
from ..reconnect import close_connection
from ..sql import session as sql


def configure_session(
    alias: str, role: str, worker_id: str, statement_timeout: float | None = None
) -> Any:
    """Label (and bound) this thread's connection once per physical connection; return
    its Django connection (``connections[alias]``, looked up here anyway).

    The label is ``pgqueue <role> <worker id>`` in ``pg_stat_activity.application_name``;
    ``statement_timeout`` is in seconds (None: keep the connection's own). The claim
    connection is also set up for claiming (``sql.SESSION_CONFIGURE_CLAIM``). Behind a
    transaction pooler neither the bound nor the claim set-up is a session setting
    here: :func:`bounded` sets them per transaction."""
    wrapper = connections[alias]
    raw = wrapper.connection
    if raw is not None and getattr(wrapper, "_pgqueue_session", None) is raw:
        return wrapper  # the common case (every job): set up already
    pooled = is_pooled(alias)
    if statement_timeout is not None and pooled:
        statement_timeout = None
    wrapper.ensure_connection()
    label_session(
        alias,
        f"pgqueue {role} {worker_id}",
        statement_timeout_ms=None if statement_timeout is None else int(statement_timeout * 1000),
    )
    if role == "claim" and not pooled:
        configure_claim_session(alias)
    wrapper._pgqueue_session = wrapper.connection  # type: ignore[attr-defined]
    # The label is part of a clean session now: a baseline read before it is stale.
    wrapper.connection._pgqueue_baseline = None
    return wrapper


def terminate_backend(alias: str, pid: int) -> None:
    """End the session of server process ``pid`` (a runner's of this worker), its open
    transaction rolled back and its locks let go."""
    db.rows(alias, sql.SESSION_TERMINATE, {"pid": pid})


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
            deadline.bind_transaction(alias, statement_timeout)
        yield


def recycle_connections(wrappers: list[Any] | None = None) -> None:
    """Between jobs: drop this thread's connections that broke or outlived CONN_MAX_AGE
    (``wrappers``: this thread's Django connections, if the caller knows them: see
    :func:`thread_connections`). One inside its caller's transaction is never dropped.

    Unlike ``close_old_connections()``, a connection is kept when CONN_MAX_AGE is 0:
    a worker is one long "request", and reconnecting per job would cost more than
    most jobs."""
    for conn in connections.all(initialized_only=True) if wrappers is None else wrappers:
        if conn.connection is None or _hosted(conn.alias) is not None:
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
    query starts on a fresh connection with clean transaction state.

    Behind a transaction pooler closing the client resets nothing on the server
    connection, which the pooler hands to its next client: there the transaction is
    rolled back and the session reset (``sql.SESSION_RESET``) first.

    A connection inside its caller's transaction (:func:`hosted_job`) is kept: what the
    job did on it is rolled back to the job's savepoint instead."""
    host = _hosted(alias)
    if host is not None:
        host.roll_back()
        return
    wrapper = connections[alias]
    try:
        raw = wrapper.connection
        if raw is not None:
            if is_pooled(alias) and not raw.closed and not raw.broken:
                reset_server_session(raw)
            raw.close()
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


def drop_connection(alias: str) -> None:
    """After a database error: drop this thread's connection so that the next query
    reconnects (``reconnect.close_connection``); one inside its caller's transaction is
    rolled back to the job's savepoint instead, which ends the error's aborted state."""
    host = _hosted(alias)
    if host is not None:
        host.roll_back()
    else:
        close_connection(alias)


def atomic_left(wrapper: Any) -> bool:
    """Whether an ``atomic`` block is open on this Django connection beyond its caller's
    own (a worker's connection has none; see :func:`hosted_job`)."""
    host = _hosted(wrapper.alias)
    if host is None:
        return bool(wrapper.in_atomic_block)
    return len(wrapper.atomic_blocks) > host.blocks


def reset_server_session(raw: Any) -> None:
    """Roll back whatever transaction ``raw`` (a psycopg connection) has open, then reset
    everything its server session holds (``sql.SESSION_RESET``), in one round trip."""
    raw.rollback()  # a raw BEGIN or the driver's autocommit off: ROLLBACK either way
    raw.autocommit = True
    raw.execute(sql.SESSION_RESET, prepare=False)  # no parameters: one simple query


# Cursor classes that count their creations on their connection, by the class they wrap.
_COUNTING: dict[type, type] = {}
# A runner thread's connections (thread_connections): those it opens get a baseline as
# they open. On a borrowed thread (borrowed()), also the caller's transactions the job
# being run is hosted in (hosted_job()), by alias.
_runner = threading.local()


@dataclass(frozen=True)
class Hosted:
    """A connection inside its caller's transaction while one job runs in it: how deep
    the caller's own atomic blocks go, and the savepoint taken before the job."""

    wrapper: Any
    #: The caller's atomic blocks, and their savepoints (Django's bookkeeping).
    blocks: int
    savepoints: int
    #: Whether the caller's innermost block was already marked for rollback.
    needs_rollback: bool
    #: The ``on_commit`` callbacks registered before the job.
    callbacks: int
    #: The job's savepoint.
    sid: str

    def roll_back(self) -> None:
        """Undo what the job did on the connection so far: its atomic blocks left open
        (Django's bookkeeping of them dropped, as closing the connection would), its
        statements (``ROLLBACK TO SAVEPOINT``, which also ends an aborted transaction's
        error state) and its ``on_commit`` callbacks. The connection then stands where
        it stood when the job started, inside the caller's transaction."""
        wrapper = self.wrapper
        del wrapper.atomic_blocks[self.blocks :]
        del wrapper.savepoint_ids[self.savepoints :]
        wrapper.needs_rollback = self.needs_rollback
        wrapper.savepoint_rollback(self.sid)
        del wrapper.run_on_commit[self.callbacks :]


#: How many threads of the process are borrowed now (:func:`borrowed`). A worker's own
#: threads never are: with none, :func:`_hosted` answers without reading the thread's
#: local state (a missing attribute of a ``threading.local`` costs microseconds, and
#: the checks after every job ask).
_borrowing = 0
_borrowing_lock = threading.Lock()


def _hosted(alias: str) -> Hosted | None:
    """The caller's transaction the current job runs in on ``alias`` (None: none)."""
    if not _borrowing:
        return None
    hosts = getattr(_runner, "hosts", None)
    return None if not hosts else hosts.get(alias)


@contextmanager
def borrowed() -> Iterator[None]:
    """Make this thread a runner thread for the block, on its caller's own connections
    (``testing.run_jobs``): those it has and those it opens are watched as a runner's
    are, each one's clean-session baseline read afresh (the caller's session as it is
    now, not as an earlier run found it), and afterwards the thread is its caller's
    again."""
    global _borrowing
    names = ("wrappers", "label", "hosts")
    saved = {name: getattr(_runner, name) for name in names if hasattr(_runner, name)}
    _runner.wrappers = list(connections.all(initialized_only=True))
    _runner.label = None
    _runner.hosts = {}
    for wrapper in _runner.wrappers:
        if wrapper.connection is not None:
            wrapper.connection._pgqueue_baseline = None
    with _borrowing_lock:
        _borrowing += 1
    try:
        yield
    finally:
        with _borrowing_lock:
            _borrowing -= 1
        for name in names:
            if name in saved:
                setattr(_runner, name, saved[name])
            elif hasattr(_runner, name):
                delattr(_runner, name)


@contextmanager
def hosted_job() -> Iterator[None]:
    """Run one job, on a :func:`borrowed` thread, inside the transactions its caller has
    open (a ``TestCase``'s, or the caller's own ``atomic`` block): a savepoint on each
    such connection before the job, released after it (rolled back to if the job's run
    raised). Where a worker would throw a connection away, what the job did on it is
    rolled back to that savepoint instead (:class:`Hosted`); a task's failed statement
    outside any atomic block of its own, which aborts the caller's transaction where a
    worker's autocommit would have ended it alone, is rolled back so too. Connections in
    autocommit are left as a runner's are. The savepoint is Django's low-level one, not
    an ``atomic`` block: the task sees the caller's blocks as they are (a durable block
    still nests in a ``TestCase``'s)."""
    hosts: dict[str, Hosted] = _runner.hosts
    for wrapper in connections.all(initialized_only=True):
        if wrapper.in_atomic_block:
            blocks, savepoints = len(wrapper.atomic_blocks), len(wrapper.savepoint_ids)
            needs_rollback, callbacks = wrapper.needs_rollback, len(wrapper.run_on_commit)
            sid = wrapper.savepoint()
            assert sid is not None, "a connection in an atomic block takes savepoints"
            hosts[wrapper.alias] = Hosted(
                wrapper, blocks, savepoints, needs_rollback, callbacks, sid
            )
    try:
        yield
    except BaseException:
        for host in hosts.values():
            try:
                host.roll_back()
                host.wrapper.savepoint_commit(host.sid)
            except Exception:  # noqa: BLE001, S110 - the job's own error says more
                pass
        raise
    else:
        for host in hosts.values():
            host.wrapper.savepoint_commit(host.sid)
    finally:
        hosts.clear()


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


def _watch(raw: Any) -> None:
    """Count ``raw``'s cursors from now on and, once per physical connection (and again
    after :func:`configure_session` labelled it), read what its clean session is."""
    if getattr(raw, "_pgqueue_baseline", None) is None:
        if not getattr(raw, "_pgqueue_counted", False):
            raw.cursor_factory = _counting(raw.cursor_factory)
            raw.server_cursor_factory = _counting(raw.server_cursor_factory)
            raw._pgqueue_counted = True
        raw._pgqueue_baseline = _fetch(raw, sql.SESSION_GET_STATE)
        raw._pgqueue_settings = _fetch(raw, sql.SESSION_GET_SETTINGS)
    raw._pgqueue_cursors = 0


def _fetch(raw: Any, query: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    """One row of ``query`` on the psycopg connection ``raw``, by column name."""
    cursor = raw.execute(query, params or {})
    names = [column.name for column in cursor.description or ()]
    return dict(zip(names, cursor.fetchone() or (), strict=True))


def _on_connection_created(sender: Any, connection: Any, **kwargs: Any) -> None:
    """A connection a task opens on a runner thread or a coroutine lane (to any
    database): its baseline is read before the task's first statement on it (on a
    lane, once it is labelled: see :func:`watch_lane`). A failure leaves it without
    one: it is then discarded after the job, without blaming the task."""
    known = getattr(_runner, "wrappers", None)
    if known is None or connection.connection is None:
        return
    if all(wrapper is not connection for wrapper in known):
        known.append(connection)
    try:
        label = getattr(_runner, "label", None)
        if label is not None:
            configure_session(connection.alias, *label)
        _watch(connection.connection)
    except (psycopg.Error, DatabaseError):
        if connection.connection is not None:
            connection.connection._pgqueue_baseline = None


def watch_lane(worker_id: str) -> None:
    """Set up a coroutine lane's thread (see ``coroutines.py``): every connection it
    opens, the worker's or a task's own, is labelled ``pgqueue async <worker id>`` and
    gets its clean-session baseline as it opens, for the checks after each job."""
    _runner.label = ("async", worker_id)
    thread_connections()


connection_created.connect(_on_connection_created, dispatch_uid="django_pgqueue.watch")


def watch_session(alias: str, own: Any = None) -> Any:
    """Before a task runs on this (runner) thread: start counting cursors on every
    connection the thread has open, reading each one's clean-session baseline once, and
    have the connections the task opens get theirs as they open. Return the psycopg
    connection of ``alias`` (connected and labelled by the caller, which may pass its
    Django connection as ``own``: what :func:`configure_session` returned, spared a
    second lookup in Django's per-thread handler), whose failing baseline read raises
    ``DatabaseError``; another database's connection that fails it is dropped (the task
    reconnects if it needs it)."""
    for wrapper in thread_connections():
        raw = wrapper.connection
        if raw is None or raw.closed:
            continue
        if getattr(raw, "_pgqueue_baseline", None) is not None:
            raw._pgqueue_cursors = 0  # the common case: nothing to read
            continue
        try:
            with wrapper.wrap_database_errors:
                _watch(raw)
        except DatabaseError:
            if wrapper.alias == alias:
                raise
            discard_connection(wrapper.alias)
    return (connections[alias] if own is None else own).connection


def thread_connections() -> list[Any]:
    """This runner thread's Django connections: those it had when it first asked, then
    each one it opens (``connection_created``). Kept per thread, as looking them up in
    Django's per-context connection handler every job costs more than the checks."""
    known = getattr(_runner, "wrappers", None)
    if known is None:
        known = _runner.wrappers = list(connections.all(initialized_only=True))
    return known


def session_leftovers(*, skip: str | None = None) -> dict[str, list[str]]:
    """What the task that just ran left on this thread's connections, by database alias
    and then by name (empty: nothing); ``skip`` is an alias not to look at (the jobs
    database inside a transactional task's own transaction). See :func:`leftovers`."""
    found: dict[str, list[str]] = {}
    for wrapper in thread_connections():
        if wrapper.alias != skip:
            left = leftovers(wrapper)
            if left:
                found[wrapper.alias] = left
    return found


def leftovers(wrapper: Any) -> list[str]:
    """What the task that just ran left on this thread's Django connection ``wrapper``,
    by name (empty: nothing).

    Free checks first, on the client: Django's transaction state and the driver's own
    (``transaction_status``, ``autocommit``), which see a raw ``BEGIN`` or
    ``connection.connection.autocommit = False`` that Django does not. Then, only if
    the task opened a cursor on the connection, one round trip (a pipeline): the
    session's state (``sql.SESSION_GET_STATE``: roles, the settings that change what
    SQL means, advisory locks, cursors, SQL prepared statements, LISTEN, temporary
    tables) compared to the connection's baseline, then every setting reset and the
    connection's own put back (``sql.SESSION_RESET_SETTINGS``,
    ``sql.SESSION_RESTORE_SETTINGS``): a ``SET work_mem`` or a ``setseed()`` is undone
    rather than blamed. A connection without a baseline (its read failed), or whose
    check fails (a terminated backend, a ``statement_timeout`` too short for it), cannot
    be compared: it is discarded here, without blaming the task."""
    alias = wrapper.alias
    current = wrapper.connection
    host = _hosted(alias)
    if host is not None:
        return hosted_leftovers(wrapper, host)
    found: list[str] = []
    if wrapper.in_atomic_block:
        found.append("an atomic block open")
    elif current is not None and not wrapper.autocommit:
        found.append("autocommit off (Django)")
    if current is None or current.closed or current.broken:
        return found  # closed or lost: nothing of its session survives
    # Off libpq's connection, as an int: ``info`` makes an object and an enum member on
    # every call, and this runs after every job.
    status = current.pgconn.transaction_status
    if status != pq.TransactionStatus.IDLE:
        found.append(f"a transaction open ({pq.TransactionStatus(status).name})")
    if not current.autocommit:
        found.append("autocommit off (driver)")
    if found:
        return found
    baseline = getattr(current, "_pgqueue_baseline", None)
    if baseline is None:
        discard_connection(alias)  # nothing to compare it with
        return found
    if not getattr(current, "_pgqueue_cursors", 0) or not settings.CHECK_SESSION_STATE:
        return found
    try:
        state = check_and_reset(current)
    except (psycopg.Error, DatabaseError):
        discard_connection(alias)
        return found
    current._pgqueue_cursors = 0
    return [
        f"SET {name}" if isinstance(value, str) else str(name)
        for name, value in state.items()
        if value != baseline.get(name)
    ]


def hosted_leftovers(wrapper: Any, host: Hosted) -> list[str]:
    """:func:`leftovers` of a connection inside its caller's transaction: an atomic
    block the task left open beyond the caller's. Its session state is not compared
    with a baseline: the caller's transaction holds state a worker's connection would
    not (the claims' advisory locks, ``SET LOCAL``). A transaction aborted by the task's
    failed statement is no leftover (a worker's autocommit ended it with the
    statement): it is rolled back to the job's savepoint here."""
    if len(wrapper.atomic_blocks) > host.blocks:
        return ["an atomic block open"]
    current = wrapper.connection
    if (
        current is not None
        and not current.closed
        and current.info.transaction_status == pq.TransactionStatus.INERROR
    ):
        host.roll_back()
    return []


def check_and_reset(raw: Any) -> dict[str, Any]:
    """Read the session state of ``raw`` (``sql.SESSION_GET_STATE``), then reset every
    setting to the connection's own, in one pipelined round trip (one implicit
    transaction: one server connection behind a pooler). Return the state read."""
    own = raw._pgqueue_settings
    with raw.pipeline():
        state = raw.execute(sql.SESSION_GET_STATE, {})
        raw.execute(sql.SESSION_RESET_SETTINGS)
        raw.execute(sql.SESSION_RESTORE_SETTINGS, {"names": own["names"], "values": own["values"]})
    names = [column.name for column in state.description or ()]
    return dict(zip(names, state.fetchone() or (), strict=True))


def listen(conn: psycopg.Connection[Any], channel: str) -> None:
    """Subscribe the listener's own connection ``conn`` to ``channel``
    (``sql.SESSION_LISTEN``: LISTEN takes an identifier, not a parameter)."""
    conn.execute(pgsql.SQL(sql.SESSION_LISTEN).format(channel=pgsql.Identifier(channel)))


def ping(conn: psycopg.Connection[Any]) -> None:
    """Prove the listener's idle connection ``conn`` alive (``sql.SESSION_PING``): a
    socket can die silently while it only waits for notifications."""
    conn.execute(sql.SESSION_PING)
