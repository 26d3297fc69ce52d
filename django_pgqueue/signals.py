"""Two-signal shutdown for long-running commands (worker, sweeper).

The first SIGTERM, SIGINT or SIGHUP asks the process to stop gracefully; the second
aborts at once by raising :class:`Abort` in the main thread. Handlers are installed
only on the main thread and the previous ones are restored on exit. SIGHUP is a stop
signal (a closed terminal means nobody watches the process any more) unless it is
ignored when the handlers are installed (``nohup``): then it stays ignored.

A process takes a while to start (Django's set-up, the start-up checks) before
:func:`on_stop` can be installed; :func:`defer_stop` covers that time: a stop signal
then is remembered, and :func:`on_stop` acts on it as soon as it takes over, so an
early SIGTERM still means a clean stop rather than death by the signal.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

logger = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

#: Stop signals received under :func:`defer_stop`, not yet acted on.
_deferred: list[int] = []


def stop_signals() -> tuple[int, ...]:
    """The stop signals to handle now: SIGHUP only if it is not ignored (``nohup``)."""
    return tuple(
        sig
        for sig in STOP_SIGNALS
        if sig != signal.SIGHUP or signal.getsignal(sig) is not signal.SIG_IGN
    )


def _remember(signum: int, frame: FrameType | None) -> None:
    _deferred.append(signum)


def defer_stop() -> dict[int, Any]:
    """Until :func:`on_stop` (or a supervisor) takes over, remember stop signals rather
    than die of them. Returns the previous handlers (for :func:`restore`). Main thread
    only (else a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, _remember) for sig in stop_signals()}


def take_deferred() -> list[int]:
    """The stop signals :func:`defer_stop` remembered, oldest first; forgets them."""
    taken = list(_deferred)
    del _deferred[: len(taken)]
    return taken


def restore(previous: dict[int, Any]) -> None:
    """Put back the handlers :func:`defer_stop` replaced."""
    for sig, handler in previous.items():
        signal.signal(sig, handler)


class Abort(BaseException):  # noqa: N818 - like KeyboardInterrupt, not an error
    """Raised in the main thread by the second stop signal."""


def replaced_abort(exc: BaseException) -> Abort | None:
    """The ``Abort`` that ``exc`` was raised while handling, if any. An ``Abort`` that
    lands inside a query leaves psycopg's connection busy (it cancels the query on
    ``KeyboardInterrupt`` only); the clean-up on the way out (a rollback, a reset) then
    fails on it, and that ``DatabaseError`` replaces the ``Abort``, which a handler of
    database errors would swallow: the worker went on, waiting out its running job."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, Abort):
            return current
        seen.add(id(current))
        current = current.__context__
    return None


@contextmanager
def on_stop(
    stop: Callable[[], None], *, finishing: str = "finishing current jobs"
) -> Iterator[None]:
    """Call ``stop()`` on the first stop signal; raise ``Abort`` on the second. Signals
    remembered by :func:`defer_stop` count, in order, as soon as this takes over.
    ``finishing`` says in the log what the process does before it exits."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        name = signal.Signals(signum).name
        if len(received) == 1:
            logger.info(
                "%s received: %s, then exiting (again to abort)",
                name,
                finishing,
                extra={"action": "stop"},
            )
            stop()
        else:
            logger.warning("%s received again: aborting now", name, extra={"action": "abort"})
            raise Abort(name)

    previous = {sig: signal.signal(sig, handler) for sig in stop_signals()}
    try:
        for signum in take_deferred():
            handler(signum, None)
        yield
    finally:
        restore(previous)
