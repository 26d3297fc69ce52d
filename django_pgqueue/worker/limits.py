"""Time limits: ``SoftTimeLimitExceeded`` raised inside a task that ran too long, and
the hard limit past which its job is failed and the worker process replaced.

A sync task is interrupted in its own thread by CPython's asynchronous exception
(``PyThreadState_SetAsyncExc``, as Dramatiq does): it lands at the next Python bytecode
the thread runs, so a task inside a long C call (``time.sleep``, a blocking socket read)
sees it only once that call returns. A coroutine task is cancelled instead (see
``coroutines.py``). The limit of a job is its own (``Job.soft_time_limit``, given at
enqueue), else its task's (``@task(soft_time_limit=...)``), else
``PGQUEUE_SOFT_TIME_LIMIT``.

A hard limit (``time_limit``, ``PGQUEUE_TIME_LIMIT``; the same order) cannot be
enforced inside the process: a thread stuck in C cannot be stopped. The
:class:`HardLimits` thread of the worker sees a job still running at its limit, records
it failed with ``TimeLimitExceeded`` (fenced, as any failure), gives the process's other
jobs back without charging their attempts, and has the process replaced
(:data:`REPLACE_MODES`): its threads, connections and memory go with it.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

from django.db import DatabaseError

from ..conf import settings
from ..exceptions import SoftTimeLimitExceeded, TimeLimitExceeded
from . import presence
from .connections import terminate_backend
from .state import WorkerPart, WorkerState

logger = logging.getLogger(__name__)

#: How a worker process is replaced once a job passed its hard limit: ``"exec"`` (one
#: process: it re-executes itself with the same argv), ``"exit"`` (a supervisor's
#: child: it exits with :data:`EXIT_TIME_LIMIT` and the supervisor starts another), or
#: ``"stop"`` (a worker run in-process: it stops claiming and its run() returns).
REPLACE_MODES = ("exec", "exit", "stop")
#: The exit code of a supervisor's child replaced for a hard time limit.
EXIT_TIME_LIMIT = 5
#: How often the hard limits are checked (seconds).
CHECK_SECONDS = 0.1
#: How long a replacement waits for the outcomes of the process's jobs that finished
#: (seconds) before it gives back the others.
SETTLE_SECONDS = 5.0


def soft_limit(job: Any, task_limit: float | None) -> float | None:
    """The soft time limit of ``job`` in seconds (None: none)."""
    if job.soft_time_limit is not None:
        return float(job.soft_time_limit)
    if task_limit is not None:
        return task_limit
    value = settings.SOFT_TIME_LIMIT
    return None if value is None else float(value)


def rss_mb() -> float | None:
    """This process's resident memory in MB (None where ``/proc`` is not available)."""
    found = presence.rss_bytes()
    return None if found is None else found / 2**20


def replace_process(mode: str) -> None:
    """Replace this process (see :data:`REPLACE_MODES`; ``"stop"``: nothing to do)."""
    sys.stdout.flush()
    sys.stderr.flush()
    if mode == "exit":
        os._exit(EXIT_TIME_LIMIT)
    if mode == "exec":
        os.environ[presence.RESTARTS_VARIABLE] = str(presence.restarts() + 1)
        os.execv(sys.executable, [sys.executable, *sys.argv])  # noqa: S606 - the same argv


def hard_limit(job: Any, task_limit: float | None) -> float | None:
    """The hard time limit of ``job`` in seconds (None: none)."""
    if job.time_limit is not None:
        return float(job.time_limit)
    if task_limit is not None:
        return task_limit
    value = settings.TIME_LIMIT
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


class HardLimits(WorkerPart):
    """The thread that enforces the hard time limits of a worker's running jobs."""

    def __init__(
        self,
        state: WorkerState,
        *,
        replace: str,
        stop: Callable[[], None],
        flush: Callable[[], None] = lambda: None,
    ) -> None:
        super().__init__(state)
        if replace not in REPLACE_MODES:
            raise ValueError(f"replace must be one of {REPLACE_MODES}, not {replace!r}")
        self.replace = replace
        #: Stops the worker's claiming (``Worker.stop``), for ``"stop"``.
        self.stop = stop
        #: Has the batched completer write what it holds now, and what arrives
        #: (``Completer.hurry``), before the process is replaced.
        self.flush = flush

    def run(self) -> None:
        while not self.state.done.wait(CHECK_SECONDS):
            late = self._late()
            if late is not None:
                self._enforce(*late)
                return

    def _late(self) -> tuple[Any, float, int | None] | None:
        """A held job running past its hard limit, and that limit (None: none is)."""
        now = time.monotonic()
        with self.state.lock:
            for held in self.state.held.values():
                limit = held.time_limit
                # Counted from the claim (a job that has not started is never failed:
                # it is not running anything to stop).
                if (
                    limit is not None
                    and held.started is not None
                    and not held.finishing
                    and now - held.claimed >= limit
                ):
                    return held.job, limit, held.backend_pid
        return None

    def _enforce(self, job: Any, limit: float, pid: int | None = None) -> None:
        """Fail ``job``, release the others, and have the process replaced. The
        session of the runner running it (``pid``) is ended first, when the process
        is to be replaced: a lock its open transaction holds on the job's row (a
        cursor saved, a step recorded, inside it) kept the failure from being written,
        and the process from being replaced, for good."""
        if pid is not None and self.replace != "stop":
            try:
                terminate_backend(self.alias, pid)
            except DatabaseError as exc:
                logger.warning("job %s: could not end its runner's session (%s)", job.id, exc)
        error = TimeLimitExceeded(f"still running at its time limit of {limit:g}s")
        status = self.record_failure(job, error)
        logger.error(
            "job %s %s: still running at its time limit of %gs; failed (%s), worker "
            "process %s replaced",
            job.id,
            job.task,
            limit,
            status or "not recorded: lease lost",
            os.getpid(),
            extra={"action": "time_limit", "job_id": job.id, "worker_id": self.worker_id},
        )
        for other in self._others(job):
            written, _ = self.write_retrying(
                functools.partial(self.state.jobs.release, other, self.worker_id),
                jobs=[other],
                outcome="release",
            )
            if written:
                self.state.stats.count("released")
        self._replace()

    def _others(self, job: Any) -> list[Any]:
        """The process's other jobs to give back: not those that finished (their
        outcome being written, or held by the batched completer), which are written
        first (within :data:`SETTLE_SECONDS`; one still unwritten then is left to its
        lease): given back, a job done would run again."""
        if self.replace != "stop":  # (in-process, Worker.stop ends its claims after)
            with self.state.claims:  # (a claim in flight is held first)
                self.state.claims_closed.set()
        self.flush()
        deadline = time.monotonic() + SETTLE_SECONDS
        while True:
            with self.state.lock:
                others = [h for h in self.state.held.values() if h.job.id != job.id]
            if not any(h.finishing for h in others) or time.monotonic() >= deadline:
                return [h.job for h in others if not h.finishing]
            time.sleep(0.01)

    def _replace(self) -> None:
        """Replace this process (see :data:`REPLACE_MODES`)."""
        if self.replace == "stop":
            self.stop()
            return
        presence.unregister(self.worker_id)
        replace_process(self.replace)
