"""One typed settings object for django-pgqueue.

Every attribute of :class:`Settings` is a default. Reading ``settings.NAME`` looks up
``django.conf.settings.PGQUEUE_NAME`` on its first access and keeps the value until a
``setting_changed`` signal names a ``PGQUEUE_*`` setting, so ``override_settings`` (and
pytest-django's ``settings`` fixture) work in tests and nothing is read at import time.
The cache is there because the worker reads several settings for every job: a lookup
through ``django.conf.settings`` costs about 3 µs, a dictionary hit a tenth of that.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed

#: Values read so far, by name without the ``PGQUEUE_`` prefix (see the module
#: docstring); ``_DEFAULT`` for a setting the project does not set.
_read: dict[str, Any] = {}
_DEFAULT = object()


class Settings:
    """Defaults for every ``PGQUEUE_*`` setting (the docs' reference table is built from
    these attributes and their docstrings)."""

    DATABASE: str | None = None
    """Fallback only: the jobs database of a ``TASKS`` backend whose ``OPTIONS`` has no
    ``DATABASE`` (None: where the database routers send the ``Job`` model, "default"
    without routers). Prefer ``OPTIONS["DATABASE"]``; a check (pgqueue.E050) reports a
    default backend whose ``OPTIONS["DATABASE"]`` disagrees with it."""

    LEASE_SECONDS: float = 300.0
    """How long a claimed job stays leased before the sweeper may take it back.
    A worker's heartbeat extends it while the task runs."""

    MAX_ATTEMPTS: int = 5
    """Default attempt limit; attempts are charged at claim, so crashes count."""

    RETRY_BACKOFF_BASE: float = 2.0
    """Seconds before the first retry; doubles each attempt (plus jitter)."""

    RETRY_BACKOFF_MAX: float = 3600.0
    """Upper bound on one retry delay, in seconds."""

    MAX_SNOOZES: int = 100
    """How often one job may snooze (``raise Snooze(seconds)``); the next snooze fails
    the job with ``SnoozeLimitExceeded`` (not retried)."""

    MAX_PROGRESS_BYTES: int = 10_000
    """Largest JSON size of one ``current_job().set_progress(value)``; a larger value
    raises ``InvalidJob`` and stores nothing."""

    RETENTION_SECONDS: float = 7 * 24 * 3600.0
    """How long ``done`` jobs are kept before the sweeper deletes them."""

    CANCELLED_RETENTION_SECONDS: float | None = 7 * 24 * 3600.0
    """How long ``cancelled`` jobs are kept before the sweeper deletes them (None: kept)."""

    DEAD_RETENTION_SECONDS: float | None = None
    """How long dead letters are kept before the sweeper deletes them. None (the default):
    until an operator requeues or discards them in the admin."""

    SWEEP_BATCH_SIZE: int = 1000
    """Rows one sweeper statement touches at most (keeps locks and WAL bursts small)."""

    KEEP_ERRORS: int = 10
    """How many error entries (one per failed attempt) a job keeps, newest last."""

    POLL_INTERVAL: float = 1.0
    """Seconds an idle worker waits for a NOTIFY before it polls anyway."""

    NOTIFY_CHANNEL: str = "pgqueue_job"
    """LISTEN/NOTIFY channel on which enqueues wake idle workers."""

    MAX_PAYLOAD_BYTES: int = 1_000_000
    """Largest accepted JSON size of args + kwargs for one job."""

    MAX_RESULT_BYTES: int = 16_000_000
    """Largest accepted JSON size of a task's return value: a larger one fails its job
    (dead, not retried) with this limit named, instead of a database error."""

    JOB_TIMEOUT_SECONDS: float | None = None
    """How long a run may take (None: no limit; a task's own ``timeout`` wins). A
    coroutine task is cancelled then; a plain task's lease stops being extended (the
    sweeper recovers a hung task), and its return after the limit fails the attempt
    with JobTimeout (retried), never done."""

    SOFT_TIME_LIMIT: float | None = None
    """Seconds a job may run before ``SoftTimeLimitExceeded`` is raised inside its task
    (None: no limit); ``@task(soft_time_limit=...)`` and ``Job.objects.enqueue(...,
    soft_time_limit=...)`` override it."""

    TIME_LIMIT: float | None = None
    """Seconds after which a job still running is recorded failed with
    ``TimeLimitExceeded`` and its worker process replaced (None: no limit);
    ``@task(time_limit=...)`` and ``Job.objects.enqueue(..., time_limit=...)`` override it."""

    SHUTDOWN_GRACE_SECONDS: float | None = None
    """After the first SIGTERM, how long running tasks may take before the worker
    gives up on them (None: wait for them)."""

    SUPERVISOR_STOP_SECONDS: float = 300.0
    """After the first SIGTERM, how long a ``--processes`` supervisor waits for its
    worker processes to exit before it SIGKILLs those still running (their jobs come
    back at lease expiry); also how long a worker process whose supervisor died may
    drain on its own. Keep it above ``SHUTDOWN_GRACE_SECONDS``."""

    BURST_CONNECT_TIMEOUT: float = 60.0
    """How long a ``--burst`` worker retries through database errors (an unreachable
    server) before it gives up and exits with code 3, naming the database."""

    ASYNC_CONCURRENCY: int = 100
    """Coroutine jobs (of ``async def`` tasks, not transactional) a worker process runs
    side by side on its event loop, besides its ``--concurrency`` thread slots;
    ``--async-concurrency`` overrides it. A coroutine waiting on I/O holds no thread and
    no database connection, only a few kilobytes, so a hundred cost little; 0 runs
    coroutine tasks on the thread slots instead, one at a time per slot."""

    ASYNC_THREADS: int = 4
    """Threads (each with its own database connection, opened when first used) on which
    a worker's coroutine jobs make their blocking calls: their Django ORM calls
    (``sync_to_async``) and the worker's own writes for them. Each job keeps one of
    them; many jobs share each. The bound on the connections coroutine jobs use."""

    COMPLETION_FLUSH_INTERVAL: float = 0.01
    """Longest wait, in seconds, between a job's success and the batched write that
    records it (jobs stay leased meanwhile), while other jobs of the worker are running
    or waiting to run: larger batches cost fewer commits. With nothing else in flight
    the write goes out at once, unless the interval is above one second, which holds
    every completion that long."""

    COMPLETION_BATCH_SIZE: int = 100
    """Most successful jobs one completion write records (one statement)."""

    FRAMEWORK_LOG_LINES: bool | None = None
    """Whether the worker has Django's own per-job log lines written (``Task id=...
    state=RUNNING``, then ``SUCCESSFUL`` or ``FAILED``, from the framework's receivers
    of ``task_started`` and ``task_finished`` on the ``django.tasks`` logger) beside
    its own line per job, which says the same and more (id, task, outcome, duration,
    attempt). None: only where they would be written somewhere the worker's own line
    is not (a handler on ``django.tasks`` or ``django`` that the worker's line does not
    reach). True: wherever logging sends them. False: never. Other receivers of the
    two signals get every signal in all three cases."""

    CHECK_SESSION_STATE: bool = True
    """After an ordinary task that opened a cursor on a connection, check with one round
    trip what it left on that session: SET ROLE, a SET of a setting that changes what
    SQL means (search_path, timeouts, TimeZone, ...), an advisory lock, an open cursor,
    PREPARE, LISTEN or a temporary table fail the job with TransactionLeak and discard
    the connection; any other setting and setseed() are reset. False skips that round
    trip (nothing compared or reset); open transactions are still caught (free)."""

    PERIODIC: dict[str, dict[str, Any]] | None = None
    """Periodic jobs, by name: ``{"name": {"task": "app.tasks.f", "cron": "0 3 * * *"}}``,
    optionally with ``args``, ``kwargs``, ``queue``, ``priority``, ``timezone`` (default
    ``TIME_ZONE``), ``max_attempts``, ``enabled`` and ``backend`` (the ``TASKS`` alias of
    its jobs, default ``"default"``; the sweepers of that alias's database enqueue them)
    and ``unique_for`` (seconds: a tick makes a job only outside the window of the last
    one, key ``periodic:<name>``). Every ``pgqueue_sweep`` pass enqueues each due tick
    once (see the periodic jobs how-to)."""

    LIMITS: dict[str, dict[str, Any]] | None = None
    """Flow control limits, by key: ``{"stripe": {"concurrency": 2}, "tenant:*":
    {"concurrency": 5, "rate": "10/s"}, "queue:emails": {"rate": "100/m"}}``. An exact
    key is one budget shared by all jobs with that ``concurrency_key``; a key ending in
    ``*`` gives each matching key a budget of its own; ``queue:NAME`` limits a whole
    queue. ``concurrency``: most jobs running at once; ``rate``: most starts in any
    sliding window of a second, minute or hour (``"R/s"``, ``"R/m"``, ``"R/h"``). These
    are the declared defaults: ``Job.objects.set_limit()`` and the admin change them at
    run time (see the flow control how-to)."""

    FAIR_QUEUES: list[str] | None = None
    """Queues whose pending jobs of one priority are claimed round-robin across their
    concurrency keys, so a small key is not stuck behind a big one's backlog."""

    CLAIM_RESCAN_SECONDS: float = 5.0
    """A busy worker resumes each claim after its previous one rather than at the head
    of the claim index (which a long transaction elsewhere can fill with entries that
    cannot be cleaned up); it claims from the head at least this often, which is how
    long a retried or released job of the same priority may wait beyond its turn."""

    LOST_WORKER_SECONDS: float = 600.0
    """How long a lost worker (not seen for longer than its lease: killed, or cut off
    from the database) stays listed as lost before the sweeper deletes its row."""

    METRICS_TOKEN: str | None = None
    """Bearer token that lets a scraper read ``django_pgqueue.metrics.view``
    (``Authorization: Bearer <token>``); staff sessions with the ``view_job`` permission
    may read it too. None: those sessions only."""

    METRICS_MAX_QUEUES: int = 100
    """Most queues the Prometheus metrics list by name, the largest first (jobs pending,
    scheduled, running and dead, then done in the last 5 minutes); the figures of the
    rest are summed under ``queue="_other"`` so a scrape's size stays bounded however
    many queues there are. 0: every queue under ``_other``."""

    def __getattribute__(self, name: str) -> Any:
        if name.isupper():
            try:
                value = _read[name]
            except KeyError:
                value = _read[name] = getattr(django_settings, f"PGQUEUE_{name}", _DEFAULT)
            # Not set: the class's default, read each time (it is an attribute here).
            return object.__getattribute__(self, name) if value is _DEFAULT else value
        return object.__getattribute__(self, name)


settings = Settings()


def _forget(*, setting: str, **kwargs: Any) -> None:
    """Drop the values read so far when a ``PGQUEUE_*`` setting changes (or all of
    them when the settings module itself is swapped)."""
    if setting.startswith("PGQUEUE_") or setting == "SETTINGS_MODULE":
        _read.clear()


setting_changed.connect(_forget, dispatch_uid="django_pgqueue.conf.forget")
