"""The worker: claim -> run -> complete or fail, with leases kept alive by a heartbeat.

Threads of one worker process:

* the main thread claims jobs (one statement per batch) while there are free slots,
  and otherwise waits to be woken: by a NOTIFY, by a slot freeing, or by the poll
  interval running out (polling, not NOTIFY, is what guarantees pickup);
* ``concurrency`` runner threads execute the tasks, each on its own connection;
* a heartbeat thread extends the leases of jobs this worker holds, on its own
  connection, never inside a task's transaction, and stops extending a job that ran
  past its timeout; while it fails, the main thread claims nothing;
* a listener thread holds a dedicated LISTEN connection and sets the wake-up flag.

Every write about a job is fenced on (owner, attempt): a worker that lost a lease
changes nothing and says so in the log. A ``transactional`` task (see ``tasks.py``)
runs in one transaction with its fenced completion, so its effects commit exactly once.

Each connection is labelled ``pgqueue <role> <worker id>`` in
``pg_stat_activity.application_name`` (roles: claim, heartbeat, runner, listen).
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
from collections.abc import Iterable
from dataclasses import dataclass, field

from django.db import DatabaseError, connections, transaction
from django.tasks import Task, TaskContext, TaskResultStatus
from django.tasks.signals import task_finished, task_started
from django.utils.json import normalize_json

from . import validation
from .backend import load_task, to_task_result
from .conf import settings
from .dbconn import (
    backoff_delay,
    close_connection,
    configure_session,
    discard_connection,
    first_line,
    recycle_connections,
)
from .exceptions import LeaseLost, PgQueueError, TaskNotFound
from .heartbeat import Heartbeat
from .listener import Listener
from .models import Job
from .tasks import CurrentJob, _current, task_option

logger = logging.getLogger(__name__)


def default_worker_id() -> str:
    """host:pid:random, unique per process start, readable in the admin and logs."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class TransactionLeak(PgQueueError):  # noqa: N818 - names the event
    """A task returned with a transaction still open on the jobs database."""


@dataclass
class Held:
    """A job this worker holds, and when its task started (None: not started yet)."""

    job: Job
    started: float | None = None
    lost: bool = False
    timeout: float | None = None  # the task's own timeout option, once it is loaded
    timed_out: bool = False


