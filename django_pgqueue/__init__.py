"""django_pgqueue (distribution django-tasks-pgqueue): a durable job queue for Django
inside PostgreSQL.

Use it as the backend of Django's Tasks framework::

    TASKS = {"default": {"BACKEND": "django_pgqueue.backend.PgQueueBackend"}}

The names below are imported on first use (PEP 562): importing the package itself loads
neither Django's ORM nor its Tasks framework, since pytest imports it at start-up in
every project that has it installed, to load its plugin (``pytest_plugin``).
"""

import sys
from importlib import import_module
from typing import TYPE_CHECKING, Any

from . import signals

# ``manage.py pgqueue_worker`` (Django takes the command from argv[1]): from here on,
# while Django sets up and the command starts, a stop signal is remembered and the
# worker stops cleanly once its handlers are in, instead of dying of the signal.
if sys.argv[1:2] == ["pgqueue_worker"]:  # pragma: no cover - a worker's start-up
    signals.defer_stop()

if TYPE_CHECKING:
    from . import schedules as schedules
    from .bulk import BulkResult, enqueue_many
    from .exceptions import (
        InvalidJob,
        InvalidStep,
        JobCancelled,
        LeaseLost,
        PgQueueError,
        Retry,
        Snooze,
        SnoozeLimitExceeded,
        SoftTimeLimitExceeded,
        TimeLimitExceeded,
    )
    from .taskapi import task
    from .tasks import CurrentJob, PgQueueTask, current_job
    from .waiting import await_for, awatch, wait_for, watch
    from .workflows import Chain, Group, Step, chain, group, step

    __version__: str

#: Each public name, and the module it comes from.
_EXPORTS = {
    "BulkResult": "bulk",
    "enqueue_many": "bulk",
    "InvalidJob": "exceptions",
    "InvalidStep": "exceptions",
    "JobCancelled": "exceptions",
    "LeaseLost": "exceptions",
    "PgQueueError": "exceptions",
    "Retry": "exceptions",
    "Snooze": "exceptions",
    "SnoozeLimitExceeded": "exceptions",
    "SoftTimeLimitExceeded": "exceptions",
    "TimeLimitExceeded": "exceptions",
    "task": "taskapi",
    "CurrentJob": "tasks",
    "PgQueueTask": "tasks",
    "current_job": "tasks",
    "await_for": "waiting",
    "awatch": "waiting",
    "wait_for": "waiting",
    "watch": "waiting",
    "Chain": "workflows",
    "Group": "workflows",
    "Step": "workflows",
    "chain": "workflows",
    "group": "workflows",
    "step": "workflows",
}

#: Modules reached as attributes of the package (``django_pgqueue.schedules.create(...)``
#: after ``import django_pgqueue``), imported on first use like the names above.
_MODULES = frozenset({"schedules"})

__all__ = [
    "BulkResult",
    "Chain",
    "CurrentJob",
    "Group",
    "InvalidJob",
    "InvalidStep",
    "JobCancelled",
    "LeaseLost",
    "PgQueueError",
    "PgQueueTask",
    "Retry",
    "Snooze",
    "SnoozeLimitExceeded",
    "SoftTimeLimitExceeded",
    "Step",
    "TimeLimitExceeded",
    "await_for",
    "awatch",
    "chain",
    "current_job",
    "enqueue_many",
    "group",
    "step",
    "task",
    "wait_for",
    "watch",
]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module the first time it is asked for; and
    ``__version__``, the installed distribution's (pyproject.toml is its only source)."""
    value: Any
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            value = version("django-tasks-pgqueue")
        except PackageNotFoundError:  # a source tree that was never installed
            value = "0+unknown"
    elif name in _EXPORTS:
        value = getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    elif name in _MODULES:
        value = import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, "__version__"})
