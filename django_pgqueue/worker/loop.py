"""The worker: claim -> run -> complete or fail, with leases kept alive by a heartbeat.

Threads of one worker process, each on its own database connection:

* the main thread (here) claims jobs, one statement per batch, while there are free
  slots, and otherwise waits to be woken: by a NOTIFY, by a slot freeing, or by the
  poll interval running out (polling, not NOTIFY, is what guarantees pickup);
* ``concurrency`` runner threads (here) take claimed jobs from a local queue and run
  them with :class:`~django_pgqueue.worker.runner.JobRunner`, which records failures and
  transactional completions fenced on (owner, attempt);
* an event loop thread (``coroutines.py``) runs the jobs of coroutine tasks, up to
  ``async_concurrency`` side by side, with its lane threads for their blocking calls
  and a watchdog thread that reports a blocked loop; the claim loop routes each
  claimed job to a thread slot or to the loop by its task's kind, and sizes its claims
  so that either kind fits the free slots of its side (``claimer.py``);
* a completer thread (``completer.py``) records the runners' successful ordinary jobs
  in batches, one fenced statement per batch;
* a heartbeat thread (``heartbeat.py``) extends the leases of jobs this worker holds
  (including finished ones waiting for the completer);
  while it fails, the main thread claims nothing;
* a listener thread (``listener.py``) holds a LISTEN connection and sets the wake-up
  flag.

They share the table of held jobs (:class:`Held`, under one lock) and a few events;
``connections.py`` holds their connection helpers. Each connection is labelled
``pgqueue <role> <worker id>`` in ``pg_stat_activity.application_name`` (roles: claim,
heartbeat, runner, completer, listen).
"""

from __future__ import annotations

import logging
import os
import queue
import random
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterable

from django.db import DatabaseError, connections

from .. import flow, sweeper
from ..conf import settings
from ..databases import backend_database, listen_target
from ..exceptions import NotMigrated, first_line
from ..models import Job
from ..reconnect import Retry, close_connection
from ..signals import Abort, replaced_abort
from ..taskapi import DEFAULT_TASK_BACKEND_ALIAS, task_backends
from . import presence
from .catalog import Catalog, Known
from .claimer import ClaimSizer
from .completer import Completer
from .connections import bounded, recycle_connections
from .coroutines import EventLoop
from .heartbeat import Heartbeat
from .limits import HardLimits, rss_mb
from .listener import Listener
from .outcomes import Reporter
from .position import ClaimPosition
from .runner import JobRunner
from .state import WorkerState, WorkerStats

logger = logging.getLogger(__name__)


def describe_database(alias: str) -> str:
    """``'default' (name on host:port)``: which database a log line is about."""
    params = connections[alias].settings_dict
    host = params.get("HOST") or (params.get("OPTIONS") or {}).get("host") or "local socket"
    port = params.get("PORT") or (params.get("OPTIONS") or {}).get("port") or ""
    return f"{alias!r} ({params.get('NAME')} on {host}{':' if port else ''}{port})"


