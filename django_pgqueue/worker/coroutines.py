"""The event loop thread: one worker's coroutine jobs, side by side.

A job whose task is an ``async def`` (and not transactional) runs here rather than on
a thread slot: each is an ``asyncio`` task on the worker's one event loop, up to
``capacity`` at once (``--async-concurrency``, ``PGQUEUE_ASYNC_CONCURRENCY``), fed by
the same claim loop as the threads (``loop.py`` routes each claimed job by its task's
kind). The job keeps its held entry (the heartbeat extends its lease from its own
thread) and its outcome is written fenced as any job's. Besides:

* ``current_job()`` is a context variable: each job's asyncio task has its own context,
  so each coroutine sees its own job, and so do the sync calls it makes through
  ``sync_to_async``, which carry the context over;
* a cancellation (the listener's NOTIFY, or the heartbeat's fallback) cancels the job's
  coroutine at its current ``await`` (``asyncio.CancelledError``), through the job's
  cancel flag's callback: nothing polls;
* a run past its timeout (``@task(timeout=...)``, ``PGQUEUE_JOB_TIMEOUT_SECONDS``) is
  cancelled and its attempt fails with :class:`~django_pgqueue.exceptions.JobTimeout`
  (retried with backoff); one that ignores the cancellation for another lease is
  abandoned, nothing recorded, its lease left to expire (the heartbeat stopped
  extending it at the timeout);
* ``SystemExit`` and ``KeyboardInterrupt`` raised by a coroutine (a library calling
  ``sys.exit()``) are its job's failure, as in a plain task (``runner.contained``):
  asyncio would re-raise them out of the loop, ending the loop thread;
* blocking work never runs on the loop. The worker's own writes for a coroutine job (a
  failure, a snooze, a release, a cancelled outcome) and ``task_started``'s receivers,
  as well as the job's own thread-sensitive ``sync_to_async`` calls (Django's async
  ORM, ``aset_progress``), run on one of ``threads`` *lanes*
  (``PGQUEUE_ASYNC_THREADS``): a thread with its own database connection, shared by
  many jobs (each job keeps one lane, given round robin; asgiref's
  ``ThreadSensitiveContext`` routes its calls there). So 1,000 jobs in flight hold at
  most ``threads`` connections, not 1,000. A successful job that made no such call
  goes to the completer without leaving the loop. ``sync_to_async(...,
  thread_sensitive=False)`` and ``asyncio.to_thread`` run on the loop's default
  executor, of the same size, whose connections the worker does not watch;
* after a job that called into its lane, the lane's connections are checked as a
  runner thread's are (``connections.session_leftovers``): an open transaction or
  session state left fails the job with ``TransactionLeak``, and the connection is
  discarded. Jobs share a lane, so what one leaves is found by the next check on that
  lane, which may be another job's;
* a coroutine that blocks the loop (``time.sleep``, a blocking client) is seen by a
  watchdog thread (:meth:`EventLoop.watch`), which logs the job and the line it is
  blocked at once the loop has not run for ``BLOCKED_SECONDS``, and again when it runs
  again; the heartbeat, on its own thread, goes on extending every lease meanwhile;
* at shutdown, jobs not started yet are released (attempt not charged), running ones
  may finish within the grace period, and those still running after it are cancelled
  and left to lease expiry, nothing recorded.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import queue
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any, TypeVar

from asgiref.sync import SyncToAsync, ThreadSensitiveContext, sync_to_async
from django.db import connections

from .. import tracing, validation
from ..conf import settings
from ..exceptions import JobTimeout, SoftTimeLimitExceeded
from ..models import Job
from ..taskapi import task_started
from ..tasks import _current
from .catalog import Known
from .connections import watch_lane
from .limits import soft_limit
from .runner import Begun, Exited, JobRunner, Refusal, arguments, contained
from .state import WorkerPart, WorkerState

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: How long the loop may go without running before the watchdog logs it (seconds).
BLOCKED_SECONDS = 0.5
#: How often the loop marks that it runs, and the watchdog looks (seconds).
TICK_SECONDS = 0.1


class Lane(ThreadSensitiveContext):
    """A key for asgiref's thread-sensitive calls: those made from a job given this
    lane run on its :class:`LaneExecutor`."""


class DaemonExecutor(Executor):
    """Up to ``workers`` daemon threads, started as work comes. ``ThreadPoolExecutor``'s
    threads are joined when the interpreter exits, so one stuck in a task's call (a
    query that hangs, a coroutine job abandoned at the end of the grace period) would
    keep a stopped worker from ever exiting; these are left behind instead, as a runner
    thread is."""

    def __init__(
        self,
        workers: int,
        name: str,
        initializer: Callable[..., object] | None = None,
        initargs: tuple[Any, ...] = (),
    ) -> None:
        self._workers = workers
        self._name = name
        self._initializer = initializer
        self._initargs = initargs
        self._work: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = (
            queue.SimpleQueue()
        )
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._shut = False
        #: Calls running now (read without the lock: a snapshot).
        self.busy = 0

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            if self._shut:
                raise RuntimeError("cannot schedule new futures after shutdown")
            if len(self._threads) < self._workers:
                thread = threading.Thread(
                    target=self._serve, name=f"{self._name}-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
            self._work.put((future, functools.partial(fn, *args, **kwargs)))
        return future

    def _serve(self) -> None:
        if self._initializer is not None:
            self._initializer(*self._initargs)
        while True:
            item = self._work.get()
            if item is None:
                return
            future, call = item
            if not future.set_running_or_notify_cancel():
                continue
            with self._lock:
                self.busy += 1
            try:
                result = call()
            except BaseException as exc:  # noqa: BLE001 - handed to whoever awaits it
                future.set_exception(exc)
            else:
                future.set_result(result)
            finally:
                with self._lock:
                    self.busy -= 1

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shut = True
            threads = list(self._threads)
        for _ in threads:
            self._work.put(None)
        if wait:
            for thread in threads:
                thread.join()


class LaneExecutor(DaemonExecutor):
    """One thread, and its database connections, shared by the coroutine jobs of its
    lane. Each call submitted is counted on the job that submits it (its
    ``RunningJob``), so that the job's end knows whether to check the lane."""

    def __init__(self, name: str, worker_id: str) -> None:
        super().__init__(1, name, initializer=watch_lane, initargs=(worker_id,))

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        running = _current.get()
        if running is not None:
            running.lane_calls += 1
        return super().submit(fn, *args, **kwargs)


