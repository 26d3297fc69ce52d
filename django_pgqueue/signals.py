"""Two-signal shutdown for long-running commands (worker, sweeper).

The first SIGTERM or SIGINT asks the process to stop gracefully; the second aborts at
once by raising :class:`Abort` in the main thread. Handlers are installed only on the
main thread and the previous ones are restored on exit.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

logger = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Abort(BaseException):  # noqa: N818 - like KeyboardInterrupt, not an error
    """Raised in the main thread by the second stop signal."""


@contextmanager
def on_stop(
    stop: Callable[[], None], *, finishing: str = "finishing current jobs"
) -> Iterator[None]:
    """Call ``stop()`` on the first SIGTERM/SIGINT; raise ``Abort`` on the second.
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

    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
