"""django_pgqueue (distribution django-tasks-pgqueue): a durable job queue for Django
inside PostgreSQL.

Use it as the backend of Django's Tasks framework::

    TASKS = {"default": {"BACKEND": "django_pgqueue.backend.PgQueueBackend"}}
"""

import sys
from importlib.metadata import PackageNotFoundError, version

from . import signals

# ``manage.py pgqueue_worker`` (Django takes the command from argv[1]): from here on,
# while Django sets up and the command starts, a stop signal is remembered and the
# worker stops cleanly once its handlers are in, instead of dying of the signal.
if sys.argv[1:2] == ["pgqueue_worker"]:  # pragma: no cover - a worker's start-up
    signals.defer_stop()

from .bulk import BulkResult, enqueue_many
from .exceptions import InvalidJob, LeaseLost, PgQueueError, Retry, Snooze, SnoozeLimitExceeded
from .taskapi import task
from .tasks import CurrentJob, PgQueueTask, current_job
from .workflows import Chain, Group, Step, chain, group, step

__all__ = [
    "BulkResult",
    "Chain",
    "CurrentJob",
    "Group",
    "InvalidJob",
    "LeaseLost",
    "PgQueueError",
    "PgQueueTask",
    "Retry",
    "Snooze",
    "SnoozeLimitExceeded",
    "Step",
    "chain",
    "current_job",
    "enqueue_many",
    "group",
    "step",
    "task",
]

try:
    #: The installed distribution's version (pyproject.toml is its only source).
    __version__ = version("django-tasks-pgqueue")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
