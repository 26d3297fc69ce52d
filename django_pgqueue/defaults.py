"""A job's defaults, resolved in one place for every way a job is enqueued.

``Task.enqueue()``, ``Job.objects.enqueue()``, ``bulk_enqueue()``, ``enqueue_many()``
and periodic entries all ask :func:`resolve`, so a job's queue, priority, run time,
attempt limit and backend never depend on the path it took. Each value is the first
that is given of:

========================  ===========================================================
value                     sources, first given wins
========================  ===========================================================
``backend``               the call, the ``Task``'s ``backend``
``queue``                 the call, the ``Task``'s ``queue_name``
``priority``              the call, the ``Task``'s ``priority``
``run_at``                the call, the ``Task``'s ``run_after``, none (due now)
``max_attempts``          the call, ``@task(max_attempts=...)``, the backend's
                          ``OPTIONS["MAX_ATTEMPTS"]``, ``PGQUEUE_MAX_ATTEMPTS``
``concurrency_key``       the call, ``@task(concurrency_key=...)``, none ("")
``tags``                  ``@task(tags=...)`` *and* the call's, in that order, repeats
                          dropped (at most ``validation.MAX_TAGS`` in all)
========================  ===========================================================

A task given as a dotted path brings the options of the ``Task`` it names. Every value
is validated here too: a bad one raises ``InvalidJob`` naming it. A concurrency key may
be a callable of the call's args and kwargs: :func:`resolve` keeps it, and
:func:`concurrency_key` calls it for each job (its answer depends on the payload).
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.core.signals import setting_changed
from django.dispatch import receiver

from . import tracing, validation
from .conf import settings
from .databases import backend_option
from .exceptions import InvalidJob
from .taskapi import Task
from .tasks import task_option


@dataclass(frozen=True, slots=True)
class JobDefaults:
    """The resolved, validated values of one job (its payload aside)."""

    task: str
    backend: str
    queue: str
    priority: int
    run_at: dt.datetime | None
    max_attempts: int
    #: The checked key ("" for none), or the callable that makes one per job.
    concurrency_key: str | Callable[..., Any] = ""
    #: The task's own tags (``@task(tags=...)``), checked; a call's are added to them.
    tags: tuple[str, ...] = ()


def resolve(
    task: Task | str,
    *,
    backend: str | None = None,
    queue: str | None = None,
    priority: int | None = None,
    run_at: dt.datetime | None = None,
    max_attempts: int | None = None,
    concurrency_key: str | None = None,
) -> JobDefaults:
    """The values a job of ``task`` is stored with, given what the caller said (None:
    not said). See the module's table for the order of the sources."""
    # A path brings the options of the Task it names, as the Task itself would.
    own = validation.task_object(task)
    backend = own.backend if backend is None else backend
    queue = own.queue_name if queue is None else queue
    priority = own.priority if priority is None else priority
    run_at = own.run_after if run_at is None else run_at
    if max_attempts is None:
        max_attempts = task_option(own, "max_attempts")
    alias = validation.backend_alias(backend)
    if max_attempts is None:
        max_attempts = backend_option(alias, "MAX_ATTEMPTS")
    if max_attempts is None:
        max_attempts = settings.MAX_ATTEMPTS
    key: Any = task_option(own, "concurrency_key") if concurrency_key is None else concurrency_key
    if not callable(key):
        key = validation.concurrency_key(key)
    return JobDefaults(
        task=own.module_path,
        backend=alias,
        queue=validation.queue_name(queue),
        priority=validation.priority(priority),
        run_at=validation.run_at(run_at),
        max_attempts=validation.max_attempts(max_attempts),
        concurrency_key=key,
        tags=tuple(task_option(own, "tags") or ()),
    )


#: :func:`resolve`'s answers for a task given with nothing but a backend alias (what
#: ``Task.enqueue()`` asks, once per job), by (the ``Task``'s id or the dotted path,
#: alias); with each, the ``Task`` it is for (kept, so that its id is not reused while
#: the answer is there; for a path, checked on each use to be what the path names now)
#: and the ``PGQUEUE_MAX_ATTEMPTS`` it read (None: none; else checked on each use).
#: Emptied when a setting changes (``override_settings``: TASKS and every ``PGQUEUE_*``)
#: and when it holds :data:`RESOLVED_MAX` answers (``task.using(...)`` makes a new Task
#: each call). :func:`resolve` cost a third of an enqueue's own Python.
_RESOLVED: dict[tuple[int | str, str | None], tuple[Task, Any, JobDefaults]] = {}
RESOLVED_MAX = 256


def resolve_task(task: Task | str, backend: str | None) -> JobDefaults:
    """:func:`resolve` of a task (a ``Task`` or its dotted path) and ``backend`` alone,
    remembered."""
    key = (task if type(task) is str else id(task), backend)
    found = _RESOLVED.get(key)
    if found is not None and (found[0] is task or _names(task, found[0])):
        setting = found[1]
        if setting is None or setting == settings.MAX_ATTEMPTS:
            return found[2]
    resolved = resolve(task, backend=backend)
    own = task if isinstance(task, Task) else validation.task_object(task)
    from_setting = (
        task_option(own, "max_attempts") is None
        and backend_option(resolved.backend, "MAX_ATTEMPTS") is None
    )
    if len(_RESOLVED) >= RESOLVED_MAX:
        _RESOLVED.clear()
    _RESOLVED[key] = (own, resolved.max_attempts if from_setting else None, resolved)
    return resolved


