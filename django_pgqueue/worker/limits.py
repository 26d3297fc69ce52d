"""Soft time limits: ``SoftTimeLimitExceeded`` raised inside a task that ran too long.

A sync task is interrupted in its own thread by CPython's asynchronous exception
(``PyThreadState_SetAsyncExc``, as Dramatiq does): it lands at the next Python bytecode
the thread runs, so a task inside a long C call (``time.sleep``, a blocking socket read)
sees it only once that call returns. A coroutine task is cancelled instead (see
``coroutines.py``). The limit of a job is its own (``Job.soft_time_limit``, given at
enqueue), else its task's (``@task(soft_time_limit=...)``), else
``PGQUEUE_SOFT_TIME_LIMIT``.
"""

from __future__ import annotations

import ctypes
import threading
from types import TracebackType
from typing import Any

from ..conf import settings
from ..exceptions import SoftTimeLimitExceeded


def soft_limit(job: Any, task_limit: float | None) -> float | None:
    """The soft time limit of ``job`` in seconds (None: none)."""
    if job.soft_time_limit is not None:
        return float(job.soft_time_limit)
    if task_limit is not None:
        return task_limit
    value = settings.SOFT_TIME_LIMIT
    return None if value is None else float(value)


def _set_async_exc(thread_id: int, exc: type[BaseException] | None) -> None:
    """Have thread ``thread_id`` raise ``exc`` at its next bytecode (None: forget one
    set and not raised yet)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id),
        ctypes.py_object(exc) if exc is not None else ctypes.c_void_p(None),
    )


class SoftLimit:
    """While armed (inside ``with``), raise ``SoftTimeLimitExceeded`` in the thread that
    entered after ``seconds``.

    The timer and the exit take one lock, so the exception is never set once the block
    is left; one set but not raised yet when the task returned is taken back at the
    exit. One landing between the task's return and the exit fails the attempt as if
    the task had raised it, which it was about to."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._thread_id = threading.get_ident()
        self._lock = threading.Lock()
        self._armed = False
        self.fired = False
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True

    def __enter__(self) -> SoftLimit:
        self._armed = True
        self._timer.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._timer.cancel()
        with self._lock:
            self._armed = False
            if self.fired:
                _set_async_exc(self._thread_id, None)

    def _fire(self) -> None:
        with self._lock:
            if self._armed:
                self.fired = True
                _set_async_exc(self._thread_id, SoftTimeLimitExceeded)
