"""Per-task options, the Django way, and what a running task may know about its job.

Django's ``@task(...)`` passes unknown keyword arguments to the backend's ``task_class``.
``PgQueueBackend.task_class`` is :class:`PgQueueTask`, so with this backend::

    @task(transactional=True, timeout=30, max_attempts=3)
    def charge(order_id: int) -> None: ...

``transactional=True``
    The task runs inside ``transaction.atomic()`` on the jobs database, and the worker
    marks the job done *in that same transaction*, fenced on (owner, attempt). If the
    lease was lost meanwhile, completion updates no row, the worker raises
    :class:`~django_pgqueue.exceptions.LeaseLost` and the task's database effects roll
    back: they commit exactly once. Cost: a transaction (and its row locks) stays open
    for the whole run of the task; keep such tasks short.
``timeout``
    Seconds after which the worker stops extending the job's lease. A hung task then
    loses its lease, the sweeper hands the job to another worker, and the late
    completion of the hung one is fenced out. Overrides ``PGQUEUE_JOB_TIMEOUT_SECONDS``.
``max_attempts``
    Attempt limit for jobs of this task (default ``PGQUEUE_MAX_ATTEMPTS``).
``concurrency_key``
    The budget this task's jobs are counted in by ``PGQUEUE_LIMITS`` and fair turns: a
    str, or a callable of the call's args and kwargs (``lambda tenant_id, **_:
    f"tenant:{tenant_id}"``). See the flow control how-to.
``tags``
    Tags every job of this task carries (``tags=["billing"]``); a call's
    ``Job.objects.enqueue(..., tags=[...])`` adds its own. Shown and filtered by in the
    admin, and ``pgqueue_status --tag``.

Ordinary (non-transactional) tasks run at least once. To make their effects
idempotent they can read :func:`current_job` (job id, attempt, idempotency key), or,
with ``takes_context=True``, ``context.task_result.id`` and ``context.attempt``.
"""

from __future__ import annotations

import contextvars
import datetime as dt
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import sync_to_async

from . import lifecycle, validation
from .exceptions import InvalidJob
from .taskapi import InvalidTask, Task


@dataclass(frozen=True, slots=True, kw_only=True)
class PgQueueTask(Task):
    """A Django ``Task`` with django-pgqueue's options (kept by ``Task.using()``)."""

    transactional: bool = False
    """Run the task and its fenced completion in one transaction (exactly-once effects)."""

    timeout: float | None = None
    """Stop extending the lease after this many seconds of running (None: setting)."""

    max_attempts: int | None = None
    """Attempt limit of this task's jobs (None: ``PGQUEUE_MAX_ATTEMPTS``)."""

    backoff: Callable[[BaseException, Any], float | dt.timedelta | None] | None = None
    """``backoff(exception, task_result)``: seconds (or a timedelta) before the retry of
    a failed attempt (``task_result.attempts`` is the attempt that failed); None, or
    None returned: the exponential backoff of ``PGQUEUE_RETRY_BACKOFF_*``."""

    concurrency_key: str | Callable[..., str] | None = None
    """The concurrency key of this task's jobs (see ``PGQUEUE_LIMITS``): a str, or a
    callable given the call's args and kwargs that returns one (None: no key)."""

    tags: tuple[str, ...] | list[str] | None = None
    """Tags every job of this task carries (checked as ``validation.tags``)."""

    def __post_init__(self) -> None:
        if self.tags is not None:
            try:
                object.__setattr__(self, "tags", tuple(validation.tags(self.tags)))
            except InvalidJob as exc:
                raise InvalidTask(str(exc)) from None
        if not isinstance(self.transactional, bool):
            raise InvalidTask(f"transactional must be True or False, not {self.transactional!r}")
        if self.timeout is not None and (
            isinstance(self.timeout, bool)
            or not isinstance(self.timeout, int | float)
            or not math.isfinite(self.timeout)
            or self.timeout <= 0
        ):
            raise InvalidTask(f"timeout must be a positive number of seconds: {self.timeout!r}")
        if self.max_attempts is not None and (
            isinstance(self.max_attempts, bool)
            or not isinstance(self.max_attempts, int)
            or self.max_attempts < 1
        ):
            raise InvalidTask(f"max_attempts must be an int >= 1, not {self.max_attempts!r}")
        if self.concurrency_key is not None and not callable(self.concurrency_key):
            try:
                validation.concurrency_key(self.concurrency_key)
            except InvalidJob as exc:
                raise InvalidTask(str(exc)) from None
        if self.backoff is not None and not callable(self.backoff):
            raise InvalidTask(
                f"backoff must be a callable (exception, task_result), not {self.backoff!r}"
            )
        super(PgQueueTask, self).__post_init__()  # noqa: UP008 - slots dataclass needs it


