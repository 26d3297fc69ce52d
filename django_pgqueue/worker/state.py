"""What one worker's threads share: its held jobs, their lock, its counters, its events.

The claim loop, the runner threads, the completer, the heartbeat and the listener each
get the same :class:`WorkerState` instead of the same half-dozen arguments, and see it
under short attribute names through :class:`WorkerPart`. "Is this still my claim?" is
asked in one place, :meth:`WorkerState.entry`; the retry-until-the-lease-runs-out loop
of every outcome write is one method, :meth:`WorkerPart.write_retrying`, which retries
a database error as transient except one that refuses the data the write carries
(:class:`DataRefused`): that one would fail again however often it was tried.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeVar

from django.db import DatabaseError

from ..exceptions import first_line
from ..models import Job
from ..reconnect import Retry
from ..states import Status
from ..tasks import CancelFlag
from .connections import drop_connection

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: SQLSTATE classes of a statement refused for the data it carries, the same however
#: often it is tried: 22, a data exception (a value jsonb or numeric cannot hold), and
#: 54, a program limit exceeded (a jsonb string or container too large, too deep).
REFUSED_DATA_CLASSES = ("22", "54")


def refused_data(exc: BaseException) -> bool:
    """Whether a database error refused the statement's data (see ``REFUSED_DATA_CLASSES``)."""
    for error in (exc, exc.__cause__):
        state = getattr(error, "sqlstate", None)
        if isinstance(state, str) and state[:2] in REFUSED_DATA_CLASSES:
            return True
    return False


#: PostgreSQL's words when a jsonb array would pass 256 MB (its limit for one value).
JSONB_ARRAY_LIMIT = "total size of jsonb array elements exceeds"


def refusal(reason: str) -> str:
    """Why a job's return value could not be stored, for its error. A group member's
    completion also gathers the group's results into its callback's arguments (one
    jsonb array): past PostgreSQL's 256 MB for one value, the last member to finish is
    refused for what all of them returned, which its error says."""
    message = f"PostgreSQL refused the task's return value: {reason}"
    if JSONB_ARRAY_LIMIT in reason:
        message += (
            " (if this job is a member of a group with a callback: the members' results "
            "together, gathered into the callback's arguments, pass PostgreSQL's 256 MB "
            "limit of one jsonb value; return less, e.g. ids, and store the data elsewhere)"
        )
    return message


class DataRefused(Exception):  # noqa: N818 - names the event
    """An outcome write the database refused for its data (see ``refused_data``): not
    retried, since it would fail the same way; the caller records why instead."""

    def __init__(self, error: DatabaseError) -> None:
        super().__init__(first_line(error))
        self.error = error


@dataclass(slots=True)
class Held:
    """A job this worker holds, and when its task started (None: not started yet)."""

    job: Job
    started: float | None = None
    lost: bool = False
    timeout: float | None = None  # the task's own timeout option, once it is loaded
    timed_out: bool = False
    #: Its hard time limit in seconds (``limits.hard_limit``), once it started.
    time_limit: float | None = None
    #: When its claim came back (monotonic): the hard time limit counts from there.
    claimed: float = field(default_factory=time.monotonic)
    completing: bool = False  # finished; waiting for the completer to record it
    on_loop: bool = False  # a coroutine job, run on the event loop (not a thread slot)
    #: The server process of the runner thread's connection that runs it (a thread
    #: slot's job): ended if the job passes its hard limit (its locks go with it).
    backend_pid: int | None = None
    # Its outcome (fail, release, inline or transactional completion) is being written:
    # a lease extension that misses it is that write's to report, not a loss.
    recording: bool = False
    #: Set by the heartbeat when a lease extension reports the job's cancellation was
    #: requested; the task sees it as ``current_job().cancel_requested``.
    cancel: CancelFlag = field(default_factory=CancelFlag)

    @property
    def finishing(self) -> bool:
        """Its outcome is being written (by the completer or inline), so the row may
        leave ``running`` at any moment without the lease having been lost."""
        return self.completing or self.recording


@dataclass
class WorkerStats:
    """What a worker did; runner threads count concurrently, hence ``count()``."""

    claimed: int = 0
    done: int = 0
    failed: int = 0
    #: Jobs that ended ``cancelled`` here (never counted in ``done`` or ``failed``).
    cancelled: int = 0
    lost: int = 0
    released: int = 0
    snoozed: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + n)


