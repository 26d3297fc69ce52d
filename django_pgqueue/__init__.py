"""django-pgqueue: a durable job queue for Django inside PostgreSQL.

Use it as the backend of Django's Tasks framework::

    TASKS = {"default": {"BACKEND": "django_pgqueue.backend.PgQueueBackend"}}
"""

from .exceptions import InvalidJob, LeaseLost, PgQueueError

__all__ = ["InvalidJob", "LeaseLost", "PgQueueError"]
__version__ = "0.1.0"
