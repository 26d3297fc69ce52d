"""``pgqueue_worker --processes N``: one supervisor process, N worker processes.

Python runs one thread of Python code at a time, so one worker process uses about one
core however high its ``--concurrency``. The supervisor forks N children, each a full
:class:`~django_pgqueue.worker.Worker` with its own connections and its own worker id,
and looks after them:

* the first SIGTERM, SIGINT or SIGHUP is forwarded to every child (with a SIGCONT, so
  that a stopped child wakes to act on it): each stops claiming, lets its running jobs
  finish (within its grace period), releases what it had not started, and exits; the
  supervisor exits once all have, or SIGKILLs those still running after
  ``stop_seconds`` (``PGQUEUE_SUPERVISOR_STOP_SECONDS``, ``--stop-seconds``) and exits 4;
* a second stop signal is forwarded too (each child aborts at once), then the
  supervisor exits 1;
* a child that dies (killed, crashed, or stopped on a fatal error) is logged and
  started again, after a backoff that grows while children keep dying young;
* a child that exits :data:`~.limits.EXIT_TIME_LIMIT` (a job passed its hard time
  limit, see ``limits.py``) is started again at once;
* a child that exits 0 on its own (``--burst`` ran out of work, ``--max-jobs`` reached)
  is done and not restarted; the supervisor exits when every child is done. With
  ``--burst`` a child that gave up (exit 3: a database that stayed unreachable) is not
  restarted either, and the supervisor then exits 3: a burst run ends.

Children run in a process group of their own, so a terminal's Ctrl-C reaches only the
supervisor (which forwards it once) and not every process twice. A child never
outlives its supervisor: it holds the read end of a pipe whose write end only the
supervisor holds, so however the supervisor dies (even SIGKILLed the moment after a
fork) the child reads end-of-file, stops as on a first SIGTERM, and exits within
``stop_seconds`` whatever its jobs do (see :class:`ParentLink`).

The supervisor holds no database connection and no thread: it forks with nothing open.
"""

from __future__ import annotations

import enum
import gc
import logging
import math
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import connections

from ..conf import settings
from ..reconnect import backoff_delay
from ..signals import Abort, defer_stop, on_stop, stop_signals, take_deferred
from . import presence
from .limits import EXIT_TIME_LIMIT, replace_process
from .loop import Worker

logger = logging.getLogger(__name__)

#: A child that ran at least this long before dying resets the restart backoff.
HEALTHY_SECONDS = 30.0

#: After a second signal, how long aborting children get before they are SIGKILLed.
ABORT_SECONDS = 10.0


class ExitCode(enum.IntEnum):
    """What ``pgqueue_worker`` exit codes mean (one process or a supervisor)."""

    #: Stopped by a signal after draining, or ran out of work (``--burst``,
    #: ``--max-jobs``): every job it started was recorded.
    OK = 0
    #: Aborted by a second SIGTERM/SIGINT: jobs it was running are left to lease expiry
    #: and the sweeper.
    ABORTED = 1
    #: (One process) the worker stopped on its own on a fatal error, such as its
    #: heartbeat thread dying, or (``--burst``) a database that stayed unreachable;
    #: restart it. A supervisor restarts such a child itself.
    FATAL = 3
    #: (Supervisor) stopped by a signal, but at least one child did not drain cleanly
    #: (it died, aborted, or was SIGKILLed past ``stop_seconds``): its jobs go to
    #: lease expiry.
    UNCLEAN = 4


@dataclass
class Slot:
    """One of the N child positions: the current process in it and its history."""

    index: int
    pid: int | None = None
    started: float = 0.0
    failures: int = 0  # deaths in a row, each within HEALTHY_SECONDS of its start
    restart_at: float | None = None  # when a dead child's replacement is due
    finished: bool = False  # exited 0 on its own: not restarted
    restarts: int = 0  # replaced for a hard time limit


def describe_exit(code: int) -> str:
    """``exit code 3`` or ``killed by SIGKILL`` from ``os.waitstatus_to_exitcode``."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


@dataclass(frozen=True)
class ParentLink:
    """What a child knows of its supervisor: its pid, taken before the fork (never the
    child's own ``getppid()``, which is already init's if the supervisor died first),
    and the read end of a pipe whose write end only the supervisor holds: end-of-file
    on it means the supervisor is gone, however it died. ``stop_seconds``: how long the
    child may then drain on its own before it exits anyway."""

    pid: int
    fd: int
    stop_seconds: float

    def gone(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s; True once the supervisor is gone."""
        if os.getppid() != self.pid:
            return True
        readable, _, _ = select.select([self.fd], [], [], timeout)
        # Nothing is ever written to the pipe: readable means end-of-file.
        return bool(readable) and os.read(self.fd, 1) == b""


