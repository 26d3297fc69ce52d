"""Tasks only the tests use. Importable by worker subprocesses (manage.py puts the
repository on sys.path), so a test can see from outside when a task has started."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from pathlib import Path

from django_pgqueue.taskapi import task
from django_pgqueue.tasks import current_job

#: For in-process workers: attempt N of ``gated(name)`` sets ``STARTED[name, N]``, then
#: waits (at most 30 s) until the test sets ``GATES[name, N]``.
STARTED: defaultdict[tuple[str, int], threading.Event] = defaultdict(threading.Event)
GATES: defaultdict[tuple[str, int], threading.Event] = defaultdict(threading.Event)
RUNS: list[tuple[str, int]] = []


@task()
def sleep_after_marking(marker: str, seconds: float) -> float:
    """Create the file ``marker`` (proof the task body is running), then sleep."""
    Path(marker).write_text("started")
    time.sleep(seconds)
    return seconds


@task()
async def async_add(a: int, b: int) -> int:
    """A coroutine task: the backend says supports_async_task."""
    return a + b


@task()
def gated(name: str) -> int:
    """Record this run, say it started, then wait at this attempt's gate."""
    job = current_job()
    assert job is not None, "only a worker runs this task"
    RUNS.append((name, job.attempt))
    STARTED[name, job.attempt].set()
    GATES[name, job.attempt].wait(30)
    return job.attempt


def _renamed(n: int = 0) -> int:
    """Made a Task under another name: its module path names this plain function."""
    return n


renamed = task()(_renamed)
