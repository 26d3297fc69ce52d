"""Django's Tasks framework, from wherever this Django has it.

Django 6.0 and later ship the framework as ``django.tasks``; on Django 5.2 LTS the
``django-tasks`` package backports it as ``django_tasks``. Every module of this package
(and of its tests) imports the framework from here and nowhere else (``tests/test_taskapi.py``
fails otherwise), so the differences between the three are handled once, in this module:

- Exceptions are spelled ``InvalidTask`` and ``InvalidTaskBackend`` in Django, and
  ``InvalidTaskError`` and ``InvalidTaskBackendError`` in the backport; here they have
  Django's names.
- ``normalize_json`` is ``django.utils.json.normalize_json`` in Django and
  ``django_tasks.utils.normalize_json`` in the backport (Django 5.2 has no such function).
- Django 6.0's ``@task`` decorator takes no options beyond its own four, so
  ``@task(transactional=True)`` raises ``TypeError`` there; Django 6.1 and the backport
  pass unknown keyword arguments to the backend's ``task_class``. :func:`task` here does
  that on all three.
- The backport registers its system checks and the receiver that resets the backends on
  ``override_settings(TASKS=...)`` only when its ``signals`` and ``checks`` modules are
  imported (Django imports them with ``django.tasks``); this module imports them.
- The framework's own log lines (enqueued, started, finished) come from the logger
  ``django.tasks`` in Django and ``django_tasks`` in the backport; only Django 6.1's
  ``Task`` pickles (``__reduce__``), which nothing here relies on.

What is the same in all three, and so needs nothing here: ``TaskResult``'s fields (id,
status, enqueued_at, started_at, finished_at, last_attempted_at, args, kwargs, backend,
errors, worker_ids, and ``_return_value``), ``TaskContext``, the three signals and the
arguments they are sent with, and the backend API (``validate_task``, ``enqueue``,
``get_result``, ``check`` and the ``supports_*`` flags).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, overload

import django

#: True on Django 6.0 and later (``django.tasks``); False on 5.2 with the backport.
BUILTIN = django.VERSION >= (6, 0)

if TYPE_CHECKING or BUILTIN:
    from django.tasks import (
        DEFAULT_TASK_BACKEND_ALIAS,
        DEFAULT_TASK_QUEUE_NAME,
        Task,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        default_task_backend,
        task_backends,
    )
    from django.tasks import signals as _signals
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import (
        DEFAULT_TASK_PRIORITY,
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        TaskError,
    )
    from django.tasks.exceptions import (
        InvalidTask,
        InvalidTaskBackend,
        TaskResultDoesNotExist,
        TaskResultMismatch,
    )
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json

    #: The module the framework is imported from (for messages).
    FRAMEWORK = "django.tasks"
else:  # Django 5.2: the django-tasks backport
    try:
        import django_tasks  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"django-tasks-pgqueue on Django {django.get_version()} needs the django-tasks "
            "backport of the Tasks framework (Django 6.0 has it built in): "
            'pip install "django-tasks-pgqueue[django52]"'
        ) from exc
    from django_tasks import (
        DEFAULT_TASK_BACKEND_ALIAS,
        DEFAULT_TASK_QUEUE_NAME,
        checks,  # noqa: F401 - registers the backends' system checks
        default_task_backend,
        task_backends,
    )
    from django_tasks import signals as _signals
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import (  # the backport's package does not export Task
        DEFAULT_TASK_PRIORITY,
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        Task,
        TaskContext,
        TaskError,
        TaskResult,
        TaskResultStatus,
    )
    from django_tasks.exceptions import InvalidTaskBackendError as InvalidTaskBackend
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
    from django_tasks.signals import task_enqueued, task_finished, task_started
    from django_tasks.utils import normalize_json

    FRAMEWORK = "django_tasks"

#: The framework's own receivers of ``task_started`` and ``task_finished``: each only
#: logs a line on the logger named ``FRAMEWORK`` (the worker skips sending a signal
#: whose only receiver is one of these when that line would reach no handler).
LOG_RECEIVERS = frozenset(
    receiver
    for receiver in (
        getattr(_signals, "log_task_started", None),
        getattr(_signals, "log_task_finished", None),
    )
    if receiver is not None
)

#: Dotted paths of the framework's own backends (for settings and tests).
DUMMY_BACKEND = f"{FRAMEWORK}.backends.dummy.DummyBackend"
IMMEDIATE_BACKEND = f"{FRAMEWORK}.backends.immediate.ImmediateBackend"


@overload
def task(function: Callable[..., Any], /) -> Task: ...


@overload
def task(
    *,
    priority: int = DEFAULT_TASK_PRIORITY,
    queue_name: str = DEFAULT_TASK_QUEUE_NAME,
    backend: str = DEFAULT_TASK_BACKEND_ALIAS,
    takes_context: bool = False,
    **options: Any,
) -> Callable[[Callable[..., Any]], Task]: ...


def task(
    function: Callable[..., Any] | None = None,
    /,
    *,
    priority: int = DEFAULT_TASK_PRIORITY,
    queue_name: str = DEFAULT_TASK_QUEUE_NAME,
    backend: str = DEFAULT_TASK_BACKEND_ALIAS,
    takes_context: bool = False,
    **options: Any,
) -> Task | Callable[[Callable[..., Any]], Task]:
    """Make a function a ``Task`` of the backend ``backend``, like the framework's ``@task``.

    ``options`` (``transactional=``, ``timeout=``, ``max_attempts=`` with
    ``PgQueueBackend``) go to the backend's ``task_class``, on every supported Django
    version: Django 6.0's own decorator refuses them. ``run_after`` cannot be given here
    (a fixed time at import would soon be in the past); use ``.using(run_after=...)``.
    """
    if "run_after" in options:
        raise TypeError(
            "run_after cannot be given to @task; use task.using(run_after=...) when enqueuing"
        )

    def wrapper(func: Callable[..., Any]) -> Task:
        task_class: type[Task] = task_backends[backend].task_class
        return task_class(
            func=func,
            priority=priority,
            queue_name=queue_name,
            backend=backend,
            takes_context=takes_context,
            run_after=None,
            **options,
        )

    if function is not None:
        return wrapper(function)
    return wrapper


__all__ = [
    "BUILTIN",
    "DEFAULT_TASK_BACKEND_ALIAS",
    "DEFAULT_TASK_PRIORITY",
    "DEFAULT_TASK_QUEUE_NAME",
    "DUMMY_BACKEND",
    "FRAMEWORK",
    "IMMEDIATE_BACKEND",
    "LOG_RECEIVERS",
    "TASK_MAX_PRIORITY",
    "TASK_MIN_PRIORITY",
    "BaseTaskBackend",
    "InvalidTask",
    "InvalidTaskBackend",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultMismatch",
    "TaskResultStatus",
    "default_task_backend",
    "normalize_json",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
