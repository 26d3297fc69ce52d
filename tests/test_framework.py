"""framework.py: which stored task paths are gone for good, and which failures of an
import are retried (a deploy may be in progress)."""

from __future__ import annotations

import logging

import pytest

from django_pgqueue.framework import TaskGone, load_task
from django_pgqueue.models import Job
from django_pgqueue.taskapi import FRAMEWORK


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("tests.no_such_module.task", "does not import"),
        ("no_such_package.tasks.task", "does not import"),
        ("tests.tasks.no_such_task", "does not import"),
        ("testproject.demo.tasks.not_a_task", f"not a {FRAMEWORK}.Task"),
        ("nodots", "not a dotted path"),
    ],
)
def test_load_task__own_module_or_name_missing_is_gone(path, message):
    with pytest.raises(TaskGone, match=message):
        load_task(path)


@pytest.mark.parametrize(
    ("path", "error"),
    [
        ("tests.broken_dependency.uses_dependency", ModuleNotFoundError),
        ("tests.raises_at_import.task", RuntimeError),
    ],
)
def test_load_task__an_import_that_raises_is_not_gone(path, error):
    with pytest.raises(error) as caught:
        load_task(path)
    assert not isinstance(caught.value, TaskGone)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("path", "raised"),
    [
        ("tests.broken_dependency.uses_dependency", "builtins.ModuleNotFoundError"),
        ("tests.raises_at_import.task", "builtins.RuntimeError"),
    ],
)
def test_worker__task_whose_import_raises_is_retried_and_logged(run_worker, caplog, path, raised):
    job = Job.objects.create(task=path, max_attempts=3, args=[], kwargs={})
    with caplog.at_level(logging.ERROR, logger="django_pgqueue"):
        run_worker(concurrency=1)
    job.refresh_from_db()
    assert (job.status, job.attempts) == ("scheduled", 1)  # a retry, with backoff
    assert job.errors[-1]["exception_class_path"] == raised
    records = [r for r in caplog.records if getattr(r, "action", None) == "import_error"]
    assert records, "the failed import was not logged"
    assert records[0].levelno == logging.ERROR
    assert records[0].exc_info is not None  # with its traceback


@pytest.mark.django_db(transaction=True)
def test_worker__task_whose_module_is_gone_is_dead_at_once(run_worker):
    job = Job.objects.create(task="tests.no_such_module.task", max_attempts=3, args=[], kwargs={})
    run_worker(concurrency=1)
    job.refresh_from_db()
    assert (job.status, job.attempts) == ("dead", 1)
    assert job.errors[-1]["exception_class_path"] == "django_pgqueue.exceptions.TaskNotFound"