def _names(path: Any, task: Task) -> bool:
    """True if the dotted ``path`` names ``task`` now (its module imported, the attribute
    that very object): what :func:`validation.task_object` would find."""
    if type(path) is not str:
        return False
    module, _, name = path.rpartition(".")
    return getattr(sys.modules.get(module), name, None) is task


@receiver(setting_changed)
def _forget_resolved(**kwargs: Any) -> None:
    _RESOLVED.clear()


def job_tags(resolved: JobDefaults, given: Any) -> list[str]:
    """A job's tags: the task's, then the call's ``given`` (checked; ``InvalidJob``
    naming what is wrong)."""
    if given is None:
        return list(resolved.tags)
    return validation.merged_tags(resolved.tags, validation.tags(given))


def concurrency_key(
    resolved: JobDefaults, args: Sequence[Any], kwargs: Mapping[str, Any] | None
) -> str:
    """The concurrency key of one job of ``resolved``: the resolved str, or what its
    callable returns for the call's ``args`` and ``kwargs``, checked. A callable that
    raises, or returns no valid key, raises ``InvalidJob`` naming it (nothing is
    written)."""
    key = resolved.concurrency_key
    if not callable(key):
        return key
    name = getattr(key, "__qualname__", None) or repr(key)
    try:
        made = key(*args, **(kwargs or {}))
    except Exception as exc:
        raise InvalidJob(
            f"concurrency_key callable {name} of {resolved.task} raised "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if made is None:
        raise InvalidJob(
            f"concurrency_key callable {name} of {resolved.task} returned None, not a str"
        )
    return validation.concurrency_key(made, source=f"concurrency_key callable {name}")


def job_payload(
    resolved: JobDefaults,
    args: Sequence[Any],
    kwargs: Mapping[str, Any] | None,
    *,
    max_bytes: int | None = None,
) -> tuple[str, str, str]:
    """The part of a new job that depends on its call, made the same way by every path
    (``Job.objects.enqueue``, bulk, workflows, periodic entries): its args and kwargs as
    checked JSON text (at most ``PGQUEUE_MAX_PAYLOAD_BYTES`` in all) and its concurrency
    key (the task's callable asked for this call). ``InvalidJob`` names what is wrong."""
    limit = settings.MAX_PAYLOAD_BYTES if max_bytes is None else max_bytes
    args_json, kwargs_json = validation.payload(args, kwargs, max_bytes=limit)
    return args_json, kwargs_json, concurrency_key(resolved, args, kwargs)


def prepare(
    task: Task | str,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    backend: str | None = None,
    queue: str | None = None,
    priority: int | None = None,
    run_at: dt.datetime | None = None,
    max_attempts: int | None = None,
    idempotency_key: str | None = None,
    concurrency_key: str | None = None,
    now: dt.datetime | None = None,
    soft_time_limit: float | None = None,
    time_limit: float | None = None,
    tags: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The statement parameters of one new job (``sql.JOB_ENQUEUE`` and its keyed and
    dependent forms): its defaults (:func:`resolve`), its key, payload and concurrency
    key (:func:`job_payload`), and the trace that enqueues it. Everything is checked
    before anything is written."""
    if (
        (backend is None or type(backend) is str)
        and queue is None
        and priority is None
        and run_at is None
        and max_attempts is None
        and concurrency_key is None
    ):
        resolved = resolve_task(task, backend)
    else:
        resolved = resolve(
            task,
            backend=backend,
            queue=queue,
            priority=priority,
            run_at=run_at,
            max_attempts=max_attempts,
            concurrency_key=concurrency_key,
        )
    key = validation.idempotency_key(idempotency_key)
    job_tags_ = job_tags(resolved, tags)
    args_json, kwargs_json, made_key = job_payload(resolved, args, kwargs)
    context = tracing.carrier()
    return {
        "backend": resolved.backend,
        "task": resolved.task,
        "queue": resolved.queue,
        "priority": resolved.priority,
        "run_at": resolved.run_at,
        "max_attempts": resolved.max_attempts,
        "idempotency_key": key,
        "concurrency_key": made_key,
        "soft_time_limit": validation.time_limit(soft_time_limit, "soft_time_limit"),
        "time_limit": validation.time_limit(time_limit, "time_limit"),
        "tags": job_tags_,
        "channel": settings.NOTIFY_CHANNEL,
        "now": now,
        "trace_context": None if context is None else json.dumps(context),
        "args": args_json,
        "kwargs": kwargs_json,
    }


def cache_key(task: Any, **given: Any) -> tuple[Any, ...] | None:
    """A key under which :func:`resolve`'s answer for these arguments may be reused
    within one bulk call (None: not hashable, resolve every time)."""
    if isinstance(task, Task):
        own: Any = (
            task.module_path,
            task.backend,
            task.queue_name,
            task.priority,
            task.run_after,
            task_option(task, "max_attempts"),
            task_option(task, "concurrency_key"),
            tuple(task_option(task, "tags") or ()),
        )
    else:
        own = task
    # The type too: True == 1 as a key, but True is no priority.
    key = (own, *sorted((name, type(value), value) for name, value in given.items()))
    try:
        hash(key)
    except TypeError:
        return None
    return key