class Supervisor:
    """Runs ``processes`` children, each calling ``run_child(index, parent)`` in a fork.

    ``run_child`` returns the child's exit code; it runs with the supervisor's signal
    handling replaced by :func:`~django_pgqueue.signals.defer_stop` (a stop signal is
    remembered until the child installs its own two-signal shutdown), and is handed
    the :class:`ParentLink` to watch."""

    def __init__(
        self,
        *,
        processes: int,
        run_child: Callable[[int, ParentLink], int],
        healthy_seconds: float = HEALTHY_SECONDS,
        stop_seconds: float | None = None,
        burst: bool = False,
    ) -> None:
        if processes < 1:
            raise ValueError(f"processes must be at least 1, not {processes!r}")
        self.processes = processes
        self.run_child = run_child
        self.healthy_seconds = healthy_seconds
        self.stop_seconds = float(
            settings.SUPERVISOR_STOP_SECONDS if stop_seconds is None else stop_seconds
        )
        self.slots = [Slot(index=i) for i in range(1, processes + 1)]
        self.burst = burst
        self._gave_up = False  # (burst) a child exited FATAL: not restarted
        self._signals: list[int] = []
        self._died_while_stopping = False  # a child exited non-zero during the drain
        self._wake_r, self._wake_w = -1, -1
        self._alive_r, self._alive_w = -1, -1  # the ParentLink pipe

    # --- public ---------------------------------------------------------------------

    def run(self) -> ExitCode:
        """Start the children and look after them until they are all gone."""
        logger.info(
            "supervisor %d starting %d worker processes",
            os.getpid(),
            self.processes,
            extra={"action": "start"},
        )
        # Nothing of ours may be shared with the children.
        connections.close_all()
        self._wake_r, self._wake_w = os.pipe()
        self._alive_r, self._alive_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        previous_fd = signal.set_wakeup_fd(self._wake_w)
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (*stop_signals(), signal.SIGCHLD)
        }
        # Stop signals that came during start-up (the command's defer_stop) count now.
        self._signals.extend(take_deferred())
        try:
            return self._supervise()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            signal.set_wakeup_fd(previous_fd)
            for fd in (self._wake_r, self._wake_w, self._alive_r, self._alive_w):
                os.close(fd)

    # --- the loop -------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: object) -> None:
        # Only record it: the loop acts on it (the wake-up fd ends its select()).
        if signum != signal.SIGCHLD:
            self._signals.append(signum)

    def _supervise(self) -> ExitCode:
        for slot in self.slots:
            if not self._signals:  # asked to stop already: start nothing
                self._start(slot)
        stopping = 0  # stop signals seen so far
        kill_deadline = math.inf  # when children still running get SIGKILL
        killed = False
        while True:
            self._reap(stopping=bool(stopping))
            while len(self._signals) > stopping:
                signum = self._signals[stopping]
                stopping += 1
                self._forward(signum, first=stopping == 1)
                wait = self.stop_seconds if stopping == 1 else ABORT_SECONDS
                kill_deadline = min(kill_deadline, time.monotonic() + wait)
            alive = [s for s in self.slots if s.pid is not None]
            if not alive and (stopping or all(s.finished for s in self.slots)):
                break
            if time.monotonic() > kill_deadline and not killed:
                killed = True
                if stopping == 1:
                    logger.warning(
                        "%d worker process(es) still running %.0fs after the stop signal: "
                        "killing them (their jobs come back at lease expiry)",
                        len(alive),
                        self.stop_seconds,
                        extra={"action": "abort"},
                    )
                for slot in alive:
                    self._kill(slot, signal.SIGKILL)
            if not stopping:
                self._restart_due()
            self._sleep(self._next_timeout())
        if stopping >= 2:
            code = ExitCode.ABORTED
        elif stopping and self._died_while_stopping:
            code = ExitCode.UNCLEAN
        elif self._gave_up:
            code = ExitCode.FATAL
        else:
            code = ExitCode.OK
        logger.info(
            "supervisor %d exiting (%s)",
            os.getpid(),
            code.name.lower(),
            extra={"action": "exit"},
        )
        return code

    def _next_timeout(self) -> float:
        now = time.monotonic()
        due = [s.restart_at - now for s in self.slots if s.restart_at is not None]
        # A short cap: a missed SIGCHLD (two children dying at once) costs one second.
        return max(0.0, min([1.0, *due]))

    def _sleep(self, timeout: float) -> None:
        try:
            select.select([self._wake_r], [], [], timeout)
        except InterruptedError:  # pragma: no cover - PEP 475 retries select itself
            pass
        try:
            while os.read(self._wake_r, 512):
                pass
        except BlockingIOError:
            pass

    def _reap(self, *, stopping: bool) -> None:
        """Collect every child that exited; schedule restarts for those that died."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            slot = next((s for s in self.slots if s.pid == pid), None)
            if slot is None:
                continue  # not one of ours (a task may fork and exit, for instance)
            code = os.waitstatus_to_exitcode(status)
            slot.pid = None
            lived = time.monotonic() - slot.started
            if code == 0 and not stopping:
                slot.finished = True
                logger.info(
                    "worker process %d (pid %d) finished its work",
                    slot.index,
                    pid,
                    extra={"action": "child_exit"},
                )
                continue
            if code == ExitCode.FATAL and self.burst and not stopping:
                slot.finished = True
                self._gave_up = True
                logger.warning(
                    "worker process %d (pid %d) gave up (exit code 3); not restarted (--burst)",
                    slot.index,
                    pid,
                    extra={"action": "child_exit"},
                )
                continue
            if code == EXIT_TIME_LIMIT and not stopping:
                # Replaced for a job past its hard time limit: started again at once.
                slot.restart_at = time.monotonic()
                slot.restarts += 1
                logger.warning(
                    "worker process %d (pid %d) replaced (a job past its time limit, or "
                    "--max-memory)",
                    slot.index,
                    pid,
                    extra={"action": "child_replaced"},
                )
                continue
            if stopping:
                level = logging.INFO if code == 0 else logging.WARNING
                if code != 0:
                    self._died_while_stopping = True
                logger.log(
                    level,
                    "worker process %d (pid %d) stopped (%s)",
                    slot.index,
                    pid,
                    describe_exit(code),
                    extra={"action": "child_exit"},
                )
                continue
            slot.failures = 1 if lived >= self.healthy_seconds else slot.failures + 1
            delay = backoff_delay(slot.failures)
            slot.restart_at = time.monotonic() + delay
            logger.warning(
                "worker process %d (pid %d) died after %.1fs (%s); restarting in %.1fs",
                slot.index,
                pid,
                lived,
                describe_exit(code),
                delay,
                extra={"action": "child_died"},
            )

    def _restart_due(self) -> None:
        now = time.monotonic()
        for slot in self.slots:
            if slot.restart_at is not None and slot.restart_at <= now:
                slot.restart_at = None
                self._start(slot)

    def _forward(self, signum: int, *, first: bool) -> None:
        name = signal.Signals(signum).name
        if first:
            logger.info(
                "%s received: stopping %d worker processes (they finish their running "
                "jobs; again to abort)",
                name,
                sum(1 for s in self.slots if s.pid is not None),
                extra={"action": "stop"},
            )
        else:
            logger.warning(
                "%s received again: aborting the worker processes",
                name,
                extra={"action": "abort"},
            )
        for slot in self.slots:
            slot.restart_at = None  # nothing is started again once stopping
            if slot.pid is not None:
                self._kill(slot, signal.SIGTERM)
                # A stopped (SIGSTOPped) child would hold the signal pending for ever.
                self._kill(slot, signal.SIGCONT)

    def _kill(self, slot: Slot, signum: int) -> None:
        if slot.pid is None:
            return
        try:
            os.kill(slot.pid, signum)
        except ProcessLookupError:
            pass  # already gone; reaped on the next pass

    # --- children -------------------------------------------------------------------

    def _start(self, slot: Slot) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        parent = os.getpid()
        # Stop signals are blocked across the fork: CPython forgets in the child any
        # signal that arrives before its after-fork clean-up, so a SIGTERM forwarded
        # at once would be lost and the child never stop. Blocked, it stays pending in
        # the kernel until the child's own handlers are in place.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals())
        # The child's restart count, shown in the workers table (presence.restarts).
        os.environ[presence.RESTARTS_VARIABLE] = str(slot.restarts)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child (the tests see it from outside)
            os._exit(self._child(slot.index, parent, mask))
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        slot.pid = pid
        slot.started = time.monotonic()
        logger.info(
            "worker process %d started (pid %d)",
            slot.index,
            pid,
            extra={"action": "child_start"},
        )

    def _child(
        self, index: int, parent: int, mask: set[int | signal.Signals]
    ) -> int:  # pragma: no cover
        code = int(ExitCode.FATAL)
        try:
            # First: while this child holds the write end, the supervisor's death
            # would not show as end-of-file on the pipe.
            os.close(self._alive_w)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.setpgid(0, 0)  # a terminal's Ctrl-C goes to the supervisor only
            signal.set_wakeup_fd(-1)
            os.close(self._wake_r)
            os.close(self._wake_w)
            # Stop signals are remembered, not fatal, until on_stop; one sent since the
            # fork was held pending (see _start) and arrives with the unblock. Those the
            # supervisor recorded itself it forwards, so none is inherited from its list.
            defer_stop()
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            link = ParentLink(pid=parent, fd=self._alive_r, stop_seconds=self.stop_seconds)
            code = self.run_child(index, link)
        except Abort:
            code = int(ExitCode.ABORTED)
        except BaseException:
            logger.exception("worker process %d failed", index, extra={"action": "fatal"})
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
        return code


def watch_parent(stop: Callable[[], None], parent: ParentLink) -> threading.Thread:
    """Call ``stop()`` once the supervisor is gone; if this process is still running
    ``parent.stop_seconds`` later (nobody is left to SIGKILL it), exit it: its running
    jobs then come back at lease expiry."""

    def watch() -> None:
        while not parent.gone(1.0):
            pass
        logger.warning(
            "the supervisor (pid %d) is gone: stopping (within %.0fs)",
            parent.pid,
            parent.stop_seconds,
            extra={"action": "stop"},
        )
        stop()
        time.sleep(parent.stop_seconds)
        logger.error(
            "still running %.0fs after the supervisor died: exiting (running jobs come "
            "back at lease expiry)",
            parent.stop_seconds,
            extra={"action": "abort"},
        )
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(ExitCode.ABORTED))

    thread = threading.Thread(target=watch, name="pgqueue-parent-watch", daemon=True)
    thread.start()
    return thread


#: The worker process's threshold of the collector's youngest generation (Python's
#: default: 700). Each job allocates a few dozen objects that live until its completion
#: is written, so the jobs in flight cross 700 again and again: with 700, a drain of
#: 20,000 no-op jobs ran about 200 young collections (and 20 of the middle generation),
#: with 7,000 about 6, for about 2 us less CPU per job. The objects are freed by their
#: reference counts either way; only reference cycles wait longer to be collected.
YOUNG_GC_THRESHOLD = 7000


def young_collections() -> None:
    """Raise the collector's youngest threshold to ``YOUNG_GC_THRESHOLD`` (never lower
    one the project set higher, nor turn on a collector turned off with 0)."""
    young, *older = gc.get_threshold()
    if young and young < YOUNG_GC_THRESHOLD:
        gc.set_threshold(YOUNG_GC_THRESHOLD, *older)


def run_worker_process(
    worker_options: dict[str, Any], index: int | None, parent: ParentLink | None = None
) -> int:
    """Run one Worker with the two-signal shutdown; return its exit code.

    ``index`` is the child's position under a supervisor (None: the only process); a
    given worker id then gets ``:<index>`` appended so that every child's is its own.
    ``parent``: the supervisor to watch (the worker stops once it is gone)."""
    options = dict(worker_options)
    if index is not None and options.get("worker_id"):
        options["worker_id"] = f"{options['worker_id']}:{index}"
    # A job past its hard time limit replaces the process: a supervisor's child exits
    # (and is started again), the only process re-executes itself.
    options.setdefault("on_time_limit", "exec" if index is None else "exit")
    worker = Worker(**options)
    if parent is not None:
        watch_parent(worker.stop, parent)
    # What start-up made (Django, the apps, the worker) lives as long as the process:
    # out of the collector's generations, the full collections that a drain's
    # allocations set off no longer walk all of it, every time (see gc.freeze).
    gc.freeze()
    young_collections()
    try:
        with on_stop(worker.stop):
            worker.run()
    except Abort:
        # Second signal: leave at once; the sweeper recovers what was running.
        return int(ExitCode.ABORTED)
    if worker.fatal:
        sys.stderr.write(f"pgqueue_worker: {worker.fatal}\n")
        return int(ExitCode.FATAL)
    if worker.recycle:  # over --max-memory, drained: replaced as for a time limit
        replace_process(options["on_time_limit"])
    return int(ExitCode.OK)
