"""The tasks a worker has imported, each with what the worker needs to know of it.

A worker runs few distinct tasks, many times: each is imported once
(``framework.load_task``) and described once: whether it is a coroutine function (it
then runs on the worker's event loop, see ``coroutines.py``), transactional, and its timeout.
Asking ``inspect.iscoroutinefunction`` and the task's options for every job cost about
as much as a no-op task's own call.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from inspect import iscoroutinefunction

from ..framework import load_task
from ..taskapi import Task
from ..tasks import task_option


@dataclass(frozen=True, slots=True)
class Known:
    """An imported task and its options, as the worker uses them."""

    task: Task
    #: ``async def``: the job runs on the worker's event loop (unless transactional).
    coroutine: bool
    #: ``@task(transactional=True)``: the task and its fenced completion in one
    #: transaction, on a thread slot (which holds the connection for the whole run).
    transactional: bool
    #: The task's own ``timeout`` option, in seconds (None: the setting's).
    timeout: float | None
    #: The task's own ``soft_time_limit`` option, in seconds (None: the setting's).
    soft_time_limit: float | None = None
    #: The task's own ``time_limit`` option, in seconds (None: the setting's).
    time_limit: float | None = None

    @property
    def on_loop(self) -> bool:
        """Whether its jobs run on the event loop: coroutine and not transactional."""
        return self.coroutine and not self.transactional


class Catalog:
    """Tasks imported by path, once per worker; shared by its threads."""

    def __init__(self) -> None:
        self._known: dict[str, Known] = {}
        self._lock = threading.Lock()

    def get(self, path: str) -> Known:
        """The task at ``path``, imported on first use; raises what ``load_task``
        raises (``TaskGone``, or the module's own import error), every time."""
        known = self._known.get(path)
        if known is None:
            task = load_task(path)
            timeout = task_option(task, "timeout")
            soft = task_option(task, "soft_time_limit")
            hard = task_option(task, "time_limit")
            known = Known(
                task=task,
                coroutine=iscoroutinefunction(task.func),
                transactional=bool(task_option(task, "transactional")),
                timeout=float(timeout) if isinstance(timeout, int | float) else None,
                soft_time_limit=float(soft) if isinstance(soft, int | float) else None,
                time_limit=float(hard) if isinstance(hard, int | float) else None,
            )
            with self._lock:
                known = self._known.setdefault(path, known)
        return known

    def peek(self, path: str) -> Known | None:
        """The task at ``path`` if it was imported already (never imports)."""
        return self._known.get(path)
