"""A worker's row in the workers table: registered at start, refreshed by the
heartbeat, deleted at a clean exit.

The row is what ``pgqueue_status``, the admin dashboard and the metrics list as live
workers. Nothing here may stop a worker from working: a failed write is logged and
tried again (a row that went missing is registered again), so a database blip or a
workers table not migrated yet costs a log line, not the jobs. Between its lease
extensions the heartbeat calls :func:`refresh` every :data:`FIGURES_SECONDS`: it writes
only a row that is behind, so the figures lag by about that much, not a third of a
lease, and a worker that started while the database was down is listed as soon as the
database is back.

A row belongs to the process instance that registered it (a random token): a worker
touches and deletes only its own. A worker id held by another live process (its row
seen within its lease) is refused at start (:func:`register` says why), unless that
process is found dead on this host; a row taken over by another process (this one was
cut off past its lease) is left to it, with a warning, and this worker writes no row.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.db import DatabaseError

from .. import __version__, db
from ..exceptions import first_line
from ..reconnect import close_connection
from ..sql import presence as sql

if TYPE_CHECKING:
    from .state import WorkerState

logger = logging.getLogger(__name__)


def package_version() -> str:
    """The installed distribution's version (the package's ``__version__``)."""
    return __version__


@dataclass(frozen=True)
class Registration:
    """What a worker says about itself once, at start."""

    alias: str
    worker_id: str
    queues: list[str] | None
    concurrency: int
    lease_seconds: float
    hostname: str
    pid: int
    version: str
    #: This registration's own token: which row is this worker's.
    instance: str


#: How often the heartbeat offers :func:`refresh` a write between lease extensions.
FIGURES_SECONDS = 1.0

#: Workers of this process by id (a process usually runs one; tests run several).
_registered: dict[str, Registration] = {}
#: The figures each worker's row was last written with; absent: the row is behind (its
#: registration or last write failed), so the next refresh writes it.
_written: dict[str, dict[str, int]] = {}
_lock = threading.Lock()


def _counts(state: WorkerState | None) -> dict[str, int]:
    if state is None:
        return {"jobs_held": 0, "jobs_done": 0, "jobs_failed": 0}
    return {
        "jobs_held": len(state.held),
        "jobs_done": state.stats.done,
        "jobs_failed": state.stats.failed,
    }


#: The environment variable that carries a worker slot's restart count into the process
#: that replaces it (``limits.replace_process``, the supervisor's fork).
RESTARTS_VARIABLE = "PGQUEUE_WORKER_RESTARTS"


def rss_bytes() -> int | None:
    """This process's resident memory in bytes (None where ``/proc`` is not available)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


def restarts() -> int:
    """How many processes this one's slot had before it (see :data:`RESTARTS_VARIABLE`)."""
    value = os.environ.get(RESTARTS_VARIABLE, "0")
    return int(value) if value.isdigit() else 0


