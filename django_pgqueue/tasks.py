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
    Seconds a run may take. A coroutine task is cancelled then. A plain task cannot be
    stopped: the worker stops extending the job's lease, so a hung task loses it within
    the lease (the sweeper hands the job to another worker), and a task that returns
    after its timeout has its attempt recorded as failed with ``JobTimeout`` (retried
    with backoff; a transactional task's effects roll back), never ``done``, or fenced
    out once the lease is gone. Overrides ``PGQUEUE_JOB_TIMEOUT_SECONDS``.
``max_attempts``
    Attempt limit for jobs of this task (default ``PGQUEUE_MAX_ATTEMPTS``).
``soft_time_limit``
    Seconds a job may run before :class:`~django_pgqueue.SoftTimeLimitExceeded` is
    raised inside the task (see the time limits how-to). Overrides
    ``PGQUEUE_SOFT_TIME_LIMIT``; ``Job.objects.enqueue(soft_time_limit=...)`` overrides it.
``time_limit``
    Seconds after which a job still running is failed with
    :class:`~django_pgqueue.TimeLimitExceeded` and its worker process replaced.
    Overrides ``PGQUEUE_TIME_LIMIT``; ``Job.objects.enqueue(time_limit=...)`` overrides it.
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
import inspect
import json
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import sync_to_async

from . import lifecycle, steps, validation
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

    soft_time_limit: float | None = None
    """Seconds a job may run before ``SoftTimeLimitExceeded`` is raised inside the task
    (None: ``PGQUEUE_SOFT_TIME_LIMIT``); ``Job.objects.enqueue(soft_time_limit=)``
    overrides it per job."""

    time_limit: float | None = None
    """Seconds after which a job still running is failed with ``TimeLimitExceeded`` and
    its worker process replaced (None: ``PGQUEUE_TIME_LIMIT``);
    ``Job.objects.enqueue(time_limit=)`` overrides it per job."""

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
        if self.soft_time_limit is not None:
            try:
                validation.time_limit(self.soft_time_limit, "soft_time_limit")
            except InvalidJob as exc:
                raise InvalidTask(str(exc)) from None
        if self.time_limit is not None:
            try:
                validation.time_limit(self.time_limit, "time_limit")
            except InvalidJob as exc:
                raise InvalidTask(str(exc)) from None
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

    __slots__ = ("_set", "_event", "_callback", "heeded")

    #: Guards the lazy creation of ``_event`` (shared: creations are rare).
    _creating = threading.Lock()

    def __init__(self) -> None:
        self._set = False
        self._event: threading.Event | None = None
        self._callback: Callable[[], object] | None = None
        #: The task was told (``cancel_requested`` read True, a wait ended by it, its
        #: coroutine cancelled): its end may be its stop, not its natural return.
        self.heeded = False

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True
        event = self._event
        if event is not None:
            event.set()
        callback = self._callback
        if callback is not None:
            self.heeded = True
            callback()

    def on_set(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` (on the thread that sets the flag) when the flag is set; at
        once, here, if it is set already. When the two race it may be called twice, so
        it must not mind that (cancelling a task twice is cancelling it)."""
        self._callback = callback
        if self._set:  # set() may have run before the callback was there
            self.heeded = True
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
    step_state: steps.StepState = field(default_factory=steps.StepState, repr=False, compare=False)
    """What this run knows of the job's durable steps (steps.py)."""

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

    # --- durable steps (steps.py) ---------------------------------------------------

    def _owner(self, what: str) -> steps.Owner:
        if self.alias is None:
            raise RuntimeError(f"{what} needs a job run by a worker")
        return steps.Owner(self.alias, self.id, self.worker_id, self.attempt, self.claimed_at)

    def _not_transactional(self, what: str) -> None:
        if self.transactional:
            raise RuntimeError(
                f"{what} is not available in a transactional task: the task is one "
                "transaction, so nothing it records survives a crash anyway (use "
                "run_step(..., transactional=True) in an ordinary task instead)"
            )

    def run_step(
        self,
        name: str,
        fn: Callable[..., Any],
        /,
        *args: Any,
        transactional: bool = False,
        **kwargs: Any,
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` as the durable step ``name`` of this job: the
        first run of the job that gets here calls it and records its return value
        (JSON, at most ``PGQUEUE_MAX_RESULT_BYTES``), fenced; every later run (a retry,
        a rescue after a crash, a snooze, a requeued dead letter) returns the recorded
        value (as JSON gives it back) without calling ``fn``. An exception in ``fn``
        propagates and records nothing. A plain step runs at least once; with
        ``transactional=True``, ``fn`` and the record share one transaction on the jobs
        database, so its database writes commit exactly once (``LeaseLost`` rolls them
        back if the job was taken from this worker). Raises ``InvalidStep`` for a bad
        or repeated name or a value JSON cannot hold. In a ``@task(transactional=True)``
        task, ``fn`` is simply called: the whole task commits once."""
        name = steps.begin(self.step_state, name)
        if self.transactional:
            return json.loads(steps.value_json(steps.STEP, name, fn(*args, **kwargs)))
        owner = self._owner("run_step()")
        return steps.run_step(
            self.step_state, owner, name, fn, args, kwargs, transactional=transactional
        )

    async def arun_step(
        self,
        name: str,
        fn: Callable[..., Any],
        /,
        *args: Any,
        transactional: bool = False,
        **kwargs: Any,
    ) -> Any:
        """``run_step`` from a coroutine task: ``fn`` may be a coroutine function (awaited
        here) or a plain one (run on the job's thread for sync calls). A transactional
        step takes a plain function: it runs, with its record, in one transaction on
        that thread."""
        name = steps.begin(self.step_state, name)
        owner = self._owner("arun_step()")
        state = self.step_state
        on_thread = sync_to_async(steps.run_step, thread_sensitive=True)
        if transactional:
            if inspect.iscoroutinefunction(fn):
                raise steps.InvalidStep(
                    f"step {name!r}: a transactional step takes a plain function (its "
                    "database writes and the record run in one transaction on one "
                    "thread), not a coroutine function"
                )
            return await on_thread(state, owner, name, fn, args, kwargs, transactional=True)
        if not inspect.iscoroutinefunction(fn):
            return await on_thread(state, owner, name, fn, args, kwargs, transactional=False)
        found, value = await sync_to_async(steps.recorded_step, thread_sensitive=True)(
            state, owner, name
        )
        if found:
            return value
        value = await fn(*args, **kwargs)
        return await sync_to_async(steps.finish_step, thread_sensitive=True)(
            state, owner, name, value
        )

    def cursor(self, name: str) -> steps.Cursor:
        """The cursor ``name`` of this job: ``.value`` is what any run of it last saved
        (None at first), ``.save(value)`` stores a new one, fenced (inside a
        transactional step, in its transaction). A resumed loop starts after the last
        saved position."""
        self._not_transactional("cursor()")
        return steps.cursor(self.step_state, self._owner("cursor()"), name)

    async def acursor(self, name: str) -> steps.Cursor:
        """``cursor`` from a coroutine task (save with ``await cur.asave(value)``)."""
        return await sync_to_async(self.cursor, thread_sensitive=True)(name)

    def sleep(self, seconds: float | dt.timedelta) -> None:
        """A durable sleep: the job goes back to ``scheduled`` for ``seconds`` (by the
        database's clock), spending no attempt (a snooze, counted against
        ``PGQUEUE_MAX_SNOOZES``); when it runs again, this sleep and every step before
        it are passed. It raises ``Snooze``: do not catch it."""
        self._not_transactional("sleep()")
        seconds = steps.sleep_seconds(seconds)
        steps.sleep(self.step_state, self._owner("sleep()"), seconds, None)

    def sleep_until(self, when: dt.datetime) -> None:
        """``sleep`` until the aware datetime ``when`` (at once if it is past)."""
        self._not_transactional("sleep_until()")
        steps.sleep(self.step_state, self._owner("sleep_until()"), None, steps.sleep_until(when))

    async def asleep(self, seconds: float | dt.timedelta) -> None:
        """``sleep`` from a coroutine task."""
        await sync_to_async(self.sleep, thread_sensitive=True)(seconds)

    async def asleep_until(self, when: dt.datetime) -> None:
        """``sleep_until`` from a coroutine task."""
        await sync_to_async(self.sleep_until, thread_sensitive=True)(when)

    @property
    def cancel_requested(self) -> bool:
        """True once ``Job.objects.cancel()`` asked for this job to stop (told within
        about a second by NOTIFY; without a LISTEN connection, at the worker's next
        lease extension). A long task should check it between steps and return (or
        raise ``JobCancelled``); the job ends ``cancelled`` either way."""
        if self.cancel.is_set():
            self.cancel.heeded = True
            return True
        return False


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
