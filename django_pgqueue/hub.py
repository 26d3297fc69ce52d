"""One listening connection per jobs database, shared by every caller of this process
that waits on jobs there (``waiting.py``): a thread that LISTENs on ``pgqueue_waited``
and hands each notification to the waiters of its job.

The thread owns its connection and runs the waiters' statements on it as well
(``sql.JOB_WAIT_FLAG``, ``sql.JOB_WAIT_READ``): the flag must be committed at once,
outside whatever transaction the caller is in (a waited row locked by the caller's open
transaction would hold the completion back), and the connection LISTENs before any
waiter's first check, so no completion can fall between the check and the listen.

If the connection is lost, notifications sent meanwhile are lost with it: after the
reconnect every waiter is told to read its jobs again (``Waiter.notify(id, None)``).
"""

from __future__ import annotations

import logging
import os
import select
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import psycopg

from .databases import listen_target
from .exceptions import first_line
from .reconnect import Retry
from .sql import wait as sql

logger = logging.getLogger(__name__)

#: What a statement run for a waiter returns: job id -> (status, progress JSON text).
Rows = dict[int, tuple[str, str | None]]


class Waiter:
    """Someone waiting on some jobs: :meth:`notify` is called on the hub's thread for
    each notification of one of them (status None: read it again)."""

    def notify(self, job_id: int, status: str | None) -> None:  # pragma: no cover
        raise NotImplementedError


class Hub:
    """The listening connection of one jobs database (see the module doc)."""

    #: Seconds between pings of an idle connection (a socket can die silently).
    PING_SECONDS = 5.0

    def __init__(self, database: str, params: dict[str, Any]) -> None:
        self.database = database
        self.params = params
        self._lock = threading.Lock()
        self._interest: dict[int, set[Waiter]] = {}
        self._requests: deque[tuple[str, list[int], Callable[[Rows | BaseException], None]]]
        self._requests = deque()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        #: Set while the connection LISTENs (a request is only run on it then).
        self.listening = threading.Event()
        #: Set by :meth:`close`: the thread closes its connection and ends.
        self.closed = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"pgqueue-wait-{database}", daemon=True
        )
        self._thread.start()

    # -- called by waiters, on their own threads ---------------------------------------

    def register(self, waiter: Waiter, ids: list[int]) -> None:
        with self._lock:
            for job_id in ids:
                self._interest.setdefault(job_id, set()).add(waiter)

    def unregister(self, waiter: Waiter, ids: list[int]) -> None:
        with self._lock:
            for job_id in ids:
                waiters = self._interest.get(job_id)
                if waiters is not None:
                    waiters.discard(waiter)
                    if not waiters:
                        del self._interest[job_id]

    def submit(
        self, kind: str, ids: list[int], done: Callable[[Rows | BaseException], None]
    ) -> None:
        """Run ``kind`` ("flag": ``JOB_WAIT_FLAG``, else ``JOB_WAIT_READ``) for ``ids`` on
        the hub's connection once it listens; ``done`` gets the rows (or the error) on
        the hub's thread."""
        self._requests.append((kind, ids, done))
        self._wake()

    def close(self, timeout: float = 5.0) -> None:
        """End the thread and close its connection (waiters then wait until their
        timeout: close a hub nobody uses, as at the end of a test)."""
        self.closed.set()
        self._wake()
        self._thread.join(timeout)

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:  # the pipe is full: the thread is woken anyway
            pass

    # -- the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        retry = Retry(stop=self.closed, params=self.params)
        while not self.closed.is_set():
            try:
                with psycopg.connect(
                    **{**self.params, "application_name": f"pgqueue wait {os.getpid()}"},
                    autocommit=True,
                ) as conn:
                    conn.execute(sql.WAIT_LISTEN)
                    retry.succeeded()
                    self.listening.set()
                    self._recheck_all()
                    self._serve(conn)
            except psycopg.Error as exc:
                self.listening.clear()
                retry.failed()
                logger.warning(
                    "waiting for jobs on %r: LISTEN connection lost (%s); reconnecting",
                    self.database,
                    first_line(exc),
                )
                retry.wait()

    def _serve(self, conn: psycopg.Connection[Any]) -> None:
        """Run requests and relay notifications until the connection fails or the hub
        is closed."""
        while not self.closed.is_set():
            sockets = [conn.fileno(), self._wake_r]
            readable, _, _ = select.select(sockets, [], [], self.PING_SECONDS)
            if not readable:
                conn.execute(sql.WAIT_PING)
            try:
                while os.read(self._wake_r, 4096):
                    pass
            except BlockingIOError:
                pass
            while self._requests:
                self._answer(conn, *self._requests.popleft())
            for notify in conn.notifies(timeout=0):
                job_id, _, status = notify.payload.partition(" ")
                self._dispatch(int(job_id), status)

    def _answer(
        self,
        conn: psycopg.Connection[Any],
        kind: str,
        ids: list[int],
        done: Callable[[Rows | BaseException], None],
    ) -> None:
        try:
            if kind == "flag":
                found = conn.execute(sql.JOB_WAIT_FLAG, {"ids": ids}).fetchall()
            else:
                found = conn.execute(sql.JOB_WAIT_READ, {"ids": ids}).fetchall()
        except psycopg.OperationalError:
            self._requests.appendleft((kind, ids, done))  # run again once reconnected
            raise
        except psycopg.Error as exc:
            _call(done, exc)
            return
        _call(done, {job_id: (status, progress) for job_id, status, progress in found})

    def _dispatch(self, job_id: int, status: str | None) -> None:
        with self._lock:
            waiters = list(self._interest.get(job_id, ()))
        for waiter in waiters:
            _call(waiter.notify, job_id, status)

    def _recheck_all(self) -> None:
        """After a (re)connect: notifications may have been missed, read everything."""
        with self._lock:
            everything = [(job_id, list(w)) for job_id, w in self._interest.items()]
        for job_id, waiters in everything:
            for waiter in waiters:
                _call(waiter.notify, job_id, None)


def _call(callback: Callable[..., None], *args: Any) -> None:
    """Call a waiter's callback on the hub's thread; its failure is its own, never the
    hub's (whose thread serves every other waiter)."""
    try:
        callback(*args)
    except Exception:
        logger.exception("waiting for jobs: a waiter's callback failed")


_hubs: dict[str, Hub] = {}
_hubs_lock = threading.Lock()


def close_all() -> None:
    """Close every hub of this process (the next wait starts a new one)."""
    with _hubs_lock:
        hubs = list(_hubs.values())
        _hubs.clear()
    for found in hubs:
        found.close()


def hub(database: str, options: dict[str, Any]) -> Hub:
    """The hub of jobs database ``database`` (started on first use), reached as the
    workers' LISTEN is (``OPTIONS["LISTEN_DATABASE"]``, see ``databases.listen_target``)."""
    with _hubs_lock:
        found = _hubs.get(database)
        if found is None:
            target = listen_target(database, options)
            if target.params is None:
                raise ValueError(
                    f"cannot wait for jobs of database {database!r} without polling: "
                    f"no LISTEN connection ({target.description})"
                )
            found = _hubs[database] = Hub(database, target.params)
        return found
