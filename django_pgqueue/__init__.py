"""django-pgqueue: a durable job queue for Django inside PostgreSQL.

Use it as the backend of Django's Tasks framework::

    TASKS = {"default": {"BACKEND": "django_pgqueue.backend.PgQueueBackend"}}
"""

from .bulk import BulkResult, enqueue_many
from .exceptions import InvalidJob, LeaseLost, PgQueueError

__all__ = ["BulkResult", "InvalidJob", "LeaseLost", "PgQueueError", "enqueue_many"]
__version__ = "0.1.0"
