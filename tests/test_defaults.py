"""One resolution of a job's defaults: the same task with the same options stores the
same row whichever of the five ways it is enqueued (``Task.enqueue``,
``Job.objects.enqueue``, ``bulk_enqueue``, ``enqueue_many``, a periodic entry), the
backend's ``OPTIONS["MAX_ATTEMPTS"]`` included."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.test import override_settings

from django_pgqueue import defaults, enqueue_many, periodic
from django_pgqueue.exceptions import InvalidJob
from django_pgqueue.models import Job

from . import tasks as test_tasks

COLUMNS = ("backend", "queue", "task", "priority", "max_attempts", "status", "args", "kwargs")
T0 = dt.datetime(2030, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
PGQUEUE_BACKEND = "django_pgqueue.backend.PgQueueBackend"


def tasks_setting(max_attempts: int | None) -> dict[str, Any]:
    options = {} if max_attempts is None else {"MAX_ATTEMPTS": max_attempts}
    return {
        "default": {"BACKEND": PGQUEUE_BACKEND, "OPTIONS": options},
        "second": {"BACKEND": PGQUEUE_BACKEND, "OPTIONS": {"DATABASE": "second"}},
    }


def stored(job_id: int) -> tuple[Any, ...]:
    return tuple(Job.objects.filter(pk=job_id).values_list(*COLUMNS).get())


def newest() -> int:
    return Job.objects.order_by("-id").values_list("id", flat=True)[0]


def by_every_path(task: Any, path_options: dict[str, Any]) -> dict[str, tuple[Any, ...]]:
    """Enqueue ``task(5)`` by each path; the stored row of each, by path name."""
    rows = {}
    rows["Task.enqueue"] = stored(int(task.enqueue(5).id))
    rows["Job.objects.enqueue"] = stored(Job.objects.enqueue(task, [5]).id)
    rows["Job.objects.enqueue(path)"] = stored(Job.objects.enqueue(task.module_path, [5]).id)
    Job.objects.bulk_enqueue([{"task": task, "args": [5]}])
    rows["bulk_enqueue"] = stored(newest())
    Job.objects.bulk_enqueue([{"task": task.module_path, "args": [5]}])
    rows["bulk_enqueue(path)"] = stored(newest())
    enqueue_many(task, [((5,), {})])
    rows["enqueue_many"] = stored(newest())
    entry = {"task": task.module_path, "cron": "* * * * *", "args": [5], **path_options}
    with override_settings(PGQUEUE_PERIODIC={"defaults-test": entry}):
        periodic.enqueue_due(using="default", now=T0)  # first sight: no job
        (tick,) = periodic.enqueue_due(using="default", now=T0 + dt.timedelta(minutes=1))
    rows["periodic"] = stored(tick.job_id)
    return rows


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("task_name", "backend_attempts", "expected"),
    [
        # The backend's OPTIONS["MAX_ATTEMPTS"] where the task has no limit of its own.
        ("with_queue_and_priority", 2, ("emails", 7, 2)),
        # The task's own limit wins over the backend's.
        ("with_own_attempts", 2, ("emails", -3, 4)),
        # Neither: PGQUEUE_MAX_ATTEMPTS (5 by default).
        ("with_queue_and_priority", None, ("emails", 7, 5)),
    ],
)
def test_defaults__every_enqueue_path_stores_the_same_row(task_name, backend_attempts, expected):
    task = getattr(test_tasks, task_name)
    with override_settings(TASKS=tasks_setting(backend_attempts)):
        rows = by_every_path(task, {})
    queue, priority, attempts = expected
    want = ("default", queue, task.module_path, priority, attempts, "pending", [5], {})
    assert rows == dict.fromkeys(rows, want)


@pytest.mark.django_db
def test_defaults__call_options_win_on_every_path():
    task = test_tasks.with_own_attempts
    options = {"queue": "other", "priority": 9, "max_attempts": 3}
    with override_settings(TASKS=tasks_setting(2)):
        rows = {
            "Job.objects.enqueue": stored(Job.objects.enqueue(task, [5], **options).id),
            "Task.using": stored(int(task.using(queue_name="other", priority=9).enqueue(5).id)),
        }
        Job.objects.bulk_enqueue([{"task": task, "args": [5], **options}])
        rows["bulk_enqueue"] = stored(newest())
        entry = {"task": task.module_path, "cron": "* * * * *", "args": [5], **options}
        with override_settings(PGQUEUE_PERIODIC={"defaults-call": entry}):
            periodic.enqueue_due(using="default", now=T0)
            (tick,) = periodic.enqueue_due(using="default", now=T0 + dt.timedelta(minutes=1))
        rows["periodic"] = stored(tick.job_id)
    # Task.using cannot change the attempt limit: the task's own (4) stays.
    assert rows.pop("Task.using") == (
        "default",
        "other",
        task.module_path,
        9,
        4,
        "pending",
        [5],
        {},
    )
    want = ("default", "other", task.module_path, 9, 3, "pending", [5], {})
    assert rows == dict.fromkeys(rows, want)


@pytest.mark.django_db
def test_defaults__a_bad_backend_option_is_refused_naming_it():
    with override_settings(TASKS=tasks_setting(0)):
        with pytest.raises(InvalidJob, match="max_attempts must be an int >= 1, not 0"):
            Job.objects.enqueue(test_tasks.with_queue_and_priority, [5])
    assert Job.objects.count() == 0


def test_defaults__cache_key_tells_true_from_one():
    task = test_tasks.with_queue_and_priority
    assert defaults.cache_key(task, priority=1) != defaults.cache_key(task, priority=True)
    assert defaults.cache_key(task, queue=["unhashable"]) is None


@pytest.mark.django_db
def test_defaults__a_task_resolved_once_still_follows_the_settings(settings, monkeypatch):
    """Task.enqueue() resolves a task's defaults once (defaults.resolve_task); a change
    of PGQUEUE_MAX_ATTEMPTS, of TASKS, or of what a dotted path names is seen by the
    next enqueue all the same."""
    task = test_tasks.with_queue_and_priority
    path = task.module_path
    assert stored(int(task.enqueue(5).id))[4] == 5
    assert stored(Job.objects.enqueue(path, [5]).id)[4] == 5
    settings.PGQUEUE_MAX_ATTEMPTS = 8
    assert stored(int(task.enqueue(5).id))[4] == 8
    assert stored(Job.objects.enqueue(path, [5]).id)[4] == 8
    with override_settings(TASKS=tasks_setting(2)):
        assert stored(int(task.enqueue(5).id))[4] == 2
    # The path now names another task: its options, not the remembered ones.
    monkeypatch.setattr(test_tasks, "with_queue_and_priority", test_tasks.with_own_attempts)
    assert stored(Job.objects.enqueue(path, [5]).id)[3:5] == (-3, 4)
