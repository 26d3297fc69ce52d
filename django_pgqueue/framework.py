"""What the Tasks framework sees of a job: the ``Task`` a stored path names, and the
``TaskResult`` of a job row.

This is the only module that speaks Django's ``TaskResultStatus``; the rest of the app
uses the job states of the jobs table (``Job.Status``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from django.utils.module_loading import import_string

from .states import Status
from .taskapi import FRAMEWORK, Task, TaskError, TaskResult, TaskResultStatus

STATUS_MAP = {
    Status.PENDING: TaskResultStatus.READY,
    Status.SCHEDULED: TaskResultStatus.READY,  # delayed, or waiting to retry
    Status.RUNNING: TaskResultStatus.RUNNING,
    Status.DONE: TaskResultStatus.SUCCESSFUL,
    Status.DEAD: TaskResultStatus.FAILED,
    Status.CANCELLED: TaskResultStatus.FAILED,  # its errors end with a JobCancelled entry
    Status.WAITING: TaskResultStatus.READY,  # waiting for the jobs it depends on
}


class TaskGone(ValueError):  # noqa: N818 - names the state, like Django's DoesNotExist
    """A stored task path names no ``Task``: its module or attribute does not exist, or
    it is some other object. No retry can cure it."""


def load_task(path: str) -> Task:
    """Import a stored task path.

    Raises :class:`TaskGone` when the path's own module or attribute is missing, or
    names something that is not a ``Task`` (a row can never make a worker call other
    code). Any other error of the import (a dependency of the module missing, a module
    that raises) propagates as it is: it may be a deploy in progress, so the worker
    retries it."""
    module_path, _, name = path.rpartition(".")
    try:
        obj = import_string(path)
    except ModuleNotFoundError as exc:
        if not _names_own_module(exc, module_path):
            raise
        raise TaskGone(f"task {path!r} does not import: {exc}") from exc
    except ImportError as exc:
        # import_string's "does not define" (the module imported, the name is not in
        # it) or a dotted path without a module; anything else came from inside.
        if module_path in sys.modules and not hasattr(sys.modules[module_path], name):
            raise TaskGone(f"task {path!r} does not import: {exc}") from exc
        if not module_path:
            raise TaskGone(f"task {path!r} is not a dotted path") from exc
        raise
    if not isinstance(obj, Task):
        raise TaskGone(f"{path!r} is a {type(obj).__name__}, not a {FRAMEWORK}.Task")
    return obj


def _names_own_module(exc: ModuleNotFoundError, module_path: str) -> bool:
    """True if the missing module is the task's own module or one of its packages
    (the code is gone), not something that module imports."""
    missing = exc.name or ""
    return bool(missing) and (module_path == missing or module_path.startswith(missing + "."))


@dataclass
class NewJob:
    """The fields ``to_task_result`` reads, for a job just written by a bulk call (no
    ``Job`` object is built for those)."""

    id: int
    backend: str
    args: Any
    kwargs: Any
    created_at: Any
    status: str = Status.PENDING
    attempts: int = 0
    errors: list[Any] = field(default_factory=list)
    lease_owner: str | None = None
    started_at: Any = None
    finished_at: Any = None
    last_attempted_at: Any = None
    result: Any = None


def to_task_result(job: Any, task: Task) -> TaskResult:
    """Map a job row (a ``Job`` or a :class:`NewJob`) to Django's ``TaskResult``.

    Django derives ``attempts`` from ``len(worker_ids)``, so ``worker_ids`` has one
    entry per attempt: the worker recorded in each failed attempt's error, then the
    current (or last) lease owner.
    """
    worker_ids = [e.get("worker_id") or "" for e in job.errors][-job.attempts :]
    while len(worker_ids) < job.attempts:
        worker_ids.append(job.lease_owner or "")
    if not job.attempts:
        worker_ids = []
    result: TaskResult = TaskResult(
        task=task,
        id=str(job.id),
        status=STATUS_MAP[job.status],
        enqueued_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        last_attempted_at=job.last_attempted_at,
        args=job.args,
        kwargs=job.kwargs,
        backend=job.backend,
        errors=[
            TaskError(exception_class_path=e["exception_class_path"], traceback=e["traceback"])
            for e in job.errors
        ],
        worker_ids=worker_ids,
    )
    object.__setattr__(result, "_return_value", job.result)
    return result