def _register(
    reg: Registration, state: WorkerState | None, *, restart: bool, take_over: bool = False
) -> bool:
    """Write the row; False if another live process holds the id (nothing written)."""
    counts = _counts(state)
    taken = db.rowcount(
        reg.alias,
        sql.WORKER_REGISTER,
        {
            "id": reg.worker_id,
            "instance": reg.instance,
            "hostname": reg.hostname,
            "pid": reg.pid,
            "queues": reg.queues,
            "concurrency": reg.concurrency,
            "lease_seconds": reg.lease_seconds,
            "version": reg.version,
            "restart": restart,
            "take_over": take_over,
            "now": None,
            **counts,
            "rss_bytes": rss_bytes(),
            "restarts": restarts(),
        },
    )
    if taken:
        _written[reg.worker_id] = counts
    return bool(taken)


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host still runs (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _holder(reg: Registration) -> tuple[str, int, float] | None:
    """(host, pid, seconds since last seen) of the row holding ``reg``'s id."""
    rows = db.rows(reg.alias, sql.WORKER_HOLDER, {"id": reg.worker_id, "now": None})
    return (str(rows[0][0]), int(rows[0][1]), float(rows[0][2])) if rows else None


def _claim(reg: Registration) -> str | None:
    """Register at start: None when the row is this worker's, else why the id is
    refused. A holder on this host whose process is gone (or is this one: a container
    restarted with the same pid) is taken over; it cannot be alive."""
    if _register(reg, None, restart=True):
        return None
    holder = _holder(reg)
    if holder is None:  # deleted meanwhile: try once more
        return None if _register(reg, None, restart=True) else _refusal(reg, None)
    host, pid, unseen = holder
    if host == reg.hostname and (pid == reg.pid or not _pid_alive(pid)):
        if _register(reg, None, restart=True, take_over=True):
            return None
    return _refusal(reg, holder)


def _refusal(reg: Registration, holder: tuple[str, int, float] | None) -> str:
    who = (
        "another process"
        if holder is None
        else (f"the worker process {holder[1]} on {holder[0]}, last seen {holder[2]:.1f}s ago")
    )
    return (
        f"worker id {reg.worker_id!r} is held by {who}: two live workers must not share "
        "an id (each would take the other's row). Give each worker its own --worker-id, "
        "or leave it out (host:pid:random); a dead worker's id is free once its row is "
        "unseen for longer than its lease"
    )


def register(
    alias: str,
    worker_id: str,
    *,
    queues: list[str] | None,
    concurrency: int,
    lease_seconds: float,
) -> str | None:
    """Add this worker's row (or take over a lost one, or its own). Return why the id is
    refused when another live process holds it (nothing written); None otherwise. A
    database error is logged and the next beat tries again."""
    reg = Registration(
        alias=alias,
        worker_id=worker_id,
        queues=queues,
        concurrency=concurrency,
        lease_seconds=lease_seconds,
        hostname=socket.gethostname()[:255],
        pid=os.getpid(),
        version=package_version()[:64],
        instance=secrets.token_hex(8),
    )
    with _lock:
        _written.pop(worker_id, None)
    try:
        refused = _claim(reg)
    except DatabaseError as exc:
        close_connection(alias)  # the next try reconnects
        _warn(worker_id, "could not register in the workers table", exc)
        refused = None
    if refused is None:
        with _lock:
            _registered[worker_id] = reg
    return refused


def touch(state: WorkerState, *, quiet: bool = False) -> None:
    """The heartbeat's call: last seen now, with the jobs held and the totals so far.

    One primary-key UPDATE; if the row is gone (the sweeper pruned it while this worker
    was cut off, or it never got in), it is registered again. ``quiet``: a failure is
    logged at DEBUG (one already said so)."""
    with _lock:
        reg = _registered.get(state.worker_id)
    if reg is None:
        return
    counts = _counts(state)
    try:
        updated = db.rowcount(
            reg.alias,
            sql.WORKER_TOUCH,
            {
                "id": reg.worker_id,
                "instance": reg.instance,
                "now": None,
                **counts,
                "rss_bytes": rss_bytes(),
            },
        )
        if updated:
            _written[reg.worker_id] = counts
        elif not _register(reg, state, restart=False):
            _displaced(reg)
    except DatabaseError as exc:
        # A cut connection stays cut: without this an idle worker, whose heartbeat
        # runs nothing else, would never write its row again (and show as lost).
        close_connection(reg.alias)
        _written.pop(reg.worker_id, None)
        if quiet:
            logger.debug("worker %s: workers table still unreachable (%s)", reg.worker_id, exc)
        else:
            _warn(reg.worker_id, "could not refresh its row in the workers table", exc)


def refresh(state: WorkerState) -> None:
    """Write this worker's row if it is behind: its figures changed since the last
    write, or its registration (or last write) failed. Otherwise nothing."""
    written = _written.get(state.worker_id)
    if written != _counts(state):
        touch(state, quiet=written is None)


def unregister(worker_id: str) -> None:
    """Delete this worker's row at a clean exit."""
    with _lock:
        reg = _registered.pop(worker_id, None)
        _written.pop(worker_id, None)
    if reg is None:
        return
    try:
        db.rowcount(reg.alias, sql.WORKER_DELETE, {"id": worker_id, "instance": reg.instance})
    except DatabaseError as exc:
        _warn(worker_id, "could not remove its row from the workers table", exc)


def _displaced(reg: Registration) -> None:
    """Another live process took this worker's id while this one was cut off past its
    lease: its row is that process's now. Say so once, and write no row again."""
    with _lock:
        if _registered.get(reg.worker_id) is not reg:
            return
        del _registered[reg.worker_id]
        _written.pop(reg.worker_id, None)
    logger.error(
        "worker %s: another live process took over this worker id while this worker was "
        "unseen for longer than its lease; this worker keeps working but no longer writes "
        "a row in the workers table (give each worker its own --worker-id)",
        reg.worker_id,
        extra={"action": "presence", "worker_id": reg.worker_id},
    )


def _warn(worker_id: str, what: str, exc: BaseException) -> None:
    logger.warning(
        "worker %s: %s (%s); the sweeper removes a stale row",
        worker_id,
        what,
        first_line(exc),
        extra={"action": "presence", "worker_id": worker_id},
    )