@dataclass(frozen=True)
class WorkerState:
    """One worker's shared state. ``held`` is guarded by ``lock``; ``wakeup`` wakes the
    claim loop (a NOTIFY came, a slot freed); ``done`` tells background threads to end.
    Entries are added, marked completing and dropped through ``hold``,
    ``mark_completing`` and ``forget``."""

    alias: str
    worker_id: str
    lease_seconds: float
    stats: WorkerStats = field(default_factory=WorkerStats)
    held: dict[int, Held] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    wakeup: threading.Event = field(default_factory=threading.Event)
    #: Set while the claim loop wants to hear of freed slots; clear while it waits
    #: only for new work (its last claim found the queue empty), when a freed slot
    #: would wake it for a claim that finds nothing, in the middle of the very jobs
    #: whose latency counts (see ``slot_freed``).
    slots_wanted: threading.Event = field(default_factory=threading.Event)
    #: Set when jobs were released behind the claim position (a workflow's dependants
    #: keep their older ids): the next claim starts at the head (see position.py).
    released: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    #: Held by the claim loop from a claim to its jobs being held; set under it,
    #: ``claims_closed`` ends claiming at once (a process about to be replaced for a
    #: hard time limit: a job claimed after it read the held jobs was lost).
    claims: threading.Lock = field(default_factory=threading.Lock)
    claims_closed: threading.Event = field(default_factory=threading.Event)

    @cached_property
    def jobs(self) -> Any:  # JobManager (typed Any: a Manager is a descriptor to mypy)
        """``Job.objects`` on this worker's database, made once: ``db_manager()``
        copies the manager on every call, and the worker's parts call it per job."""
        return Job.objects.db_manager(self.alias)

    def entry(self, job: Job) -> Held | None:
        """Is this still my claim? ``job``'s entry in ``held`` if it belongs to this
        very claim; None if the job is no longer held, or if this worker claimed it
        again since (its lease was taken back, and a newer attempt's entry replaced
        this one: only the newest is extended, and an old run, once over, must touch
        only its own entry). Call with ``lock`` held."""
        entry = self.held.get(job.id)
        return entry if entry is not None and entry.job is job else None

    def in_flight(self) -> bool:
        """Whether any held job is running or waiting to run (not merely waiting for
        its completion to be written)."""
        with self.lock:
            return self.in_flight_locked()

    def in_flight_locked(self) -> bool:
        """``in_flight()``, with ``lock`` already held. Newest entries first: those are
        the jobs claimed last, still waiting to run, so the answer is usually the first
        entry looked at (the runners ask after every job; the oldest entries are the
        ones waiting for the completer). A plain loop: ``any()`` over a generator cost
        four times as much, on every job."""
        for held in reversed(self.held.values()):
            if not held.completing:
                return True
        return False

    def hold(self, job: Job, *, on_loop: bool = False) -> None:
        """Add a claimed job's entry (``on_loop``: a coroutine job, for the event loop).
        It replaces the entry of an older attempt this worker still runs (its lease was
        taken back): only the newest is extended, and the old run, once over, finds it
        is no longer its claim (``entry``)."""
        self.hold_many([(job, on_loop)])

    def hold_many(self, jobs: Iterable[tuple[Job, bool]]) -> None:
        """:meth:`hold` each (job, on_loop) of one claim: under one taking of the lock,
        and with one claim time (the claim loop holds every claimed job before it hands
        any of them out)."""
        claimed = time.monotonic()
        with self.lock:
            held = self.held
            for job, on_loop in jobs:
                held[job.id] = Held(job, claimed=claimed, on_loop=on_loop)

    def mark_completing(self, job: Job) -> bool:
        """Mark ``job``'s entry as waiting for its batched completion; return whether
        any other held job is still running or waiting to run."""
        with self.lock:
            entry = self.entry(job)
            if entry is not None:
                entry.completing = True
            return self.in_flight_locked()

    def forget(self, jobs: Iterable[Job]) -> None:
        """Drop the entries of these claims (never a newer claim of the same job), and
        wake the claim loop: their slots are free."""
        with self.lock:
            held = self.held
            for job in jobs:
                entry = held.get(job.id)  # (entry(), inline: a batch's worth per flush)
                if entry is not None and entry.job is job:
                    del held[job.id]
        self.slot_freed()

    def slot_freed(self) -> None:
        """A held job no longer takes a slot: wake the claim loop if it wants to know.
        (Not set again while set: the claim loop clears it before it counts the free
        slots, so a slot freed before the clear is counted, and one after it sets it.)"""
        if self.slots_wanted.is_set() and not self.wakeup.is_set():
            self.wakeup.set()


