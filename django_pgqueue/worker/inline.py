"""Running claimed jobs one at a time on the caller's own thread (``testing.run_jobs``).

The worker's parts, without its threads: the runner thread's :class:`JobRunner` (the
task's call, ``current_job()``, the session checks, the fenced failure, snooze and
transactional completion, Django's task signals and the worker's log lines), its
completer writing each success at once on this thread (:class:`InlineCompleter`: the
same fenced statement, the one that releases a workflow's dependants), and a
:class:`WorkerState` holding the one job being run. So a job run here ends as it would
under a worker; what a worker's other threads do is not done: no heartbeat (no lease is
extended, and no ``timeout`` stops a task), no listener (``cancel_requested`` is only
learnt from the fenced completion, which ends such a job ``cancelled``), no event loop
(a coroutine task runs as on a worker without one: on an event loop of its own for the
call, ``async_to_sync``).

The caller's connections are the runner's (:func:`connections.borrowed`): in
autocommit (a ``TransactionTestCase``) a job commits as under a worker; inside the
caller's transaction (a ``TestCase``) it runs after a savepoint of its own
(:func:`connections.hosted_job`), and nothing commits.

The state is created ``done``: a database error in an outcome write is not waited out
for a lease, as a worker's thread would; the write gives up at once. A job whose
outcome could not be written is given back (``Job.objects.release``) and
:class:`NotRecorded` raised, so no job is left ``running``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from types import TracebackType

from django.db import DatabaseError

from ..exceptions import NotRecorded
from ..models import Job
from ..states import Status
from .completer import Completer, Completion
from .connections import borrowed, hosted_job
from .outcomes import Reporter
from .runner import JobRunner
from .state import WorkerPart, WorkerState

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed attempt, as written (``status``: ``scheduled``, ``pending``, ``dead``,
    ``cancelled``; None: not written)."""

    job: Job
    error: BaseException
    status: str | None


class _Recording(WorkerPart):
    """Keeps each failure its part writes (``record_failure`` is every part's one way
    to write one), for the run to re-raise (``run_jobs(raise_errors=True)``)."""

    failures: list[Failure]

    def record_failure(self, job: Job, error: BaseException, *, retry: bool = True) -> str | None:
        status = super().record_failure(job, error, retry=retry)
        self.failures.append(Failure(job, error, status))
        return status


class InlineCompleter(_Recording, Completer):
    """The completer, writing each success at once on the submitting thread, with the
    batched completion's statement (a batch of one), its fence and its reports. An
    error is raised to the caller, not left to the lease: there is no sweeper."""

    def __init__(self, state: WorkerState, *, reporter: Reporter, failures: list[Failure]) -> None:
        super().__init__(state, reporter=reporter, interval=0.0, max_batch=1)
        self.failures = failures

    def submit(self, completion: Completion, *, last: bool, inline: bool = True) -> None:
        self.flush([completion], role="runner")


class _Runner(_Recording, JobRunner):
    """The worker's runner, keeping the failures it writes."""


@dataclass
class Ran:
    """One run of a job: the job as claimed, and the first exception that failed its
    attempt (written as the failure; None if it did not fail)."""

    job: Job
    failure: BaseException | None = None
    failures: list[Failure] = field(default_factory=list)


class InlineRunner:
    """Runs claimed jobs one at a time on this thread, as ``worker_id``, inside
    ``with InlineRunner(...) as runner:`` (the thread's connections are borrowed for the
    block). ``sender`` is the Tasks backend class that sends Django's task signals."""

    def __init__(self, *, alias: str, worker_id: str, lease_seconds: float, sender: type) -> None:
        self.state = WorkerState(alias=alias, worker_id=worker_id, lease_seconds=lease_seconds)
        # No thread to tell, and nobody to wait for the database: outcome writes give up
        # at their first error (see WorkerPart.write_retrying).
        self.state.done.set()
        self.worker_id = worker_id
        self._failures: list[Failure] = []
        reporter = Reporter(sender=sender, worker_id=worker_id)
        completer = InlineCompleter(self.state, reporter=reporter, failures=self._failures)
        self._runner = _Runner(self.state, reporter=reporter, completer=completer)
        self._runner.failures = self._failures
        self._borrowed = borrowed()

    def __enter__(self) -> InlineRunner:
        self._borrowed.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._borrowed.__exit__(exc_type, exc, traceback)

    def run(self, job: Job) -> Ran:
        """Run ``job`` (claimed by ``worker_id``) and write its outcome, fenced, on this
        thread's connections; return what failed it. Raises what the worker would log as
        its own internal error, and :class:`NotRecorded` if the outcome could not be
        written: either way the job is not left ``running``."""
        del self._failures[:]
        self.state.hold(job)
        handed_off = False
        error: BaseException | None = None
        try:
            with hosted_job():
                handed_off = self._runner.execute(job)
        except BaseException as exc:  # noqa: BLE001 - raised below, once the job is settled
            error = exc
        finally:
            if not handed_off:  # (the completer forgets the job once it wrote it)
                self.state.forget([job])
        running: bool | None = None
        try:
            running = self._still_running(job)
        except DatabaseError:
            if error is None:
                raise
        if running is None:  # the connection failed after the run's own error
            assert error is not None
            raise error
        if running:
            # Not written (the log says why): a worker would leave it to its lease and
            # the sweeper. The cause is what stopped the run, or the failure unwritten.
            given_back = "it was given back (pending, attempt not charged)"
            if not self.release(job):
                given_back = "giving it back failed too"
            cause = error or next((f.error for f in self._failures if f.status is None), None)
            raise NotRecorded(
                f"job {job.id} ({job.task}): its outcome could not be recorded; {given_back}"
            ) from cause
        if error is not None:
            raise error
        failures = list(self._failures)
        return Ran(job, failures[0].error if failures else None, failures)

    def release(self, job: Job) -> bool:
        """Give back a job claimed by this runner but not run, or whose outcome could
        not be written: pending again, its attempt not charged (``Job.objects.release``,
        fenced). False if that failed too."""
        try:
            return bool(self.state.jobs.release(job, self.worker_id))
        except DatabaseError:
            logger.warning(
                "job %s: could not give it back",
                job.id,
                exc_info=True,
                extra={"action": "release", "job_id": job.id, "worker_id": self.worker_id},
            )
            return False

    def _still_running(self, job: Job) -> bool:
        """Whether ``job`` is still running under this claim (its outcome not written)."""
        return self.state.jobs.filter(
            pk=job.pk,
            status=Status.RUNNING,
            lease_owner=self.worker_id,
            attempts=job.attempts,
        ).exists()