@dataclass
class WorkerStats:
    claimed: int = 0
    done: int = 0
    failed: int = 0
    lost: int = 0
    released: int = 0
    errors: list[str] = field(default_factory=list)


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
    ) -> None:
        self.queues = sorted(set(queues)) if queues else None
        self.concurrency = concurrency
        self.batch_size = batch_size or concurrency
        self.lease_seconds = float(lease_seconds or settings.LEASE_SECONDS)
        self.burst = burst
        self.max_jobs = max_jobs
        self.worker_id = worker_id or default_worker_id()
        self.poll_interval = float(poll_interval or settings.POLL_INTERVAL)
        self.grace_seconds = (
            settings.SHUTDOWN_GRACE_SECONDS if grace_seconds is None else grace_seconds
        )
        self.alias = settings.DATABASE
        self.stats = WorkerStats()
        #: Why the worker stopped on its own (None: it was asked to, or ran out of work).
        self.fatal: str | None = None

        self._stopping = threading.Event()  # no more claiming
        self._wakeup = threading.Event()  # a NOTIFY came or a slot freed
        self._done = threading.Event()  # background threads must exit
        self._lock = threading.Lock()
        self._held: dict[int, Held] = {}
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._heartbeat = Heartbeat(
            held=self._held,
            lock=self._lock,
            alias=self.alias,
            worker_id=self.worker_id,
            lease_seconds=self.lease_seconds,
            done=self._done,
        )
        self._listener = Listener(
            alias=self.alias,
            worker_id=self.worker_id,
            queues=self.queues,
            wakeup=self._wakeup,
            done=self._done,
        )

    # --- public ---------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming; running jobs finish, unstarted ones are released."""
        self._stopping.set()
        self._wakeup.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def run(self) -> WorkerStats:
        """Work until stopped, ``max_jobs`` is reached, or (``burst``) no work is left."""
        logger.info(
            "worker %s starting: queues=%s concurrency=%d lease=%ss",
            self.worker_id,
            ",".join(self.queues) if self.queues else "*",
            self.concurrency,
            self.lease_seconds,
            extra={"action": "start", "worker_id": self.worker_id},
        )
        self._start_threads()
        try:
            # Jitter so a fleet restarted together does not claim in lock-step.
            self._stopping.wait(random.uniform(0, min(0.1, self.poll_interval)))
            self._claim_loop()
        finally:
            self._shutdown()
        logger.info(
            "worker %s stopped: done=%d failed=%d lost=%d released=%d",
            self.worker_id,
            self.stats.done,
            self.stats.failed,
            self.stats.lost,
            self.stats.released,
            extra={"action": "exit", "worker_id": self.worker_id},
        )
        return self.stats

    # --- main thread: claiming ------------------------------------------------------

    def _free_slots(self) -> int:
        """How many more jobs to claim: a batch size above the concurrency prefetches
        (claimed jobs wait locally, their leases kept alive by the heartbeat)."""
        with self._lock:
            return max(self.concurrency, self.batch_size) - len(self._held)

    def _heartbeat_alive(self) -> bool:
        """A dead heartbeat thread means nobody extends leases: stop claiming, exit."""
        thread = next((t for t in self._threads if t.name == "pgqueue-heartbeat"), None)
        if thread is None or thread.is_alive():
            return True
        self.fatal = "the heartbeat thread died"
        logger.error(
            "worker %s: the heartbeat thread died; stopping (running jobs' leases will "
            "expire and the sweeper will recover them)",
            self.worker_id,
            extra={"action": "fatal", "worker_id": self.worker_id},
        )
        self.stop()
        return False

    def _claim_loop(self) -> None:
        failures = 0
        last_promote = 0.0
        while not self._stopping.is_set():
            recycle_connections()
            if not self._heartbeat_alive():
                break
            free = self._free_slots()
            if self.max_jobs is not None:
                free = min(free, self.max_jobs - self.stats.claimed)
                if free <= 0 and not self._held:
                    break  # max_jobs reached and all finished
            if free <= 0 or not self._heartbeat.healthy():
                self._wait(self.poll_interval)
                continue
            try:
                # A claim or promote that hangs on a lock would stall the worker;
                # bound them (they use SKIP LOCKED, so this is a backstop).
                configure_session(
                    self.alias, "claim", self.worker_id, max(1.0, self.lease_seconds / 2)
                )
                jobs = Job.objects.db_manager(self.alias).claim(
                    self.worker_id,
                    limit=min(free, self.batch_size),
                    queues=self.queues,
                    lease_seconds=self.lease_seconds,
                )
                promoted = 0
                if not jobs and time.monotonic() - last_promote >= self.poll_interval:
                    # Idle: move a bounded batch of due scheduled jobs to pending.
                    last_promote = time.monotonic()
                    promoted = Job.objects.db_manager(self.alias).promote_due(batch_size=100)
            except DatabaseError as exc:
                failures += 1
                delay = backoff_delay(failures)
                logger.warning(
                    "worker %s: database error while claiming (%s); retrying in %.1fs",
                    self.worker_id,
                    first_line(exc),
                    delay,
                    extra={"action": "db_error", "worker_id": self.worker_id},
                )
                close_connection(self.alias)
                self._stopping.wait(delay)
                continue
            failures = 0
            for job in jobs:
                with self._lock:
                    self._held[job.id] = Held(job)
                self.stats.claimed += 1
                self._jobs.put(job)
            if jobs or promoted:
                continue
            with self._lock:
                idle = not self._held
            if self.burst and idle:
                break
            self._wait(self.poll_interval)

    def _wait(self, timeout: float) -> None:
        self._wakeup.wait(timeout)
        self._wakeup.clear()

    # --- runner threads -------------------------------------------------------------

    def _runner(self) -> None:
        try:
            while True:
                job = self._jobs.get()
                if job is None:
                    return
                try:
                    if self._stopping.is_set():
                        self._release(job)
                    else:
                        self._execute(job)
                except Exception:
                    # A bug or an unexpected error of ours must not cost the slot: the
                    # job is dropped from the heartbeat, so its lease expires and the
                    # sweeper hands it out again.
                    logger.exception(
                        "job %s: internal error in the worker; its lease will expire",
                        job.id,
                        extra={"action": "error", "job_id": job.id, "worker_id": self.worker_id},
                    )
                    close_connection(self.alias)
                finally:
                    with self._lock:
                        self._held.pop(job.id, None)
                    self._wakeup.set()
        finally:
            close_connection(self.alias)

    def _release(self, job: Job) -> None:
        try:
            if Job.objects.db_manager(self.alias).release(job, self.worker_id):
                self.stats.released += 1
                logger.info(
                    "job %s released (shutdown before start)",
                    job.id,
                    extra={
                        "action": "release",
                        "job_id": job.id,
                        "worker_id": self.worker_id,
                    },
                )
        except DatabaseError:
            logger.warning(
                "job %s: could not release; its lease will expire",
                job.id,
                extra={
                    "action": "release",
                    "job_id": job.id,
                    "worker_id": self.worker_id,
                },
            )
            close_connection(self.alias)

    def _execute(self, job: Job) -> None:
        recycle_connections()
        with self._lock:
            held = self._held[job.id]
            held.started = time.monotonic()
            lost = held.lost
        if lost:
            # A prefetched job whose lease the heartbeat already found taken back (the
            # process was paused): another worker runs it; running it here too would
            # only duplicate its effects.
            self.stats.lost += 1
            logger.warning(
                "job %s: lease lost before the task started; not running it",
                job.id,
                extra={"action": "lease_lost", "job_id": job.id, "worker_id": self.worker_id},
            )
            return
        try:
            task = load_task(job.task)
        except ValueError as exc:
            # Never retried: the code is gone or the path is not a Task.
            self._record(job, "fail", error=TaskNotFound(str(exc)), retry=False)
            return
        timeout = task_option(task, "timeout")
        transactional = bool(task_option(task, "transactional"))
        with self._lock:
            held.timeout = float(timeout) if isinstance(timeout, int | float) else None
        token = _current.set(
            CurrentJob(
                id=job.id,
                attempt=job.attempts,
                max_attempts=job.max_attempts,
                idempotency_key=job.idempotency_key,
                queue=job.queue,
                worker_id=self.worker_id,
                transactional=transactional,
            )
        )
        try:
            self._run(job, task, transactional=transactional)
        finally:
            _current.reset(token)

    def _call(self, job: Job, task: Task, task_result: object) -> object:
        """Call the task; return its JSON-safe value (a bad value raises here)."""
        if task.takes_context:
            value = task.call(TaskContext(task_result=task_result), *job.args, **job.kwargs)
        else:
            value = task.call(*job.args, **job.kwargs)
        value = normalize_json(value)
        validation.result_json(value)  # a bad return value fails the job here
        return value

    def _run(self, job: Job, task: Task, *, transactional: bool) -> None:
        log_extra = {"job_id": job.id, "worker_id": self.worker_id}
        task_result = to_task_result(job, task)
        object.__setattr__(task_result, "status", TaskResultStatus.RUNNING)
        task_started.send(type(self), task_result=task_result)
        started = time.perf_counter()
        completed_in_tx = False
        try:
            configure_session(self.alias, "runner", self.worker_id)
            if transactional:
                # The task's effects and the fenced completion commit together or not
                # at all: a lost lease raises inside the block and rolls them back.
                with transaction.atomic(using=self.alias):
                    value = self._call(job, task, task_result)
                    if not Job.objects.db_manager(self.alias).complete(
                        job, self.worker_id, result=value
                    ):
                        raise LeaseLost(
                            f"job {job.id}: lease lost before completion; "
                            "the task's effects were rolled back"
                        )
                    completed_in_tx = True
            else:
                value = self._call(job, task, task_result)
                wrapper = connections[self.alias]
                if wrapper.in_atomic_block or not wrapper.get_autocommit():
                    discard_connection(self.alias)
                    raise TransactionLeak(
                        "the task returned with a transaction still open; it was "
                        "rolled back and the connection discarded"
                    )
        except LeaseLost:
            self.stats.lost += 1
            logger.warning(
                "job %s: lease lost while running (transactional: effects rolled back, "
                "nothing recorded); another worker owns it now",
                job.id,
                extra={"action": "lease_lost", **log_extra},
            )
            return
        except BaseException as exc:
            # BaseException too: a task's SystemExit or KeyboardInterrupt (or an
            # asyncio.CancelledError) is its own failure; signals reach the main thread
            # only. Swallowing nothing here would wedge the slot with the job held.
            elapsed = time.perf_counter() - started
            if (
                completed_in_tx
                and not isinstance(exc, DatabaseError)
                and not connections[self.alias].in_atomic_block
            ):
                # Committed: only an on_commit callback raised after the commit.
                self.stats.done += 1
                logger.error(
                    "job %s %s done (transactional), but an on_commit callback raised",
                    job.id,
                    job.task,
                    exc_info=exc,
                    extra={"action": "done", **log_extra},
                )
                return
            if connections[self.alias].in_atomic_block:
                discard_connection(self.alias)  # a task that leaked atomic() and raised
            status = self._record(job, "fail", error=exc)
            if status is not None:
                logger.error(
                    "job %s %s failed after %.3fs (attempt %d/%d) -> %s",
                    job.id,
                    job.task,
                    elapsed,
                    job.attempts,
                    job.max_attempts,
                    status,
                    exc_info=exc,
                    extra={"action": "fail", **log_extra},
                )
                object.__setattr__(task_result, "status", TaskResultStatus.FAILED)
                task_finished.send(type(self), task_result=task_result)
            return
        elapsed = time.perf_counter() - started
        if transactional:
            self.stats.done += 1
            recorded = True
        else:
            recorded = bool(self._record(job, "complete", result=value))
        if recorded:
            logger.info(
                "job %s %s done in %.3fs (attempt %d%s)",
                job.id,
                job.task,
                elapsed,
                job.attempts,
                ", transactional" if transactional else "",
                extra={"action": "done", **log_extra},
            )
            object.__setattr__(task_result, "status", TaskResultStatus.SUCCESSFUL)
            object.__setattr__(task_result, "_return_value", value)
            task_finished.send(type(self), task_result=task_result)

    def _record(
        self,
        job: Job,
        outcome: str,
        *,
        result: object = None,
        error: BaseException | None = None,
        retry: bool = True,
    ) -> str | bool | None:
        """Write a job's outcome, fenced; retry through database errors for about one
        lease, then give up and let the lease expire (the sweeper recovers the job)."""
        manager = Job.objects.db_manager(self.alias)
        deadline = time.monotonic() + self.lease_seconds
        failures = 0
        while True:
            try:
                if outcome == "complete":
                    written: str | bool | None = manager.complete(
                        job, self.worker_id, result=result
                    )
                else:
                    assert error is not None
                    written = manager.fail(job, self.worker_id, error, retry=retry)
                break
            except DatabaseError as exc:
                failures += 1
                close_connection(self.alias)
                if time.monotonic() > deadline or self._done.is_set():
                    logger.error(
                        "job %s: could not record %s (%s); its lease will expire",
                        job.id,
                        outcome,
                        exc,
                        extra={
                            "action": outcome,
                            "job_id": job.id,
                            "worker_id": self.worker_id,
                        },
                    )
                    return None
                delay = backoff_delay(failures)
                logger.warning(
                    "job %s: could not record %s (%s); retrying in %.1fs",
                    job.id,
                    outcome,
                    first_line(exc),
                    delay,
                    extra={"action": outcome, "job_id": job.id, "worker_id": self.worker_id},
                )
                time.sleep(delay)
        if written in (None, False):
            self.stats.lost += 1
            logger.warning(
                "job %s: lease lost before %s was recorded; another worker owns it now",
                job.id,
                outcome,
                extra={
                    "action": "lease_lost",
                    "job_id": job.id,
                    "worker_id": self.worker_id,
                },
            )
        elif outcome == "complete":
            self.stats.done += 1
        else:
            self.stats.failed += 1
        return written

    # --- lifecycle ------------------------------------------------------------------

    def _start_threads(self) -> None:
        targets = [(self._heartbeat.run, "heartbeat"), (self._listener.run, "listener")]
        targets += [(self._runner, f"runner-{i}") for i in range(self.concurrency)]
        for target, name in targets:
            thread = threading.Thread(target=target, name=f"pgqueue-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

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
            if unstarted is not None:
                self._release(unstarted)
                with self._lock:
                    self._held.pop(unstarted.id, None)
        for _ in range(self.concurrency):
            self._jobs.put(None)
        grace = self.grace_seconds
        deadline = None if grace is None else time.monotonic() + grace
        runners = [t for t in self._threads if t.name.startswith("pgqueue-runner")]
        for thread in runners:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            thread.join(remaining)
        unfinished = [t for t in runners if t.is_alive()]
        if unfinished:
            logger.warning(
                "worker %s: %d job(s) still running after the grace period; their leases "
                "will expire and the sweeper will recover them",
                self.worker_id,
                len(unfinished),
                extra={"action": "exit", "worker_id": self.worker_id},
            )
        self._done.set()
        for thread in self._threads:
            # The listener notices _done within a quarter second; wait that long so its
            # connection is closed when run() returns (tests drop the database next).
            if thread not in unfinished:
                thread.join(1.0 if thread.name == "pgqueue-listener" else 5)
        close_connection(self.alias)
