"""Waiting out a database fault: the pause between reconnect attempts (``Retry``, which
also probes the server so work resumes as soon as it is back), and dropping a
connection so that the next query reconnects.

Shared by every loop that talks to the database on its own (the worker's parts, the
supervisor, the sweeper).
"""

from __future__ import annotations

import os
import random
import socket
import threading
import time
from typing import Any

from django.db import DatabaseError, connections
from psycopg.conninfo import conninfo_to_dict

#: Longest wait between reconnection attempts after a database error.
MAX_BACKOFF = 30.0


def backoff_delay(failures: int) -> float:
    """Exponential backoff with jitter for reconnect loops: 0.5 s, 1 s, 2 s ... 30 s."""
    return min(MAX_BACKOFF, 0.5 * 2 ** min(failures - 1, 10)) * random.uniform(0.8, 1.2)


def close_connection(alias: str) -> None:
    """Drop this thread's connection so the next query reconnects."""
    try:
        connections[alias].close()
    except DatabaseError:
        pass


#: Seconds between two probes of the server while a loop waits to retry.
PROBE_INTERVAL = 0.5

#: How long one probe may take to connect (a server that drops packets).
PROBE_TIMEOUT = 1.0


def socket_targets(params: dict[str, Any]) -> list[tuple[int, Any]]:
    """Where libpq would connect, from connection parameters (``host``, ``hostaddr``,
    ``port``): (address family, address) pairs; empty when that cannot be told (no host
    given: libpq's compiled-in default socket directory). A ``conninfo`` string (a DSN)
    among them is read too."""
    if params.get("conninfo"):
        params = {**conninfo_to_dict(str(params["conninfo"])), **params}
    hosts = str(params.get("hostaddr") or params.get("host") or "")
    if not hosts:
        return []
    host_list = hosts.split(",")
    ports = str(params.get("port") or "5432").split(",")
    if len(ports) == 1:
        ports = ports * len(host_list)
    targets: list[tuple[int, Any]] = []
    for host, port in zip(host_list, ports, strict=False):
        port = port or "5432"
        if host.startswith("/"):
            targets.append((socket.AF_UNIX, os.path.join(host, f".s.PGSQL.{port}")))
        elif host:
            targets.append((socket.AF_UNSPEC, (host, int(port))))
    return targets


def server_reachable(targets: list[tuple[int, Any]]) -> bool | None:
    """Whether any of ``targets`` accepts a connection (None: nothing to probe)."""
    if not targets:
        return None
    for family, address in targets:
        try:
            if family == socket.AF_UNIX:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                    sock.settimeout(PROBE_TIMEOUT)
                    sock.connect(address)
            else:
                socket.create_connection(address, timeout=PROBE_TIMEOUT).close()
        except OSError:
            continue
        return True
    return False


def database_targets(alias: str) -> list[tuple[int, Any]]:
    """:func:`socket_targets` of Django database ``alias``."""
    return socket_targets(connections[alias].get_connection_params())


class Retry:
    """The pacing of one loop's retries through database errors.

    Call :meth:`failed` on each error (it returns the delay of the coming wait, for the
    log line), :meth:`wait` before trying again, and :meth:`succeeded` once an attempt
    worked. ``stop`` ends a wait early (the loop is shutting down). The server probed is
    database ``alias``'s, or the one ``params`` (libpq keywords) names."""

    def __init__(
        self,
        alias: str | None = None,
        *,
        stop: threading.Event,
        params: dict[str, Any] | None = None,
        deadline: float | None = None,
    ) -> None:
        self.alias = alias
        self.stop = stop
        self.params = params
        self.deadline = deadline
        self.failures = 0
        self._delay = 0.0
        self._first_failure: float | None = None
        self._targets: list[tuple[int, Any]] | None = None
        # The server was found down since the last success: a probe that finds it up
        # then ends the wait (also while it is still starting up and refusing logins).
        self._seen_down = False

    def failed(self) -> float:
        """Count a failure; return how long the next :meth:`wait` lasts at most."""
        self.failures += 1
        if self._first_failure is None:
            self._first_failure = time.monotonic()
        self._delay = backoff_delay(self.failures)
        return self._delay

    def succeeded(self) -> None:
        """An attempt worked: the next failure starts from the shortest delay again."""
        self.failures = 0
        self._first_failure = None
        self._seen_down = False

    def expired(self) -> bool:
        """Whether failures have gone on for longer than ``deadline`` seconds."""
        return (
            self.deadline is not None
            and self._first_failure is not None
            and time.monotonic() - self._first_failure >= self.deadline
        )

    def wait(self) -> bool:
        """Wait before the next attempt: the delay :meth:`failed` returned, less if the
        server comes back meanwhile, never past the deadline. False if ``stop`` was set."""
        end = time.monotonic() + self._delay
        if self.deadline is not None and self._first_failure is not None:
            end = min(end, self._first_failure + self.deadline)
        waited = False
        while True:
            # At least one interval between attempts, even with the server up: one
            # that is starting up takes connections but refuses logins.
            if self._probe() and waited:
                return not self.stop.is_set()
            remaining = end - time.monotonic()
            if remaining <= 0:
                return not self.stop.is_set()
            if self.stop.wait(min(PROBE_INTERVAL, remaining)):
                return False
            waited = True

    def _probe(self) -> bool:
        """True when the server, found down before, is up again now."""
        if self._targets is None:
            try:
                params = self.params
                self._targets = (
                    socket_targets(params)
                    if params is not None
                    else database_targets(self.alias or "default")
                )
            except Exception:  # noqa: BLE001 - a probe must never break the loop
                self._targets = []
        up = server_reachable(self._targets)
        if up is False:
            self._seen_down = True
            return False
        return bool(up and self._seen_down)
