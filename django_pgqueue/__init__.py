"""django_pgqueue (distribution django-tasks-pgqueue): a durable job queue for Django
inside PostgreSQL.

Use it as the backend of Django's Tasks framework::

    TASKS = {"default": {"BACKEND": "django_pgqueue.backend.PgQueueBackend"}}
"""

from importlib.metadata import PackageNotFoundError, version

from .bulk import BulkResult, enqueue_many
from .exceptions import InvalidJob, LeaseLost, PgQueueError, Retry, Snooze, SnoozeLimitExceeded
from .taskapi import task
from .tasks import CurrentJob, PgQueueTask, current_job

__all__ = [
    "BulkResult",
    "CurrentJob",
    "InvalidJob",
    "LeaseLost",
    "PgQueueError",
    "PgQueueTask",
    "Retry",
    "Snooze",
    "SnoozeLimitExceeded",
    "current_job",
    "enqueue_many",
    "task",
]

try:
    #: The installed distribution's version (pyproject.toml is its only source).
    __version__ = version("django-tasks-pgqueue")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