class Abandoned(Exception):  # noqa: N818 - names the event
    """A coroutine that ignored its cancellation at its timeout: nothing is recorded."""


class EventLoop(WorkerPart):
    """Runs coroutine jobs on one event loop thread (:meth:`run`); the claim loop hands
    them over with :meth:`submit`. A watchdog thread (:meth:`watch`) reports a blocked
    loop. Shutdown: :meth:`stop`, :meth:`drain`, :meth:`close`."""

    def __init__(
        self,
        state: WorkerState,
        *,
        runner: JobRunner,
        capacity: int,
        threads: int,
        ran: Callable[[float], None] | None = None,
    ) -> None:
        super().__init__(state)
        self.runner = runner
        self.capacity = capacity
        self.threads = threads
        #: Told each job's run time (the claim sizer's mean: claimer.py).
        self._ran = ran
        self._lanes = [Lane() for _ in range(threads)]
        self._executors = [
            LaneExecutor(f"pgqueue-lane-{i}", self.worker_id) for i in range(threads)
        ]
        self._next_lane = itertools.cycle(self._lanes)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread_id: int | None = None
        self._ready = threading.Event()
        self._stopping = threading.Event()  # (any thread) no more jobs start
        self._drained = threading.Event()  # stopping, and no job left
        self._closing = threading.Event()  # (any thread) end the loop
        self._closed = threading.Event()
        self._finish: asyncio.Event | None = None
        # Loop thread only:
        self._waiting: deque[tuple[Job, Known]] = deque()  # held, no slot yet
        self._tasks: set[asyncio.Task[Any]] = set()  # one per job started or releasing
        self._started = 0  # jobs holding a slot
        #: The job of each asyncio task running one (its wrapper, its coroutine), for
        #: the watchdog's message (read from its thread) and the abandoning.
        self._jobs: dict[asyncio.Task[Any], Job] = {}
        self._abandon = False
        #: When the loop last ran (time.monotonic()), for the watchdog.
        self.ticked = time.monotonic()

    # --- other threads' side --------------------------------------------------------

    def submit(self, jobs: Iterable[tuple[Job, Known]]) -> None:
        """Run these held jobs on the loop, each once a slot is free (one wake-up)."""
        batch = list(jobs)
        if not batch:
            return
        self._ready.wait()
        if self._closed.is_set():  # the loop thread died: the claim loop stops next
            self.state.forget(job for job, _ in batch)  # (their leases expire)
            return
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._start_many, batch)

    def stop(self) -> None:
        """Start no more jobs: those waiting for a slot are released."""
        self._stopping.set()
        if self._ready.is_set() and not self._closed.is_set():
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._release_waiting)

    def drain(self, timeout: float | None) -> int:
        """After :meth:`stop`: wait up to ``timeout`` seconds (None: for ever) for the
        running jobs; cancel those still running then, recording nothing (their
        leases expire). Return how many were cancelled."""
        if self._thread_id is None or self._closed.is_set():
            return 0
        self._ready.wait()
        if self._closed.is_set():
            return 0
        if self._drained.wait(timeout):
            return 0
        assert self._loop is not None
        left = self._started
        self._abandon = True
        self._loop.call_soon_threadsafe(self._cancel_all)
        self._drained.wait(5.0)
        return left

    def close(self, timeout: float = 15.0) -> None:
        """End the loop thread (after :meth:`drain`); the lanes close their
        connections on their own threads. Waits up to ``timeout`` for it."""
        self._closing.set()
        if self._thread_id is None:
            return  # never ran
        if self._ready.is_set() and not self._closed.is_set():
            assert self._loop is not None and self._finish is not None
            self._loop.call_soon_threadsafe(self._finish.set)
        self._closed.wait(timeout)

    @property
    def in_flight(self) -> int:
        """Coroutine jobs started or waiting for a slot (a snapshot, any thread)."""
        return self._started + len(self._waiting)

    @property
    def waiting(self) -> int:
        """Coroutine jobs held, waiting for a slot (a snapshot, any thread)."""
        return len(self._waiting)

    # --- the loop thread --------------------------------------------------------------

    def run(self) -> None:
        """The loop thread's body."""
        self._thread_id = threading.get_ident()
        loop: asyncio.AbstractEventLoop | None = None
        # asyncio's own executor (``to_thread``, ``thread_sensitive=False``), bounded.
        pool = ThreadPoolExecutor(self.threads, thread_name_prefix="pgqueue-async-pool")
        try:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            loop.set_default_executor(pool)
            for lane, executor in zip(self._lanes, self._executors, strict=True):
                SyncToAsync.context_to_thread_executor[lane] = executor
            self._loop = loop
            loop.run_until_complete(self._main())
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
            self._close_lanes()
            if loop is not None:
                asyncio.set_event_loop(None)
                loop.close()
            # Also when it failed before it was ready: nobody waits for it for ever.
            self._closed.set()
            self._drained.set()
            self._ready.set()

    async def _main(self) -> None:
        self._finish = asyncio.Event()
        self._tick()
        self._ready.set()
        # Asked before the loop was ready (stop() and close() only schedule once it is):
        if self._stopping.is_set():
            self._release_waiting()
        if self._closing.is_set():
            self._finish.set()
        await self._finish.wait()

    def _tick(self) -> None:
        self.ticked = time.monotonic()
        assert self._loop is not None
        self._loop.call_later(TICK_SECONDS, self._tick)

    def _start_many(self, batch: list[tuple[Job, Known]]) -> None:
        if self._stopping.is_set():
            for job, _ in batch:
                self._spawn(self._release(job), job)
            return
        for job, known in batch:
            if self._started < self.capacity:
                self._started += 1
                self._spawn(self._job(job, known), job)
            else:
                self._waiting.append((job, known))

    def _spawn(self, coroutine: Any, job: Job) -> None:
        assert self._loop is not None
        # Its lane: where its thread-sensitive calls run (ours, and its own).
        token = SyncToAsync.thread_sensitive_context.set(next(self._next_lane))
        try:
            task = self._loop.create_task(coroutine)  # (copies the context: the lane)
        finally:
            SyncToAsync.thread_sensitive_context.reset(token)
        self._tasks.add(task)
        self._jobs[task] = job
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        self._jobs.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            logger.error(
                "worker %s: internal error running a coroutine job; its lease will expire",
                self.worker_id,
                exc_info=task.exception(),
                extra={"action": "error", "worker_id": self.worker_id},
            )
        if self._stopping.is_set() and not self._tasks:
            self._drained.set()

    def _slot_freed(self) -> None:
        """A started job ended: start the next waiting one."""
        self._started -= 1
        if self._waiting and not self._stopping.is_set():
            job, known = self._waiting.popleft()
            self._started += 1
            self._spawn(self._job(job, known), job)

    def _release_waiting(self) -> None:
        while self._waiting:
            job, _ = self._waiting.popleft()
            self._spawn(self._release(job), job)
        if not self._tasks:
            self._drained.set()

    def _cancel_all(self) -> None:
        for task in list(self._jobs):
            task.cancel()
        if not self._tasks:
            self._drained.set()

    def _close_lanes(self) -> None:
        """Close each lane's connections on its own thread, then end the threads. A
        lane still in a call (of a job abandoned at the end of the grace period) is
        left behind with its connection: the process's exit closes it."""
        for executor in self._executors:
            if not executor.busy:
                try:
                    executor.submit(connections.close_all).result(10)
                except Exception:  # noqa: BLE001, S110 - closing: nothing more to do
                    pass
            executor.shutdown(wait=False)

    # --- one job ----------------------------------------------------------------------

    async def _release(self, job: Job) -> None:
        """Give back a job that never got a slot (shutdown)."""
        try:
            await sync_to_async(self.runner.release)(job)
        finally:
            self.state.forget([job])

    async def _job(self, job: Job, known: Known) -> None:
        """Run one held job that has a slot, and free both afterwards."""
        handed_off = False
        try:
            handed_off = await self._run(job, known)
        except Abandoned:
            pass  # logged; its lease expires
        except asyncio.CancelledError:
            if not self._abandon:
                raise
            logger.warning(
                "job %s %s still running after the grace period; cancelled, nothing "
                "recorded (its lease will expire)",
                job.id,
                job.task,
                extra={"action": "exit", "job_id": job.id, "worker_id": self.worker_id},
            )
        finally:
            if handed_off:  # the completer forgets it once written
                self.state.slot_freed()
            else:
                self.state.forget([job])
            self._slot_freed()

    async def _run(self, job: Job, known: Known) -> bool:
        """``JobRunner.execute`` for a coroutine job: True if it went to the completer."""
        runner = self.runner
        begun = runner.begin(job, known, None)
        if isinstance(begun, Refusal):
            await sync_to_async(runner.refuse)(job, begun)
            return False
        if begun.started_wanted:
            await sync_to_async(runner.reporter.signal)(task_started, begun.task_result)
        running = begun.running
        _current.set(running)  # in this task's context, and so its coroutine's
        started = time.perf_counter()
        failure: BaseException | None = None
        value: object = None
        text = "null"
        with tracing.job_span(job):
            try:
                value, text = await self._call(job, begun)
            except Abandoned:
                raise
            except asyncio.CancelledError as exc:
                if self._abandon:  # shutdown past the grace period: record nothing
                    raise
                failure = exc  # the job's own cancellation
            except BaseException as exc:  # noqa: BLE001 - the job's own failure
                failure = exc
            if running.lane_calls:
                # The job called into its lane: check what it left on the lane's
                # connections before anything is recorded (a leak fails the job).
                leak = await sync_to_async(runner.lane_leftovers)()
                if leak is not None and failure is None:
                    failure = leak
            elapsed = time.perf_counter() - started
            if self._ran is not None:
                self._ran(elapsed)
            if failure is not None:
                await sync_to_async(runner.failed)(job, begun, failure, elapsed)
                return False
            if begun.held.cancel.is_set():  # written now, as cancelled: on the lane
                return await sync_to_async(runner.succeeded)(
                    job, begun, value, text, elapsed, inline=False
                )
            return runner.succeeded(job, begun, value, text, elapsed, inline=False)

    async def _call(self, job: Job, begun: Begun) -> tuple[object, str]:
        """Await the job's coroutine as a task of its own; cancel it when the job's
        cancellation is requested or its timeout passes. Its value, JSON-checked."""
        loop = asyncio.get_running_loop()
        task = begun.known.task
        limit = begun.known.timeout
        if limit is None:
            limit = settings.JOB_TIMEOUT_SECONDS
        soft = soft_limit(job, begun.known.soft_time_limit)
        if limit is None and soft is None:
            return await self._call_here(job, begun)
        inner: asyncio.Task[Any] = loop.create_task(
            contained(task.func(*arguments(job, task, begun.task_result), **job.kwargs))
        )
        self._jobs[inner] = job
        try:

            def cancel() -> None:  # on the thread that sets the flag
                try:
                    loop.call_soon_threadsafe(inner.cancel)
                except RuntimeError:  # the loop is closed: the job is long over
                    pass

            begun.held.cancel.on_set(cancel)
            if soft is not None and (limit is None or soft < limit):
                await asyncio.wait({inner}, timeout=soft)
                if not inner.done():
                    # Cancelled at its soft limit: it may clean up; if the cancellation
                    # ends it, the attempt fails with SoftTimeLimitExceeded.
                    inner.cancel(f"soft time limit of {soft:g}s")
                    await asyncio.wait({inner}, timeout=None if limit is None else limit - soft)
                    if inner.cancelled():
                        raise SoftTimeLimitExceeded(
                            f"the coroutine ran past its soft time limit of {soft:g}s "
                            "and was cancelled"
                        )
            await asyncio.wait({inner}, timeout=limit)
            if not inner.done():
                assert limit is not None
                await self._stop_late(job, inner, float(limit))
            value = inner.result()
            if isinstance(value, Exited):
                raise value.exc  # the job's failure (here, within this task: caught)
            return validation.returned(value)
        finally:
            self._jobs.pop(inner, None)

    async def _call_here(self, job: Job, begun: Begun) -> tuple[object, str]:
        """:meth:`_call` for a job with neither a timeout nor a soft time limit: its
        coroutine awaited within this job's own asyncio task, not as a task of its own
        watched by ``asyncio.wait`` (which cost the loop thread a task, a future and
        their callbacks per job, a fifth of its time with jobs of a millisecond). A
        cancellation of the job cancels this task while the coroutine runs, and only
        then: the coroutine sees it at its current ``await``, as it would in a task of
        its own, and this task's cancel request is withdrawn once the coroutine ended
        (``uncancel``), so that recording its outcome is never interrupted."""
        loop = asyncio.get_running_loop()
        here = asyncio.current_task()
        assert here is not None
        running = [True]  # (read and cleared on the loop thread only)
        cancelled = [0]  # the job's own cancellations of this task

        def cancel_here() -> None:  # on the loop thread
            if running[0]:
                cancelled[0] += 1
                here.cancel()

        def cancel() -> None:  # on the thread that sets the flag
            try:
                loop.call_soon_threadsafe(cancel_here)
            except RuntimeError:  # the loop is closed: the job is long over
                pass

        begun.held.cancel.on_set(cancel)
        task = begun.known.task
        try:
            value = await contained(
                task.func(*arguments(job, task, begun.task_result), **job.kwargs)
            )
        finally:
            running[0] = False
            for _ in range(cancelled[0]):
                here.uncancel()
            if self._abandon or here.cancelling():
                # Cancelled by the shutdown past its grace period (or by anything but
                # the job's own cancellation): nothing is recorded, whatever the
                # coroutine made of it (its lease expires), as when it ran in a task of
                # its own that was left behind.
                raise asyncio.CancelledError
        if isinstance(value, Exited):
            raise value.exc  # the job's failure (here, within this task: caught)
        return validation.returned(value)

    async def _stop_late(self, job: Job, inner: asyncio.Task[Any], limit: float) -> None:
        """Cancel a job past its timeout, then raise ``JobTimeout`` once it stopped,
        or ``Abandoned`` if it ignores the cancellation for another lease."""
        inner.cancel()
        await asyncio.wait({inner}, timeout=self.lease_seconds)
        if not inner.done():
            logger.error(
                "job %s %s ignored its cancellation at its %gs timeout; abandoned, "
                "nothing recorded (its lease expires)",
                job.id,
                job.task,
                limit,
                extra={"action": "timeout", "job_id": job.id, "worker_id": self.worker_id},
            )
            raise Abandoned
        if not inner.cancelled():
            inner.exception()  # (retrieved: whatever it raised or returned, it timed out)
        raise JobTimeout(f"the coroutine ran past its timeout of {limit:g}s and was cancelled")

    # --- the watchdog thread ----------------------------------------------------------

    def watch(self) -> None:
        """The watchdog thread's body: log a loop that stopped running (a coroutine
        blocking it), naming the job and where it blocks, and when it runs again."""
        self._ready.wait()
        blocked_since: float | None = None
        while not self._closed.wait(TICK_SECONDS):
            ticked = self.ticked
            late = time.monotonic() - ticked - TICK_SECONDS
            if blocked_since is None and late > BLOCKED_SECONDS:
                blocked_since = ticked
                self._report_blocked(late + TICK_SECONDS)
            elif blocked_since is not None and ticked > blocked_since:
                logger.warning(
                    "worker %s: event loop ran again after %.1fs blocked",
                    self.worker_id,
                    ticked - blocked_since - TICK_SECONDS,
                    extra={"action": "loop_blocked", "worker_id": self.worker_id},
                )
                blocked_since = None

    def _report_blocked(self, seconds: float) -> None:
        """Log the blocked loop: the job whose coroutine runs, and its line."""
        assert self._loop is not None
        current = asyncio.current_task(self._loop)  # (read across threads: a snapshot)
        job = self._jobs.get(current) if current is not None else None
        where = ""
        frame = sys._current_frames().get(self._thread_id or 0)
        if frame is not None:
            last = traceback.extract_stack(frame, limit=1)[-1]
            where = f" (at {last.filename}:{last.lineno} in {last.name})"
        logger.warning(
            "worker %s: event loop blocked for %.1fs by %s%s: a coroutine task must not "
            "call blocking code (time.sleep, a blocking client, the ORM without "
            "sync_to_async); the other coroutine jobs wait meanwhile, their leases are "
            "still extended",
            self.worker_id,
            seconds,
            f"job {job.id} {job.task}" if job is not None else "a coroutine",
            where,
            extra={
                "action": "loop_blocked",
                "job_id": None if job is None else job.id,
                "worker_id": self.worker_id,
            },
        )
