"""``PgQueueBackend``: django-pgqueue as a backend for Django's Tasks framework.

The top of the package: nothing in it imports this module. What lower modules need to
know of the backend is ``databases.QueueBackend`` (its jobs database and options) and
``framework.py`` (loading tasks, mapping a job to a ``TaskResult``).
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections, router

from . import defaults, schema
from .conf import settings
from .databases import QueueBackend, listen_target
from .enqueue import enqueue_one
from .framework import TaskGone, load_task, to_task_result
from .taskapi import (
    DEFAULT_TASK_BACKEND_ALIAS,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    task_enqueued,
)
from .tasks import PgQueueTask


class PgQueueBackend(QueueBackend):
    """Stores tasks as rows of ``pgqueue_job``; ``manage.py pgqueue_worker`` runs them.

    ``OPTIONS`` may hold ``DATABASE`` (alias of the jobs database, see
    ``databases.py``), ``LISTEN_DATABASE`` (where workers LISTEN for wake-ups) and
    ``MAX_ATTEMPTS``.
    ``QUEUES``, when given, restricts the queue names tasks may use.
    """

    supports_defer = True
    """``Task.using(run_after=...)`` is stored as the job's ``run_at``."""

    supports_async_task = True
    """Coroutine tasks are run by the worker through ``Task.call`` (async_to_sync)."""

    supports_get_result = True
    """Results, errors and attempts are read back from the jobs table by id."""

    supports_priority = True
    """Higher priority (-100..100) is claimed first."""

    task_class = PgQueueTask
    """``@task(transactional=..., timeout=..., max_attempts=...)`` (see ``tasks.py``)."""

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        # Django defaults QUEUES to {"default"}; we accept any valid name unless told.
        self.queues = set(params["QUEUES"]) if "QUEUES" in params else set()

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        model = installed_job_model()
        self.validate_task(task)
        # Queue, priority, run time and attempts come from the task and this backend's
        # OPTIONS, resolved as for every other way in (defaults.resolve). What
        # Job.objects.db_manager(self.database).enqueue(task, args, kwargs,
        # backend=self.alias) does, without the options this call cannot have.
        params = defaults.prepare(task, args, kwargs, backend=self.alias)
        job = enqueue_one(model, self.database, params)
        result = to_task_result(job, task)
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: Any) -> TaskResult:
        require_installed()
        model = job_model()
        try:
            job = model.objects.db_manager(self.database).get(pk=int(result_id))
        except (ValueError, TypeError, model.DoesNotExist) as exc:
            raise TaskResultDoesNotExist(result_id) from exc
        except DatabaseError as exc:
            missing = schema.not_migrated(exc, self.database)
            if missing is None:
                raise
            raise missing from exc
        try:
            task = load_task(job.task)
        except TaskGone as exc:
            raise TaskResultDoesNotExist(f"{result_id}: {exc}") from exc
        return to_task_result(job, task)

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        messages: list[checks.CheckMessage] = []
        if not apps.is_installed("django_pgqueue"):
            messages.append(
                checks.Error(
                    "django_pgqueue is not in INSTALLED_APPS.",
                    hint="Add 'django_pgqueue' to INSTALLED_APPS and run migrate.",
                    obj=f"TASKS[{self.alias!r}]",
                    id="pgqueue.E001",
                )
            )
        if self.database not in connections.settings:
            messages.append(
                checks.Error(
                    f"Database alias {self.database!r} is not in DATABASES.",
                    hint="Set OPTIONS['DATABASE'] to a configured alias.",
                    obj=f"TASKS[{self.alias!r}]",
                    id="pgqueue.E002",
                )
            )
        elif connections[self.database].vendor != "postgresql":
            messages.append(
                checks.Error(
                    f"Database {self.database!r} is {connections[self.database].vendor}, "
                    "not PostgreSQL.",
                    hint="django-pgqueue needs PostgreSQL (SKIP LOCKED, jsonb, NOTIFY).",
                    obj=f"TASKS[{self.alias!r}]",
                    id="pgqueue.E003",
                )
            )
        else:
            messages += self._check_database()
        return messages

    def _check_database(self) -> list[checks.CheckMessage]:
        """The jobs database agrees with PGQUEUE_DATABASE, the routers let the jobs
        table be migrated there, and LISTEN_DATABASE names something reachable."""
        obj = f"TASKS[{self.alias!r}]"
        messages: list[checks.CheckMessage] = []
        fallback = settings.DATABASE
        if (
            self.alias == DEFAULT_TASK_BACKEND_ALIAS
            and fallback
            and self.options.get("DATABASE")
            and fallback != self.database
        ):
            messages.append(
                checks.Error(
                    f"OPTIONS['DATABASE'] is {self.database!r} but PGQUEUE_DATABASE is "
                    f"{fallback!r}.",
                    hint="Remove PGQUEUE_DATABASE: each backend's OPTIONS['DATABASE'] "
                    "names its jobs database, for enqueue, workers, sweeper and admin.",
                    obj=obj,
                    id="pgqueue.E050",
                )
            )
        if apps.is_installed("django_pgqueue") and not router.allow_migrate_model(
            self.database, job_model()
        ):
            messages.append(
                checks.Error(
                    f"The database routers do not allow migrating django_pgqueue on "
                    f"{self.database!r}, this backend's jobs database.",
                    hint="Let allow_migrate() return True for app 'django_pgqueue' on "
                    "that database, or point OPTIONS['DATABASE'] elsewhere.",
                    obj=obj,
                    id="pgqueue.E051",
                )
            )
        try:
            listen_target(self.database, self.options)
        except ValueError as exc:
            messages.append(
                checks.Error(
                    str(exc),
                    hint="Name a DATABASES alias with a direct (session) connection, a "
                    "libpq DSN, or None to poll.",
                    obj=obj,
                    id="pgqueue.E052",
                )
            )
        return messages


def job_model() -> Any:
    """The ``Job`` model, from the app registry: importing the models here would make a
    project without ``django_pgqueue`` in INSTALLED_APPS fail on importing the backend,
    before :func:`require_installed` can say what to do."""
    return apps.get_model("django_pgqueue", "Job")


def installed_job_model() -> Any:
    """:func:`job_model`, or the ``ImproperlyConfigured`` of :func:`require_installed`
    (one registry look-up where the two took two)."""
    try:
        return job_model()
    except LookupError:
        require_installed()
        raise


def require_installed() -> None:
    """Raise ``ImproperlyConfigured`` unless ``django_pgqueue`` is in INSTALLED_APPS.

    The system check pgqueue.E001 says the same, but Django runs backend checks only
    once ``django.tasks`` has been imported, which nothing may have done at start-up;
    this is the error the first ``enqueue()`` meets instead of Django's "Model class
    ... isn't in an application in INSTALLED_APPS"."""
    if not apps.is_installed("django_pgqueue"):
        raise ImproperlyConfigured(
            "TASKS uses django_pgqueue.backend.PgQueueBackend but 'django_pgqueue' is "
            "not in INSTALLED_APPS: add it there, then run `python manage.py migrate`."
        )
