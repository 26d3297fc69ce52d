"""Tasks only the tests use. Importable by worker subprocesses (manage.py puts the
repository on sys.path), so a test can see from outside when a task has started."""

from __future__ import annotations

import time
from pathlib import Path

from django.tasks import task


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
