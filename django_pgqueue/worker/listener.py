"""The listener thread: a dedicated LISTEN connection that wakes the claim loop.

The connection is opened from ``databases.listen_target``: the jobs database itself,
or ``OPTIONS["LISTEN_DATABASE"]`` when the jobs database is behind a transaction pooler.

NOTIFY is only a latency hint. If this connection dies, the poll interval still
guarantees pickup, and after every reconnect the claim loop is woken to poll at once.

The same channel carries ``Job.objects.cancel()``'s notifications of running jobs
(``manager.CANCEL_NOTIFY_PREFIX`` and job ids): a held one's task is told at once. A
cancel missed here (the connection was down) still reaches the task at the next lease
extension, a third of a lease later at most. A job a workflow released (its parents
finished) is announced as ``manager.RELEASE_NOTIFY_PREFIX`` and its queue: it keeps the
id it was enqueued with, which a busy worker's claim position may be past, so the next
claim starts at the head of the claim index (see ``position.py``). And flow control's
(``flow.NOTIFY_PREFIX``): limits or paused queues changed, so the claim loop loads them
again before its next claim (a change missed here is loaded within
``flow.REFRESH_SECONDS`` anyway).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import psycopg

from .. import flow
from ..conf import settings
from ..exceptions import first_line
from ..operate import CANCEL_NOTIFY_PREFIX
from ..reconnect import Retry
from ..workflows import RELEASE_NOTIFY_PREFIX
from . import connections
from .state import WorkerPart, WorkerState

logger = logging.getLogger(__name__)


class Listener(WorkerPart):
    """Sets ``wakeup`` on a notification for one of ``queues`` (None: any queue), and
    the cancel flag of a held job named by a cancel notification, until ``done`` is
    set. Its connection is labelled ``pgqueue listen <worker id>``."""

    def __init__(
        self,
        state: WorkerState,
        *,
        queues: list[str] | None,
        params: dict[str, Any],
        flow_changed: Callable[[], None] = lambda: None,
    ) -> None:
        super().__init__(state)
        self.queues = queues
        #: Called on a flow control notification (``FlowState.changed``).
        self.flow_changed = flow_changed
        #: ``psycopg.connect`` arguments of a direct (session) connection: LISTEN
        #: through a transaction pooler would lose its subscription at commit.
        self.params = params

    def run(self) -> None:
        """The thread's body: (re)connect, LISTEN, relay notifications, ping when idle."""
        params = self.params
        retry = Retry(stop=self.state.done, params=params)
        while not self.state.done.is_set():
            try:
                with psycopg.connect(
                    **{**params, "application_name": f"pgqueue listen {self.worker_id}"[:63]},
                    autocommit=True,
                ) as conn:
                    connections.listen(conn, settings.NOTIFY_CHANNEL)
                    retry.succeeded()
                    self.state.wakeup.set()  # poll at once: a NOTIFY may have been missed
                    checked = time.monotonic()
                    while not self.state.done.is_set():
                        # Short waits so the thread (and its connection) ends soon after
                        # shutdown; it would otherwise outlive run() by up to a wait.
                        for notify in conn.notifies(timeout=0.25):
                            payload = notify.payload
                            if payload.startswith(CANCEL_NOTIFY_PREFIX):
                                self._cancel(payload)
                                continue
                            if payload.startswith(flow.NOTIFY_PREFIX):
                                self.flow_changed()
                                self.state.wakeup.set()
                                continue
                            if payload.startswith(RELEASE_NOTIFY_PREFIX):
                                payload = payload[len(RELEASE_NOTIFY_PREFIX) :]
                                released = True
                            else:
                                released = False
                            if self.queues is None or payload in self.queues:
                                if released:
                                    self.state.released.set()
                                self.state.wakeup.set()
                        if time.monotonic() - checked >= 2.0:
                            # An idle socket can die silently; a cheap query proves it alive.
                            connections.ping(conn)
                            checked = time.monotonic()
            except psycopg.Error as exc:
                retry.failed()
                logger.warning(
                    "worker %s: LISTEN connection lost (%s); polling until it is back",
                    self.worker_id,
                    first_line(exc),
                    extra={"action": "listen", "worker_id": self.worker_id},
                )
                retry.wait()

    def _cancel(self, payload: str) -> None:
        """Set the cancel flag of each held job the payload names (others: not ours)."""
        for part in payload[len(CANCEL_NOTIFY_PREFIX) :].split(","):
            if part.isascii() and part.isdigit() and int(part) in self.state.held:
                self.request_cancel(int(part))
