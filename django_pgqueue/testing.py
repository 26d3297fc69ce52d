"""Testing your tasks: assert what was enqueued, and run the due jobs in the test.

For a project's own tests, against the real jobs table (no mock), from Django's
``TestCase`` and ``TransactionTestCase`` and from pytest (the ``pgqueue`` fixture of
``pytest_plugin`` gives these functions)::

    from django_pgqueue.testing import assert_enqueued, run_jobs

    sign_up("ada@example.com")
    assert_enqueued(send_welcome, args=["ada@example.com"])
    summary = run_jobs()
    assert summary.done == 1

:func:`run_jobs` runs each due job through the worker's own paths: the claim statement
and its lease, the runner that calls the task (``current_job()``, ``Snooze``, ``Retry``,
progress, transactional tasks) and the fenced writes of its outcome (retries with
backoff, dead letters, a workflow's dependants released, flow-control limits), on the
caller's thread and connection (``worker/inline.py``). Inside a ``TestCase`` the jobs
the code under test enqueued in the test's transaction are seen and run, and nothing
commits; in a ``TransactionTestCase`` (or pytest-django's ``transaction=True``) each
job commits as under a worker.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from . import validation
from .conf import settings
from .databases import backend_database
from .exceptions import TooManyJobs
from .models import Job
from .states import Status
from .taskapi import DEFAULT_TASK_BACKEND_ALIAS, task_backends
from .worker.inline import InlineRunner, Ran
from .worker.loop import default_worker_id

__all__ = [
    "MAX_JOBS",
    "JobRun",
    "RunSummary",
    "assert_enqueued",
    "assert_not_enqueued",
    "enqueued",
    "run_jobs",
]

#: The statuses of an enqueued job: waiting for its time (``scheduled``) or for a worker
#: (``pending``). A filter on ``status`` given to the functions below replaces them.
ENQUEUED = (Status.PENDING, Status.SCHEDULED)
#: The most jobs :func:`run_jobs` runs without a ``limit`` before it raises
#: :class:`~django_pgqueue.exceptions.TooManyJobs`.
MAX_JOBS = 1000
#: The most jobs an assertion's message lists.
SHOWN = 10


# --- what is enqueued ---------------------------------------------------------------


def enqueued(task: Any = None, **filters: Any) -> list[Job]:
    """The enqueued (pending or scheduled) jobs of ``task`` (a Task or its dotted path;
    None: any), oldest first, that match ``filters``: ``args`` and ``kwargs`` (compared
    as the stored JSON, whole), ``queue``, ``priority``, and any other lookup of
    :class:`~django_pgqueue.models.Job` (``idempotency_key=...``, ``run_at__gt=...``;
    ``status=...`` replaces pending-or-scheduled)."""
    return list(_Query(task, filters).jobs().order_by("id"))


def assert_enqueued(
    task: Any = None,
    *,
    args: Any = None,
    kwargs: Any = None,
    queue: str | None = None,
    priority: int | None = None,
    count: int | None = None,
    **fields: Any,
) -> list[Job]:
    """Assert that jobs of ``task`` matching the given arguments are enqueued (pending
    or scheduled; see :func:`enqueued`): at least one, or exactly ``count``. Return
    them, oldest first. The ``AssertionError`` lists what is enqueued for that task (or
    the closest jobs), with their args, kwargs, queue and priority, so that a wrong
    argument shows."""
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
        raise ValueError(f"count must be an int >= 0, not {count!r}")
    query = _Query(task, _criteria(args, kwargs, queue, priority, fields))
    found = list(query.jobs().order_by("id"))
    if (len(found) == count) if count is not None else bool(found):
        return found
    wanted = "no job" if count == 0 else "a job" if count is None else _jobs(count)
    raise AssertionError(
        f"expected {wanted} {query.describe()}; found {len(found)}.\n{query.nearby(found)}"
    )


def assert_not_enqueued(
    task: Any = None,
    *,
    args: Any = None,
    kwargs: Any = None,
    queue: str | None = None,
    priority: int | None = None,
    **fields: Any,
) -> None:
    """Assert that no job of ``task`` matching the given arguments is enqueued (see
    :func:`assert_enqueued`); the ``AssertionError`` lists the jobs that match."""
    if "count" in fields:
        raise TypeError("assert_not_enqueued() takes no count: use assert_enqueued(count=...)")
    query = _Query(task, _criteria(args, kwargs, queue, priority, fields))
    found = list(query.jobs().order_by("id"))
    if found:
        raise AssertionError(
            f"expected no job {query.describe()}; found {len(found)}:\n{_listing(found)}"
        )


def _criteria(
    args: Any, kwargs: Any, queue: str | None, priority: int | None, fields: dict[str, Any]
) -> dict[str, Any]:
    named = {"args": args, "kwargs": kwargs, "queue": queue, "priority": priority}
    return {**{name: value for name, value in named.items() if value is not None}, **fields}


def _jobs(n: int) -> str:
    return f"{n} job" if n == 1 else f"{n} jobs"


class _Query:
    """Jobs of one task (or any) matching some criteria, in the default backend's jobs
    database; ``args`` and ``kwargs`` are validated and compared as the stored JSON."""

    def __init__(self, task: Any, criteria: Mapping[str, Any]) -> None:
        self.alias = backend_database(None)
        self.task = None if task is None else validation.task_path(task)
        self.criteria = dict(criteria)
        if "args" in self.criteria or "kwargs" in self.criteria:
            args_json, kwargs_json = validation.payload(
                self.criteria.get("args", ()),
                self.criteria.get("kwargs"),
                max_bytes=2**62,
            )
            if "args" in self.criteria:
                self.criteria["args"] = json.loads(args_json)
            if "kwargs" in self.criteria:
                self.criteria["kwargs"] = json.loads(kwargs_json)
        self.any_status = any(
            name == "status" or name.startswith("status__") for name in self.criteria
        )

    def live(self) -> Any:
        """The enqueued jobs (or those of the status asked for), of any task."""
        jobs = Job.objects.using(self.alias).all()
        return jobs if self.any_status else jobs.filter(status__in=ENQUEUED)

    def jobs(self) -> Any:
        jobs = self.live().filter(**self.criteria)
        return jobs if self.task is None else jobs.filter(task=self.task)

    def describe(self) -> str:
        """``of app.tasks.send with args=[1], queue='mail'``."""
        parts = [f"{name}={_show(value)}" for name, value in self.criteria.items()]
        what = f"of {self.task}" if self.task else "of any task"
        where = "" if self.any_status else " pending or scheduled"
        return f"{what}{' with ' + ', '.join(parts) if parts else ''}{where}"

    def nearby(self, found: list[Job]) -> str:
        """What the message shows beside a failed assertion: the task's enqueued jobs,
        or, if it has none, the enqueued jobs closest to what was asked."""
        if found:
            return f"Those found:\n{_listing(found)}"
        if self.task is not None:
            own = list(self.live().filter(task=self.task).order_by("id")[: SHOWN + 1])
            if own:
                total = self.live().filter(task=self.task).count()
                return f"Enqueued jobs of {self.task} ({total}):\n{_listing(own, total)}"
        others = list(self.live().order_by("-id")[:200])
        if not others:
            return "No job is enqueued." if not self.any_status else "No job matches."
        others.sort(key=lambda job: (-self._closeness(job), job.id))
        heading = (
            f"No job of {self.task} is enqueued; the closest"
            if self.task is not None
            else "The closest"
        )
        return f"{heading} of those enqueued:\n{_listing(others[:SHOWN])}"

    def _closeness(self, job: Job) -> int:
        """How many of the task, args, kwargs, queue and priority asked for ``job`` has."""
        score = int(self.task is not None and job.task == self.task)
        for name in ("args", "kwargs", "queue", "priority"):
            if name in self.criteria and getattr(job, name) == self.criteria[name]:
                score += 1
        return score


def _show(value: Any) -> str:
    """A value of a job or a criterion in a message: JSON for args and kwargs (as
    stored), ``repr`` for the rest; cut to 200 characters."""
    if isinstance(value, list | dict):
        try:
            text = json.dumps(value, ensure_ascii=False)
        except (TypeError, ValueError):
            text = repr(value)
        return text if len(text) <= 200 else text[:197] + "..."
    return validation.show(value, 200)


def _listing(jobs: list[Job], total: int | None = None) -> str:
    """One line per job (at most ``SHOWN``): id, status, task, args, kwargs, queue,
    priority, and when a scheduled one is due."""
    lines = []
    for job in jobs[:SHOWN]:
        due = f" run_at={job.run_at.isoformat()}" if job.status == Status.SCHEDULED else ""
        lines.append(
            f"  #{job.id} {job.status} {job.task} args={_show(job.args)} "
            f"kwargs={_show(job.kwargs)} queue={job.queue!r} priority={job.priority}{due}"
        )
    more = (total if total is not None else len(jobs)) - len(lines)
    if more > 0:
        lines.append(f"  ... and {more} more")
    return "\n".join(lines)


# --- running the due jobs -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JobRun:
    """One run of a job by :func:`run_jobs`."""

    #: The job as it stood right after this run (its status, result, errors, attempts).
    job: Job
    #: ``done``, ``retried`` (the attempt failed; the job is scheduled again),
    #: ``dead``, ``cancelled`` or ``snoozed`` (or ``deleted``: the task deleted its own
    #: job, and ``job`` is the job as claimed).
    outcome: str
    #: The exception that failed the attempt (None: it did not fail).
    error: BaseException | None = None


@dataclass(frozen=True, slots=True)
class RunSummary:
    """What :func:`run_jobs` did: each run, in order, and their counts by outcome."""

    runs: tuple[JobRun, ...]

    @property
    def jobs(self) -> list[Job]:
        """The jobs run, in order, each as it stood right after its run (a job retried
        within the call appears once per run)."""
        return [run.job for run in self.runs]

    @property
    def counts(self) -> dict[str, int]:
        """Runs by outcome (``{"done": 2, "retried": 1}``), outcomes with none left out."""
        return dict(Counter(run.outcome for run in self.runs))

    @property
    def done(self) -> int:
        return self._count("done")

    @property
    def retried(self) -> int:
        return self._count("retried")

    @property
    def dead(self) -> int:
        return self._count("dead")

    @property
    def cancelled(self) -> int:
        return self._count("cancelled")

    @property
    def snoozed(self) -> int:
        return self._count("snoozed")

    def _count(self, outcome: str) -> int:
        return sum(1 for run in self.runs if run.outcome == outcome)

    def __len__(self) -> int:
        return len(self.runs)

    def __repr__(self) -> str:
        counts = ", ".join(f"{name}={n}" for name, n in self.counts.items())
        return f"<RunSummary: {_jobs(len(self.runs))} run{': ' + counts if counts else ''}>"


def run_jobs(
    *,
    queue: str | Iterable[str] | None = None,
    task: Any = None,
    limit: int | None = None,
    now: dt.datetime | None = None,
    raise_errors: bool = False,
) -> RunSummary:
    """Run the due jobs in this thread, one at a time, as a worker runs them, until none
    is due: a chain runs to its end, a job a task enqueues runs too, a retry runs again
    once its backoff is over by the clock. Return a :class:`RunSummary`.

    ``queue``: only jobs of that queue (or those queues). ``task``: only jobs of that
    task (a Task or its dotted path); jobs of other tasks ahead of them in line are
    claimed and given back unrun (pending, their attempt not charged), as a worker
    gives back a job at shutdown. ``limit``: run at most that many jobs; without it,
    :class:`~django_pgqueue.exceptions.TooManyJobs` is raised once :data:`MAX_JOBS`
    ran and more are due.

    Due means pending by the database's clock, or at ``now`` (an aware datetime): a job
    scheduled for later (a retry's backoff, a snooze, ``run_at``, a debounced job) is
    made pending by the sweeper's statement once it is due at that time, and not run
    before. ``now`` is the clock of the claim (its lease, a rate limit's window) and of
    that promotion; what a job's outcome writes (a retry's next run time) is reckoned
    from the database's clock, as a worker's is. So ``run_jobs(now=a_day_later)`` runs
    a failing task's retries until it is dead.

    ``raise_errors=True``: the first exception that fails an attempt (the task's, or
    an import error of its module; not a ``Snooze``, and not that of a job that ends
    ``cancelled``) is raised again, with its traceback, once the failure is written
    (the job is ``scheduled`` for its retry, or ``dead``, as a worker leaves it); no
    job runs after it.

    No job is left ``running``: a job whose outcome could not be written is given back
    and :class:`~django_pgqueue.exceptions.NotRecorded` raised.
    """
    queues = _queues(queue)
    path = None if task is None else validation.task_path(task)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be an int >= 1 or None, not {limit!r}")
    if now is not None and (not isinstance(now, dt.datetime) or now.tzinfo is None):
        raise ValueError(f"now must be a timezone-aware datetime or None, not {now!r}")
    alias = backend_database(None)
    run = _Run(alias, queues, now)
    runs: list[JobRun] = []
    with InlineRunner(
        alias=alias,
        worker_id=run.worker_id,
        lease_seconds=float(settings.LEASE_SECONDS),
        sender=type(task_backends[DEFAULT_TASK_BACKEND_ALIAS]),
    ) as runner:
        set_aside: list[Job] = []
        try:
            while limit is None or len(runs) < limit:
                job = run.claim()
                if job is None:
                    if run.promote():
                        continue
                    break
                if path is not None and job.task != path:
                    set_aside.append(job)  # held, so that the next claim passes it
                    continue
                if limit is None and len(runs) >= MAX_JOBS:
                    set_aside.append(job)
                    raise TooManyJobs(_runaway(runs, job))
                runs.append(run.ended(runner.run(job)))
                error = runs[-1].error
                if raise_errors and error is not None and runs[-1].outcome != "cancelled":
                    raise error
        finally:
            for job in set_aside:
                runner.release(job)
    return RunSummary(tuple(runs))


def _queues(queue: str | Iterable[str] | None) -> list[str] | None:
    if queue is None:
        return None
    names = [queue] if isinstance(queue, str) else list(queue)
    if not names:
        raise ValueError("queue must name at least one queue, or be None (every queue)")
    return [validation.queue_name(name) for name in names]


def _runaway(runs: list[JobRun], due: Job) -> str:
    """The message of ``TooManyJobs``: which tasks ran most."""
    tasks = Counter(run.job.task for run in runs).most_common(3)
    most = ", ".join(f"{name} ({n})" for name, n in tasks)
    return (
        f"run_jobs ran {len(runs)} jobs (MAX_JOBS) and more are due (job {due.id}, "
        f"{due.task}): a task that enqueues itself for ever? Most run: {most}. Pass "
        "limit= to run a bounded number of jobs."
    )


class _Run:
    """One call of :func:`run_jobs`: its claims, as a worker of ``queues`` makes them,
    and the outcome of each run."""

    def __init__(self, alias: str, queues: list[str] | None, now: dt.datetime | None) -> None:
        self.jobs = Job.objects.db_manager(alias)
        self.queues = queues
        self.now = now
        self.worker_id = f"run_jobs:{default_worker_id()}"
        self.lease_seconds = float(settings.LEASE_SECONDS)
        #: Where each fair queue's turns resume (a worker keeps them between claims).
        self.cursors: dict[str, str] = {}

    def claim(self) -> Job | None:
        """Lease the next due job (``Job.objects.claim``, or ``claim_flow`` while limits,
        fair queues or a pause apply), at ``now``; None if there is none."""
        view = self.jobs.flow_view()
        if view.in_force(self.queues):
            flowed = self.jobs.claim_flow(
                self.worker_id,
                limit=1,
                view=view,
                queues=self.queues,
                lease_seconds=self.lease_seconds,
                cursors=self.cursors,
                now=self.now,
            )
            self.cursors = flowed.cursors
            jobs = flowed.jobs
        else:
            jobs = self.jobs.claim(
                self.worker_id,
                limit=1,
                queues=self.queues,
                lease_seconds=self.lease_seconds,
                now=self.now,
                flow_view=view,
            )
        return jobs[0] if jobs else None

    def promote(self) -> int:
        """Make the scheduled jobs due at ``now`` pending, as the sweeper and an idle
        worker do (``Job.objects.promote_due``); return how many."""
        return int(self.jobs.promote_due(now=self.now))

    def ended(self, ran: Ran) -> JobRun:
        """The run of ``ran.job``, from its row as the run left it."""
        claimed = ran.job
        row = self.jobs.filter(pk=claimed.pk).first()
        if row is None:  # the task deleted its own job
            return JobRun(claimed, "deleted", ran.failure)
        if row.status in (Status.PENDING, Status.SCHEDULED):
            outcome = "snoozed" if row.snoozes > claimed.snoozes else "retried"
        else:
            outcome = str(row.status)
        return JobRun(row, outcome, ran.failure)