def default_worker_id() -> str:
    """host:pid:random, unique per process start, readable in the admin and logs."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Worker:
    """Runs jobs from the given queues until stopped (or until idle, with ``burst``)."""

    def __init__(
        self,
        *,
        queues: Iterable[str] | None = None,
        concurrency: int = 1,
        batch_size: int | None = None,
        lease_seconds: float | None = None,
        burst: bool = False,
        max_jobs: int | None = None,
        worker_id: str | None = None,
        poll_interval: float | None = None,
        grace_seconds: float | None = None,
        backend: str | None = None,
        async_concurrency: int | None = None,
        on_time_limit: str = "stop",
        max_memory: int | None = None,
    ) -> None:
        self.queues = sorted(set(queues)) if queues else None
        self.concurrency = concurrency
        #: Coroutine jobs run side by side on the event loop (0: none; coroutine tasks
        #: then run on the thread slots, one at a time each).
        self.async_concurrency = int(
            settings.ASYNC_CONCURRENCY if async_concurrency is None else async_concurrency
        )
        self.batch_size = batch_size or concurrency
        #: How many jobs each claim takes (see claimer.py).
        self._sizer = ClaimSizer(
            concurrency=concurrency,
            batch_size=self.batch_size,
            async_concurrency=self.async_concurrency,
            prefetch_short=batch_size is None,
        )
        self.lease_seconds = float(lease_seconds or settings.LEASE_SECONDS)
        self.burst = burst
        self.max_jobs = max_jobs
        #: ``--max-memory``: MB of resident memory over which the worker stops claiming
        #: and, once drained, asks to be replaced (:attr:`recycle`).
        self.max_memory = max_memory
        #: Set when the worker stopped to be recycled (its memory was over max_memory).
        self.recycle = False
        self._memory_checked = 0.0
        self.worker_id = worker_id or default_worker_id()
        self.poll_interval = float(poll_interval or settings.POLL_INTERVAL)
        self.grace_seconds = (
            settings.SHUTDOWN_GRACE_SECONDS if grace_seconds is None else grace_seconds
        )
        #: How the process is replaced once a hard time limit is passed
        #: (``limits.REPLACE_MODES``).
        self.on_time_limit = on_time_limit
        #: The ``TASKS`` alias whose jobs database this worker works (None: default).
        self.backend = backend
        self.alias = backend_database(backend)
        served = task_backends[backend or DEFAULT_TASK_BACKEND_ALIAS]
        options = served.options
        self.listen = listen_target(self.alias, options)
        state = WorkerState(
            alias=self.alias, worker_id=self.worker_id, lease_seconds=self.lease_seconds
        )
        self.stats = state.stats
        #: Why the worker stopped on its own (None: it was asked to, or ran out of work).
        self.fatal: str | None = None

        self._stopping = threading.Event()  # no more claiming
        self._state = state
        # Claimed jobs for the runner threads: SimpleQueue, C code with no Condition,
        # costs a fraction of Queue's put and get (one of each per job).
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._build_parts(state, served)
        self._build_claiming(state)
        self._build_threads()

    def _build_parts(self, state: WorkerState, served: object) -> None:
        """The parts that run jobs, each built once from the parts it uses (no cycle).
        Signals are sent by the backend class, as its enqueue() sends task_enqueued."""
        reporter = Reporter(sender=type(served), worker_id=self.worker_id)
        self._completer = Completer(
            state,
            reporter=reporter,
            interval=float(settings.COMPLETION_FLUSH_INTERVAL),
            max_batch=max(1, int(settings.COMPLETION_BATCH_SIZE)),
        )
        self._catalog = Catalog()
        self._runner = JobRunner(
            state, reporter=reporter, completer=self._completer, catalog=self._catalog
        )
        self._heartbeat = Heartbeat(state)
        #: Enforces the hard time limits.
        self._hard_limits = HardLimits(
            state, replace=self.on_time_limit, stop=self.stop, flush=self._completer.hurry
        )
        self._coroutines = (
            EventLoop(
                state,
                runner=self._runner,
                capacity=self.async_concurrency,
                threads=int(settings.ASYNC_THREADS),
                ran=self._sizer.ran_coroutine,
            )
            if self.async_concurrency
            else None
        )

    def _build_claiming(self, state: WorkerState) -> None:
        """What the claim loop reads: flow control, wake-ups, claim positions."""
        #: Flow control in force (limits, paused and fair queues): loaded on the claim
        #: thread about once a second, and at once when the listener hears of a change.
        self._flow = flow.FlowState(self.alias)
        flow.settings_view()  # a bad PGQUEUE_LIMITS fails here, before any thread starts
        #: Per queue, where the next flow claim's walk over keys resumes.
        self._cursors: dict[str, str] = {}
        # No listener (and no LISTEN connection) when the worker only polls.
        self._listener = (
            None
            if self.listen.params is None
            else Listener(
                state,
                queues=self.queues,
                params=self.listen.params,
                flow_changed=self._flow.changed,
            )
        )
        # Where each claim resumes (a worker of some queues: per queue); see position.py.
        self._position = ClaimPosition(
            float(settings.CLAIM_RESCAN_SECONDS), by_queue=self.queues is not None
        )
        # Where each claim from the head of the line under flow control resumes (a
        # worker of every queue only).
        self._flow_position = ClaimPosition(float(settings.CLAIM_RESCAN_SECONDS))
        #: Whether the last claim under limits walked the keys (the next starts so).
        self._flow_walk = False
        #: The paths of the tasks this worker runs on its loop, and on its threads, as
        #: met in its claims: a claim by kind counts their jobs against each side's room
        #: (a task met in neither against both; claimer.py).
        self._loop_paths: set[str] = set()
        self._thread_paths: set[str] = set()
        #: The next claim's most plain and coroutine jobs, when it is a claim by kind
        #: (None: one limit, whatever the kinds); set by _wanted.
        self._kinds: tuple[int, int] | None = None
        #: Whether the flow control in force applied to the last claim (a claim by kind
        #: is made only without it).
        self._flowing = False
        #: Whether the last claim took fewer jobs than there was room for because the
        #: line held no more (then wait for new work, not for freed slots).
        self._drained = False
        #: Whether the last claim, by kind, passed over jobs of a side that was full.
        self._passed_over = False

    def _build_threads(self) -> None:
        """The threads of the parts, held by handle (started by run())."""
        self._heartbeat_thread = self._thread(self._heartbeat.run, "heartbeat")
        self._listener_thread = (
            None if self._listener is None else self._thread(self._listener.run, "listener")
        )
        self._completer_thread = self._thread(self._completer.run, "completer")
        self._limits_thread = self._thread(self._hard_limits.run, "time-limits")
        self._runner_threads = [
            self._thread(self._runner_thread, f"runner-{i}") for i in range(self.concurrency)
        ]
        self._loop_threads = (
            []
            if self._coroutines is None
            else [
                self._thread(self._coroutines.run, "loop"),
                self._thread(self._coroutines.watch, "loop-watchdog"),
            ]
        )

    # --- public ---------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming; running jobs finish, unstarted ones are released."""
        self._stopping.set()
        self._state.wakeup.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def run(self) -> WorkerStats:
        """Work until stopped, ``max_jobs`` is reached, or (``burst``) no work is left."""
        self._log_start()
        refused = presence.register(
            self.alias,
            self.worker_id,
            queues=self.queues,
            concurrency=self.concurrency,
            lease_seconds=self.lease_seconds,
        )
        if refused is not None:
            # Before any thread starts or any job is claimed: two live processes with
            # one id would share leases and delete each other's row.
            self.fatal = refused
            logger.error(
                "worker %s: %s",
                self.worker_id,
                refused,
                extra={"action": "fatal", "worker_id": self.worker_id},
            )
            close_connection(self.alias)
            return self.stats
        self._start_threads()
        try:
            # Jitter so a fleet restarted together does not claim in lock-step.
            self._stopping.wait(random.uniform(0, min(0.1, self.poll_interval)))
            self._claim_loop()
        except Abort:
            # The second stop signal, come before the claim loop saw the first (both
            # handlers ran back to back): leave now rather than drain, which would
            # wait out the running jobs. Their leases expire, the sweeper recovers them.
            self._abandon()
            raise
        except BaseException:
            self._finish()
            raise
        self._finish()
        logger.info(
            "worker %s stopped: done=%d failed=%d cancelled=%d lost=%d released=%d",
            self.worker_id,
            self.stats.done,
            self.stats.failed,
            self.stats.cancelled,
            self.stats.lost,
            self.stats.released,
            extra={"action": "exit", "worker_id": self.worker_id},
        )
        return self.stats

    def _log_start(self) -> None:
        """The start-up lines: what this worker works, and how it wakes up."""
        logger.info(
            "worker %s starting: database=%s queues=%s concurrency=%d async=%d lease=%ss",
            self.worker_id,
            self.alias,
            ",".join(self.queues) if self.queues else "*",
            self.concurrency,
            self.async_concurrency,
            self.lease_seconds,
            extra={"action": "start", "worker_id": self.worker_id},
        )
        if self.listen.params is None:
            logger.info(
                "worker %s wake-ups: polling every %ss, so a job enqueued while every "
                "worker is idle waits up to that long (LISTEN: %s)",
                self.worker_id,
                self.poll_interval,
                self.listen.description,
                extra={"action": "start", "worker_id": self.worker_id},
            )
        else:
            logger.info(
                "worker %s wake-ups: %s, and polling every %ss as a backstop",
                self.worker_id,
                self.listen.description,
                self.poll_interval,
                extra={"action": "start", "worker_id": self.worker_id},
            )

    # --- main thread: claiming ------------------------------------------------------

    def _free_slots(self) -> int:
        """How many jobs the thread slots' window of ``max(concurrency, batch_size)``
        has room for: a batch size above the concurrency prefetches (claimed jobs wait
        locally, their leases kept alive by the heartbeat)."""
        return self._free()[0]

    def _free(self) -> tuple[int, int]:
        """Room for jobs (thread slots' window, event loop's slots)."""
        with self._state.lock:
            # Jobs waiting for their batched completion hold no slot (they stay held
            # only so that the heartbeat keeps extending their leases), unless more
            # than a full batch of them waits: then the completer is behind, and
            # claiming slows down until it catches up (back-pressure).
            completing = threads = looping = 0
            for held in self._state.held.values():
                if held.completing:
                    completing += 1
                elif held.on_loop:
                    looping += 1
                else:
                    threads += 1
        behind = max(0, completing - self._completer.max_batch)
        return (
            max(self.concurrency, self._sizer.batch_size) - threads - behind,
            self.async_concurrency + self._sizer.loop_ahead - looping - behind,
        )

    @property
    def _ahead(self) -> int:
        """With prefetching (a batch size above the concurrency, given or raised for
        short jobs: claimer.py), the next batch is claimed while the runners work
        through the current one, so that they never wait for a claim's round trip: up
        to two batches are held at once."""
        return self._sizer.ahead

    def _claim_size(self, free: int) -> int:
        """How many to claim now for ``free`` thread slots (0: wait); see
        :meth:`ClaimSizer.thread_claim`."""
        return self._sizer.thread_claim(free, self._jobs.qsize())

    def _claim_total(self, thread_free: int, loop_free: int) -> int:
        """How many to claim now for ``thread_free`` thread slots and ``loop_free``
        event loop slots (``claimer.py`` says how and why)."""
        return self._sizer.size(thread_free, loop_free, waiting=self._jobs.qsize())

    def _route(self, jobs: list[Job]) -> None:
        """Hold claimed jobs and hand each to its side: a coroutine task's (not
        transactional) to the event loop, any other to the runner threads (which also
        record a task that fails to import). Count the kinds for the claim sizer. Every
        job is held (under one taking of the lock) before any is handed out."""
        if self._coroutines is None:
            self._state.hold_many([(job, False) for job in jobs])
            for job in jobs:
                self._jobs.put(job)
            return
        routed = [(job, self._loop_task(job)) for job in jobs]
        self._state.hold_many([(job, known is not None) for job, known in routed])
        to_loop: list[tuple[Job, Known]] = []
        for job, known in routed:
            if known is None:
                self._jobs.put(job)
                self._thread_paths.add(job.task)
            else:
                to_loop.append((job, known))
                self._loop_paths.add(job.task)
        if not jobs:
            return
        self._coroutines.submit(to_loop)
        self._sizer.claimed(plain=len(jobs) - len(to_loop), coroutine=len(to_loop))

    def _loop_task(self, job: Job) -> Known | None:
        """``job``'s task if its jobs run on the event loop (imported here, once)."""
        if self._coroutines is None:
            return None
        try:
            known = self._catalog.get(job.task)
        except BaseException:  # noqa: BLE001 - a runner thread records it
            return None
        return known if known.on_loop else None

    def _heartbeat_alive(self) -> bool:
        """A dead heartbeat thread means nobody extends leases, a dead event loop
        thread that nobody runs coroutine jobs: stop claiming, exit."""
        dead = None
        if not self._heartbeat_thread.is_alive():
            dead = "the heartbeat thread"
        elif self._loop_threads and not self._loop_threads[0].is_alive():
            dead = "the event loop thread"
        if dead is None:
            return True
        self.fatal = f"{dead} died"
        logger.error(
            "worker %s: %s died; stopping (running jobs' leases will expire and the "
            "sweeper will recover them)",
            self.worker_id,
            dead,
            extra={"action": "fatal", "worker_id": self.worker_id},
        )
        self.stop()
        return False

    def _over_memory(self) -> bool:
        """Whether the process's resident memory is over ``max_memory`` (checked at most
        four times a second, between claims): then it stops claiming to be recycled."""
        if self.max_memory is None or time.monotonic() - self._memory_checked < 0.25:
            return False
        self._memory_checked = time.monotonic()
        rss = rss_mb()
        if rss is None or rss <= self.max_memory:
            return False
        self.recycle = True
        logger.warning(
            "worker %s: resident memory %.0f MB is over --max-memory %d MB; finishing "
            "its jobs, then the process is replaced",
            self.worker_id,
            rss,
            self.max_memory,
            extra={"action": "recycle", "worker_id": self.worker_id},
        )
        return True

    def _claim_loop(self) -> None:
        # A burst run ends: through database errors it retries for a bounded time only.
        retry = Retry(
            self.alias,
            stop=self._stopping,
            deadline=float(settings.BURST_CONNECT_TIMEOUT) if self.burst else None,
        )
        last_promote = 0.0
        # Waking on freed slots only matters while claiming could go on; a burst or
        # max_jobs worker also needs to see its last job end (then it exits).
        always_wake = self.burst or self.max_jobs is not None
        while not self._stopping.is_set():
            # Before the free slots are counted: a slot freed from now on wakes the wait
            # below, so none is missed between the count and the wait.
            self._state.slots_wanted.set()
            recycle_connections()
            if not self._heartbeat_alive() or self._over_memory():
                break
            free = self._wanted()
            if free is None:
                break  # max_jobs reached and all finished
            if free <= 0 or not self._heartbeat.healthy():
                self._wait(self.poll_interval)
                continue
            try:
                claimed = self._claim_held(free)
                if claimed is None:  # closed: the process is about to be replaced
                    self._wait(self.poll_interval)
                    continue
                jobs, flowed, resumed = claimed
                if not jobs and resumed and self.burst:
                    self._position.rescan()  # look from the head before exiting idle
                    self._flow_position.rescan()
                    continue
                promoted = 0
                promote_ran = False
                if not jobs and time.monotonic() - last_promote >= self.poll_interval:
                    # Idle: move a bounded batch of due scheduled jobs to pending.
                    last_promote = time.monotonic()
                    promote_ran = True
                    with bounded(
                        self.alias, "claim", self.worker_id, max(1.0, self.lease_seconds / 2)
                    ):
                        promoted = sweeper.promote_due(self.alias, batch_size=100)
            except DatabaseError as exc:
                abort = replaced_abort(exc)
                if abort is not None:
                    raise abort from exc  # the second signal's, not a claim failure
                if self._claim_failed(exc, retry):
                    break
                continue
            retry.succeeded()
            self.stats.count("claimed", len(jobs))
            if flowed is not None and (jobs or flowed.blocked):
                # Under flow control a short claim is no sign of an empty queue: keys at
                # their limits, or budgets another worker was claiming that instant.
                # Claim on while claims take jobs; when limits keep every job back, wait
                # for a slot (ours, or a NOTIFY) or the poll interval.
                if not jobs:
                    self._wait(self.poll_interval)
                continue
            if not jobs and self._passed_over:
                # A claim by kind that found only jobs for the side that is full: more
                # work is there, so wait for a slot (or a NOTIFY, or the poll), not for
                # new work alone as after an empty line.
                self._wait(self.poll_interval)
                continue
            if jobs and self._drained and not self._passed_over and not always_wake:
                # Fewer than asked for: the queue is drained for now. Claim again on a
                # NOTIFY (or the poll), not as soon as these jobs end: an empty claim
                # then would only compete with them for the GIL and the cores.
                self._wait(self.poll_interval, idle=True)
                continue
            if jobs or promoted:
                continue
            with self._state.lock:
                idle = not self._state.held
            if self.burst and idle:
                if promote_ran:
                    break
                # Promote once more before exiting: a retry of a job this run failed
                # (or any scheduled job) may have come due since the last promote.
                last_promote = 0.0
                continue
            self._wait(self.poll_interval, idle=not always_wake)

    def _wanted(self) -> int | None:
        """How many jobs to claim now (0: wait); None: ``max_jobs`` reached and every
        job finished (the worker exits). Decides whether the claim is by kind
        (``_kinds``): with coroutine jobs claimed lately and no plain job, their tasks
        known, no flow control on the last claim, no ``max_jobs``, and more room on the
        loop than a claim of one limit would take. (Not with plain jobs among them: the
        candidates at the head of a mixed line are often plain jobs the busy threads
        have no room for, which a claim by kind would lock and pass over claim after
        claim, its window full of them, the loop starved: a half-and-half mix ran at
        500 jobs/s instead of 5,500, ``bench.async_jobs --only mix``.)"""
        thread_free, loop_free = self._free()
        threads, loop = self._sizer.split(
            thread_free + self._ahead,
            loop_free,
            waiting=self._jobs.qsize(),
            loop_waiting=0 if self._coroutines is None else self._coroutines.waiting,
        )
        self._kinds = None
        if self._coroutines is None:
            free = threads
        elif (
            loop > threads
            and self._loop_paths
            and not self._flowing
            and self.max_jobs is None
            and self._sizer.lately(coroutine=True)
            and not self._sizer.lately(coroutine=False)
        ):
            self._kinds = (threads, loop)
            free = threads + loop
        else:
            free = min(threads, loop)
        if self.max_jobs is not None:
            free = min(free, self.max_jobs - self.stats.claimed)
            if free <= 0 and not self._state.held:
                return None
        return free

    def _claim_held(self, free: int) -> tuple[list[Job], flow.FlowClaim | None, bool] | None:
        """:meth:`_claim`, its jobs held and routed before the claims' lock is let go
        (None: claims are closed, see ``WorkerState.claims_closed``)."""
        with self._state.claims:
            if self._state.claims_closed.is_set():
                return None
            claimed = self._claim(free)
            self._route(claimed[0])
            return claimed

    def _claim(self, free: int) -> tuple[list[Job], flow.FlowClaim | None, bool]:
        """Claim up to ``free`` jobs, under flow control if any is in force: the jobs,
        the flow claim's outcome (None without flow control), and whether the claim
        resumed after an earlier one (not from the head of the line)."""
        # A claim that hangs on a lock would stall the worker; bound it (it uses SKIP
        # LOCKED, so this is a backstop).
        with bounded(self.alias, "claim", self.worker_id, max(1.0, self.lease_seconds / 2)):
            view = self._flow.current()
            self._sizer.prefetch_allowed = not view.fair_among(self.queues) and view.keys_only(
                self.queues
            )
            if self._state.released.is_set():
                self._state.released.clear()
                self._position.rescan()  # released dependants are behind it
                self._flow_position.rescan()
            self._flowing = view.in_force(self.queues)
            kinds, self._kinds = self._kinds, None
            self._passed_over = False
            if not self._flowing:
                after = self._position.start()
                if kinds is None:
                    jobs = self._state.jobs.claim(
                        self.worker_id,
                        limit=free,
                        queues=self.queues,
                        lease_seconds=self.lease_seconds,
                        after=after,
                        flow_view=view,
                    )
                    self._drained = len(jobs) < free
                    behind = False
                else:
                    jobs, scanned, behind = self._state.jobs.claim_kinds(
                        self.worker_id,
                        loop_tasks=self._loop_paths,
                        thread_tasks=self._thread_paths,
                        thread_limit=kinds[0],
                        loop_limit=kinds[1],
                        queues=self.queues,
                        lease_seconds=self.lease_seconds,
                        after=after,
                    )
                    self._drained = scanned < free
                    self._passed_over = scanned > len(jobs)
                self._position.claimed(after, jobs)
                if behind:
                    # A job passed over is behind the position now: the next claim
                    # reads the line from its head. (Jobs passed over after the last
                    # one leased, a coroutine-only line's tail, are not.)
                    self._position.rescan()
                return jobs, None, after is not None
            if kinds is not None:
                # Flow control came into force since the claim was sized by kind: one
                # limit, as the flow claim cannot tell the kinds apart.
                free = min(kinds)
                if free <= 0:
                    self._drained = False
                    return [], None, False
            # (--queue workers read each queue from its head)
            flow_after = None if self.queues is not None else self._flow_position.start()
            flowed = self._state.jobs.claim_flow(
                self.worker_id,
                limit=free,
                view=view,
                queues=self.queues,
                lease_seconds=self.lease_seconds,
                cursors=self._cursors,
                after=flow_after,
                walk=self._flow_walk,
            )
        self._flow_walk = flowed.walked
        if self.queues is None:
            self._flow_position.resumed(flow_after, flowed.resume)
        self._cursors = flowed.cursors
        self._position.claimed(None, flowed.jobs)
        return flowed.jobs, flowed, flow_after is not None

    def _claim_failed(self, exc: DatabaseError, retry: Retry) -> bool:
        """Log a claim's database error and wait before the next try; True when the
        worker must stop (not migrated, or a burst run out of retries)."""
        if isinstance(exc, NotMigrated):
            # No retry cures a missing table: stop, and say how to fix it.
            self.fatal = str(exc)
            logger.error(
                "worker %s: %s",
                self.worker_id,
                exc,
                extra={"action": "fatal", "worker_id": self.worker_id},
            )
            return True
        delay = retry.failed()
        close_connection(self.alias)
        if retry.expired():
            self.fatal = (
                f"database {describe_database(self.alias)} still failing after "
                f"{retry.deadline:g}s of retries ({first_line(exc)}); giving up "
                "(--burst: PGQUEUE_BURST_CONNECT_TIMEOUT)"
            )
            logger.error(
                "worker %s: %s",
                self.worker_id,
                self.fatal,
                extra={"action": "fatal", "worker_id": self.worker_id},
            )
            return True
        logger.warning(
            "worker %s: database error while claiming (%s); retrying in %.1fs",
            self.worker_id,
            first_line(exc),
            delay,
            extra={"action": "db_error", "worker_id": self.worker_id},
        )
        retry.wait()
        return False

    def _wait(self, timeout: float, *, idle: bool = False) -> None:
        """Wait for a wake-up (a NOTIFY, a freed slot, a stop) or ``timeout``. ``idle``:
        the last claim found nothing more to take, so only new work is worth waking
        for, not a freed slot."""
        if idle:
            self._state.slots_wanted.clear()
        self._state.wakeup.wait(timeout)
        self._state.wakeup.clear()

    # --- runner threads -------------------------------------------------------------

    def _runner_thread(self) -> None:
        try:
            while True:
                job = self._jobs.get()
                if job is None:
                    return
                handed_off = False
                try:
                    if self._stopping.is_set():
                        self._runner.release(job)
                    elif self._sizer.prefetch_short:  # (else its run time goes unused)
                        began = time.monotonic()
                        handed_off = self._runner.execute(job)
                        self._sizer.ran(time.monotonic() - began)
                    else:
                        handed_off = self._runner.execute(job)
                except BaseException:
                    # A bug or an unexpected error of ours (even a SystemExit) must not
                    # cost the slot: the job is dropped from the heartbeat, so its lease
                    # expires and the sweeper hands it out again.
                    logger.exception(
                        "job %s: internal error in the worker; its lease will expire",
                        job.id,
                        extra={"action": "error", "job_id": job.id, "worker_id": self.worker_id},
                    )
                    close_connection(self.alias)
                finally:
                    if handed_off:  # the completer forgets it once written
                        self._state.slot_freed()
                    else:
                        self._state.forget([job])
        finally:
            close_connection(self.alias)

    # --- lifecycle ------------------------------------------------------------------

    @staticmethod
    def _thread(target: Callable[[], None], name: str) -> threading.Thread:
        return threading.Thread(target=target, name=f"pgqueue-{name}", daemon=True)

    @property
    def _threads(self) -> list[threading.Thread]:
        threads = [
            self._heartbeat_thread,
            self._completer_thread,
            self._limits_thread,
            *self._runner_threads,
            *self._loop_threads,
        ]
        if self._listener_thread is not None:
            threads.insert(1, self._listener_thread)
        return threads

    def _start_threads(self) -> None:
        for thread in self._threads:
            thread.start()

    def _finish(self) -> None:
        """Drain (:meth:`_shutdown`), then leave the presence table and the database."""
        self._shutdown()
        presence.unregister(self.worker_id)
        close_connection(self.alias)

    def _abandon(self) -> None:
        """Stop every thread without waiting for any: claimed jobs keep their leases
        until these expire (the heartbeat stops too), as if the process had died."""
        self._stopping.set()
        self._state.done.set()
        self._state.wakeup.set()

    def _shutdown(self) -> None:
        """Let running jobs finish (within the grace period), release unstarted ones."""
        self._stopping.set()
        # Release prefetched jobs now, not when a runner frees up: with every runner
        # busy past the grace period they would otherwise wait for their leases.
        while True:
            try:
                unstarted = self._jobs.get_nowait()
            except queue.Empty:
                break
            if unstarted is None:  # (no stop marks yet: they are queued below)
                continue
            self._runner.release(unstarted)
            self._state.forget([unstarted])
        for _ in range(self.concurrency):
            self._jobs.put(None)
        if self._coroutines is not None:
            self._coroutines.stop()  # coroutine jobs not started yet are released
        grace = self.grace_seconds
        deadline = None if grace is None else time.monotonic() + grace
        for thread in self._runner_threads:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            thread.join(remaining)
        unfinished = [t for t in self._runner_threads if t.is_alive()]
        if unfinished:
            logger.warning(
                "worker %s: %d job(s) still running after the grace period; their leases "
                "will expire and the sweeper will recover them",
                self.worker_id,
                len(unfinished),
                extra={"action": "exit", "worker_id": self.worker_id},
            )
        if self._coroutines is not None:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._coroutines.drain(remaining)  # (logs each job it had to cancel)
        # Write the completions still pending (the heartbeat still runs meanwhile); a
        # runner still busy past the grace period may hand over one more, which then
        # waits for its lease to expire like the job of a worker that died.
        self._completer.stop()
        completer = self._completer_thread
        # At least a few seconds: a flush is one statement, even with no grace.
        completer.join(None if deadline is None else max(5.0, deadline - time.monotonic()))
        if completer.is_alive():
            unfinished.append(completer)
            logger.warning(
                "worker %s: completions still unwritten at exit; those jobs' leases "
                "will expire and the sweeper will recover them",
                self.worker_id,
                extra={"action": "exit", "worker_id": self.worker_id},
            )
        if self._coroutines is not None:
            self._coroutines.close()
            for thread in self._loop_threads:
                thread.join(5)
        self._state.done.set()
        # The listener notices _done within a quarter second; wait that long so its
        # connection is closed when run() returns (tests drop the database next).
        if self._listener_thread is not None:
            self._listener_thread.join(1.0)
        self._heartbeat_thread.join(5)
        for thread in self._runner_threads:
            if thread not in unfinished:
                thread.join(5)
        close_connection(self.alias)
