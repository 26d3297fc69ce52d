"""A worker's row in the workers table: registered at start, refreshed by the
heartbeat, deleted at a clean exit.

The row is what ``pgqueue_status``, the admin dashboard and the metrics list as live
workers. Nothing here may stop a worker from working: a failed write is logged and
tried again at the next beat (a row that went missing is registered again), so a
database blip or a workers table not migrated yet costs a log line, not the jobs.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.db import DatabaseError

from .. import __version__, db, sql
from ..exceptions import first_line

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


#: Workers of this process by id (a process usually runs one; tests run several).
_registered: dict[str, Registration] = {}
_lock = threading.Lock()


def _counts(state: WorkerState | None) -> dict[str, int]:
    if state is None:
        return {"jobs_held": 0, "jobs_done": 0, "jobs_failed": 0}
    return {
        "jobs_held": len(state.held),
        "jobs_done": state.stats.done,
        "jobs_failed": state.stats.failed,
    }


def _register(reg: Registration, state: WorkerState | None, *, restart: bool) -> None:
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
            **_counts(state),
        },
    )


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
    try:
        _register(reg, None, restart=True)
    except DatabaseError as exc:
        _warn(worker_id, "could not register in the workers table", exc)


def touch(state: WorkerState) -> None:
    """The heartbeat's call: last seen now, with the jobs held and the totals so far.

    One primary-key UPDATE; if the row is gone (the sweeper pruned it while this worker
    was cut off), it is registered again."""
    with _lock:
        reg = _registered.get(state.worker_id)
    if reg is None:
        return
    try:
        updated = db.rowcount(
            reg.alias, sql.WORKER_TOUCH, {"id": reg.worker_id, "now": None, **_counts(state)}
        )
        if not updated:
            _register(reg, state, restart=False)
    except DatabaseError as exc:
        _warn(reg.worker_id, "could not refresh its row in the workers table", exc)


def unregister(worker_id: str) -> None:
    """Delete this worker's row at a clean exit."""
    with _lock:
        reg = _registered.pop(worker_id, None)
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
