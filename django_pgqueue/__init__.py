"""django-pgqueue: a durable job queue for Django inside PostgreSQL.

Use it as the backend of Django's Tasks framework::

    TASKS = {"default": {"BACKEND": "django_pgqueue.backend.PgQueueBackend"}}
"""

from .bulk import BulkResult, enqueue_many
from .exceptions import InvalidJob, LeaseLost, PgQueueError
from .tasks import CurrentJob, PgQueueTask, current_job

__all__ = [
    "BulkResult",
    "CurrentJob",
    "InvalidJob",
    "LeaseLost",
    "PgQueueError",
    "PgQueueTask",
    "current_job",
    "enqueue_many",
]
__version__ = "0.1.0"
