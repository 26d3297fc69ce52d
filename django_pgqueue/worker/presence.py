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
"""

from __future__ import annotations

import logging
import os
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


def _register(reg: Registration, state: WorkerState | None, *, restart: bool) -> None:
    counts = _counts(state)
    db.rowcount(
        reg.alias,
        sql.WORKER_REGISTER,
        {
            "id": reg.worker_id,
            "hostname": reg.hostname,
            "pid": reg.pid,
            "queues": reg.queues,
            "concurrency": reg.concurrency,
            "lease_seconds": reg.lease_seconds,
            "version": reg.version,
            "restart": restart,
            "now": None,
            **counts,
            "rss_bytes": rss_bytes(),
            "restarts": restarts(),
        },
    )
    _written[reg.worker_id] = counts


def register(
    alias: str,
    worker_id: str,
    *,
    queues: list[str] | None,
    concurrency: int,
    lease_seconds: float,
) -> None:
    """Add (or take over) this worker's row; on failure the next beat tries again."""
    reg = Registration(
        alias=alias,
        worker_id=worker_id,
        queues=queues,
        concurrency=concurrency,
        lease_seconds=lease_seconds,
        hostname=socket.gethostname()[:255],
        pid=os.getpid(),
        version=package_version()[:64],
    )
    with _lock:
        _registered[worker_id] = reg
        _written.pop(worker_id, None)
    try:
        _register(reg, None, restart=True)
    except DatabaseError as exc:
        close_connection(alias)  # the next try reconnects
        _warn(worker_id, "could not register in the workers table", exc)


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
            {"id": reg.worker_id, "now": None, **counts, "rss_bytes": rss_bytes()},
        )
        if updated:
            _written[reg.worker_id] = counts
        else:
            _register(reg, state, restart=False)
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
        db.rowcount(reg.alias, sql.WORKER_DELETE, {"id": worker_id})
    except DatabaseError as exc:
        _warn(worker_id, "could not remove its row from the workers table", exc)


def _warn(worker_id: str, what: str, exc: BaseException) -> None:
    logger.warning(
        "worker %s: %s (%s); the sweeper removes a stale row",
        worker_id,
        what,
        first_line(exc),
        extra={"action": "presence", "worker_id": worker_id},
    )