class WorkerPart:
    """Base of the classes whose methods run on a worker's threads."""

    def __init__(self, state: WorkerState) -> None:
        #: What the parts share; asked through it, never copied (one lock, one name).
        self.state = state
        #: The worker's identity, fixed for its life.
        self.alias = state.alias
        self.worker_id = state.worker_id
        self.lease_seconds = state.lease_seconds

    def write_retrying(
        self, write: Callable[[], T], *, jobs: Sequence[Job], outcome: str
    ) -> tuple[bool, T | None]:
        """Run ``write`` (one statement recording ``outcome`` for ``jobs``) on this
        thread's connection; through database errors, reconnect and retry with backoff
        for about one lease, or until the worker's threads are told to end. Return
        (True, what ``write`` returned), or (False, None) after giving up: the jobs'
        leases then expire and the sweeper recovers them (never recorded unfenced).
        An error that refused the write's data raises :class:`DataRefused` at once."""
        retry = Retry(self.alias, stop=self.state.done, deadline=self.lease_seconds)
        extra = {"action": outcome, "worker_id": self.worker_id}
        while True:
            try:
                return True, write()
            except DatabaseError as exc:
                if refused_data(exc):
                    raise DataRefused(exc) from exc
                delay = retry.failed()
                drop_connection(self.alias)
                if retry.expired() or self.state.done.is_set():
                    for job in jobs:
                        logger.error(
                            "job %s: could not record %s (%s); its lease will expire",
                            job.id,
                            outcome,
                            exc,
                            extra={**extra, "job_id": job.id},
                        )
                    return False, None
                for job in jobs:
                    logger.warning(
                        "job %s: could not record %s (%s); retrying in %.1fs",
                        job.id,
                        outcome,
                        first_line(exc),
                        delay,
                        extra={**extra, "job_id": job.id},
                    )
                # Wakes early at shutdown's end, so a give-up is not held up by a sleep.
                retry.wait()

    def mark_recording(self, job: Job) -> None:
        """Before writing ``job``'s outcome: tell the heartbeat that the row may leave
        ``running`` now for that reason (a missed extension is not a lost lease)."""
        with self.state.lock:
            entry = self.state.entry(job)
            if entry is not None:
                entry.recording = True

    def record_failure(self, job: Job, error: BaseException, *, retry: bool = True) -> str | None:
        """Write a failed attempt, fenced, and count it (``cancelled`` if the job ended
        so); return the job's new status, or None if it was not recorded (lease lost,
        or database errors for about one lease: then the lease expires and the
        sweeper recovers the job)."""
        self.mark_recording(job)
        written, status = self.write_retrying(
            lambda: self.state.jobs.fail(job, self.worker_id, error, retry=retry),
            jobs=[job],
            outcome="fail",
        )
        if not written:
            return None
        if status is None:
            self.report_lost(job, "fail")
        else:
            self.state.stats.count("cancelled" if status == Status.CANCELLED else "failed")
        return status

    def request_cancel(self, job_id: int, job: Job | None = None) -> None:
        """Tell the task of held job ``job_id`` (of this very claim, if ``job`` is given)
        that its job was cancelled: ``current_job().cancel_requested``, and an async
        task's coroutine is cancelled by the runner. Once per job."""
        with self.state.lock:
            entry = self.state.held.get(job_id) if job is None else self.state.entry(job)
            if entry is None or entry.cancel.is_set():
                return
            entry.cancel.set()
        logger.info(
            "job %s: cancellation requested; telling the task to stop",
            job_id,
            extra={"action": "cancel", "job_id": job_id, "worker_id": self.worker_id},
        )

    def report_lost(self, job: Job, outcome: str) -> None:
        """Count and log an outcome the fence refused: the lease was taken back."""
        self.state.stats.count("lost")
        logger.warning(
            "job %s: lease lost before %s was recorded; another worker owns it now",
            job.id,
            outcome,
            extra={"action": "lease_lost", "job_id": job.id, "worker_id": self.worker_id},
        )