class CancelFlag:
    """Set once a job's cancellation was requested; what ``threading.Event`` offers
    (``is_set``, ``set``, ``wait``) at a fraction of its cost to create. The worker
    makes one per claimed job and almost never sets it, so the ``Event`` (a lock and a
    condition) behind ``wait`` is only made when something waits. A callback given to
    :meth:`on_set` is called when it is set (the event loop cancels a coroutine job
    through it)."""

    __slots__ = ("_set", "_event", "_callback")

    #: Guards the lazy creation of ``_event`` (shared: creations are rare).
    _creating = threading.Lock()

    def __init__(self) -> None:
        self._set = False
        self._event: threading.Event | None = None
        self._callback: Callable[[], object] | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True
        event = self._event
        if event is not None:
            event.set()
        callback = self._callback
        if callback is not None:
            callback()

    def on_set(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` (on the thread that sets the flag) when the flag is set; at
        once, here, if it is set already. When the two race it may be called twice, so
        it must not mind that (cancelling a task twice is cancelling it)."""
        self._callback = callback
        if self._set:  # set() may have run before the callback was there
            callback()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until set (True) or until ``timeout`` seconds passed (False)."""
        if self._set:
            return True
        with CancelFlag._creating:
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        if self._set:  # set() ran before the event existed, so it did not set it
            event.set()
        return event.wait(timeout)

    def __repr__(self) -> str:
        return f"<CancelFlag {'set' if self._set else 'unset'}>"


@dataclass(frozen=True, slots=True)
class CurrentJob:
    """The job a worker thread is running right now."""

    id: int
    attempt: int
    max_attempts: int
    idempotency_key: str | None
    queue: str
    worker_id: str
    transactional: bool
    run_at: dt.datetime | None = None
    """When the job was due: for a periodic job, the tick it was enqueued for."""
    cancel: CancelFlag = field(default_factory=CancelFlag, repr=False, compare=False)
    """Set once the worker learns that the job's cancellation was requested."""
    snoozes: int = 0
    """How often the job snoozed before this run (``raise Snooze(seconds)``)."""
    claimed_at: dt.datetime | None = field(default=None, repr=False)
    """When this attempt was claimed: with ``attempt``, the fence of its writes."""
    alias: str | None = field(default=None, repr=False)
    """The jobs database the worker runs this job from."""

    def set_progress(self, value: Any) -> None:
        """Store ``value`` (JSON, at most ``PGQUEUE_MAX_PROGRESS_BYTES``) as the job's
        progress, readable while it runs (``Job.progress``) and kept when it ends: one
        fenced UPDATE by primary key. Raises ``InvalidJob`` for a bad value and
        ``LeaseLost`` if the worker no longer owns the job. In a coroutine task, use
        ``await aset_progress(value)``; a transactional task cannot (its open
        transaction would hold the job's row, and the worker's heartbeat behind it)."""
        if self.transactional:
            raise RuntimeError(
                "set_progress() is not available in a transactional task: the write would "
                "lock the job's row until the task commits, blocking the worker's lease "
                "extensions (and nobody would see it before the commit)"
            )
        if self.alias is None:
            raise RuntimeError("set_progress() needs a job run by a worker")
        lifecycle.set_progress(
            self.alias, self.id, self.worker_id, self.attempt, self.claimed_at, value
        )

    async def aset_progress(self, value: Any) -> None:
        """``set_progress`` from a coroutine task, on the thread its sync calls run on
        (a coroutine job's lane, or the runner thread of one run there)."""
        await sync_to_async(self.set_progress, thread_sensitive=True)(value)

    def parents(self) -> list[lifecycle.ParentOutcome]:
        """The jobs this one depended on (``depends_on``, a chain's previous step, a
        group's members), in order, with how each finished: what a job enqueued with
        ``on_parent_failure="run"`` reads to learn which parent failed (its first
        argument, a parent's result or the list of them, holds None for a failed one).
        One query on the jobs database; [] for a job without parents."""
        if self.alias is None:
            raise RuntimeError("parents() needs a job run by a worker")
        return lifecycle.parents(self.alias, self.id)

    async def aparents(self) -> list[lifecycle.ParentOutcome]:
        """``parents()`` from a coroutine task."""
        return await sync_to_async(self.parents, thread_sensitive=True)()

    @property
    def cancel_requested(self) -> bool:
        """True once ``Job.objects.cancel()`` asked for this job to stop (told within
        about a second by NOTIFY; without a LISTEN connection, at the worker's next
        lease extension). A long task should check it between steps and return (or
        raise ``JobCancelled``); the job ends ``cancelled`` either way."""
        return self.cancel.is_set()


class RunningJob:
    """What a worker sets as the job being run (``_current``): the job, and what the
    worker knows of this run of it. Its :class:`CurrentJob` is made the first time
    something asks for it (``current_job()``): most tasks never do, and making one
    for every job cost a tenth of a no-op job."""

    __slots__ = ("job", "worker_id", "transactional", "cancel", "alias", "lane_calls", "_made")

    def __init__(
        self, job: Any, worker_id: str, transactional: bool, cancel: CancelFlag, alias: str
    ) -> None:
        self.job = job  # a claimed Job (typed Any: the models sit above this module)
        self.worker_id = worker_id
        self.transactional = transactional
        self.cancel = cancel
        self.alias = alias
        #: Calls this (coroutine) job made on its lane thread (see ``worker/coroutines.py``).
        self.lane_calls = 0
        self._made: CurrentJob | None = None

    def current(self) -> CurrentJob:
        """This run's :class:`CurrentJob`, made once."""
        made = self._made
        if made is None:
            job = self.job
            made = self._made = CurrentJob(
                id=job.id,
                attempt=job.attempts,
                max_attempts=job.max_attempts,
                idempotency_key=job.idempotency_key,
                queue=job.queue,
                worker_id=self.worker_id,
                transactional=self.transactional,
                run_at=job.run_at,
                cancel=self.cancel,
                snoozes=job.snoozes,
                claimed_at=job.last_attempted_at,
                alias=self.alias,
            )
        return made


_current: contextvars.ContextVar[RunningJob | None] = contextvars.ContextVar(
    "pgqueue_current_job", default=None
)


def current_job() -> CurrentJob | None:
    """The job being run by this thread, or by this coroutine task (None outside a
    worker).

    Ordinary tasks run at least once: key their effects on ``id`` (or on the
    ``idempotency_key`` given at enqueue) so a second run changes nothing."""
    running = _current.get()
    return None if running is None else running.current()


def task_option(task: Task, name: str) -> Any:
    """A django-pgqueue option of ``task``, or None for a plain Django ``Task``."""
    return getattr(task, name, None)
