"""PgQueueBackend: django.tasks' contract on top of the jobs table."""

from __future__ import annotations

import asyncio
import datetime as dt
import re

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings as django_settings
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connections, transaction
from django.test import override_settings

from django_pgqueue.backend import PgQueueBackend
from django_pgqueue.exceptions import InvalidJob
from django_pgqueue.models import Job
from django_pgqueue.sweeper import promote_due
from django_pgqueue.taskapi import (
    TaskContext,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task,
    task_backends,
    task_enqueued,
)
from testproject.demo import tasks
from testproject.demo.models import Delivery
from tests.tasks import async_add

S = dt.timedelta(seconds=1)
BACKEND = "django_pgqueue.backend.PgQueueBackend"


@task(takes_context=True)
def context_probe(context: TaskContext, fail_first: bool = False) -> dict:
    """What a task sees of its own job; fails its first attempt if asked to."""
    if fail_first and context.attempt == 1:
        raise RuntimeError("first attempt fails")
    return {"id": context.task_result.id, "attempt": context.attempt}


def fresh(job_id: int | str) -> Job:
    return Job.objects.get(pk=int(job_id))


# --- enqueue -------------------------------------------------------------------------


def test_backend__is_the_configured_default():
    assert isinstance(task_backends["default"], PgQueueBackend)


def test_backend__supports_flags():
    backend = task_backends["default"]
    assert backend.supports_defer is True
    assert backend.supports_priority is True
    assert backend.supports_get_result is True
    assert backend.supports_async_task is True


@pytest.mark.django_db
def test_backend__enqueue_stores_a_job_and_returns_its_result(django_assert_num_queries):
    sent = []

    def receiver(sender, task_result, **kwargs):
        sent.append(task_result.id)

    task_enqueued.connect(receiver)
    try:
        with django_assert_num_queries(1):
            result = tasks.add.enqueue(1, b=2)
    finally:
        task_enqueued.disconnect(receiver)
    assert isinstance(result, TaskResult)
    job = fresh(result.id)
    assert result.id == str(job.id)
    assert sent == [result.id]
    assert (job.task, job.args, job.kwargs) == ("testproject.demo.tasks.add", [1], {"b": 2})
    assert (job.status, job.queue, job.priority, job.backend) == (
        "pending",
        "default",
        0,
        "default",
    )
    assert result.status == TaskResultStatus.READY
    assert (result.args, result.kwargs, result.attempts) == ([1], {"b": 2}, 0)
    assert result.enqueued_at == job.created_at


@pytest.mark.django_db
def test_backend__using_options_are_stored(now):
    run_after = dt.datetime.now(dt.UTC) + dt.timedelta(days=1)
    result = tasks.add.using(priority=7, queue_name="mail", run_after=run_after).enqueue(1, 2)
    job = fresh(result.id)
    assert (job.priority, job.queue, job.run_at, job.status) == (7, "mail", run_after, "scheduled")
    assert result.status == TaskResultStatus.READY
    assert result.task.priority == 7


@pytest.mark.django_db
def test_backend__run_after_in_the_past_is_pending():
    result = tasks.add.using(run_after=dt.datetime(2000, 1, 1, tzinfo=dt.UTC)).enqueue(1, 2)
    assert fresh(result.id).status == "pending"


@pytest.mark.django_db
def test_backend__max_attempts_option_is_used():
    opts = {"BACKEND": BACKEND, "OPTIONS": {"MAX_ATTEMPTS": 2}}
    with override_settings(TASKS={"default": {"BACKEND": BACKEND}, "opts": opts}):
        result = task_backends["opts"].enqueue(tasks.add, [1, 2], {})
    assert fresh(result.id).max_attempts == 2


@pytest.mark.django_db
def test_backend__bad_arguments_are_rejected_before_writing():
    with pytest.raises(InvalidJob, match=r"args\[0\] is nan"):
        tasks.add.enqueue(float("nan"), 1)
    assert Job.objects.count() == 0


# --- get_result: status mapping ---------------------------------------------------------


@pytest.mark.django_db
def test_get_result__pending_and_scheduled_are_ready(now):
    pending = tasks.add.enqueue(1, 2)
    later = tasks.add.using(run_after=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))
    scheduled = later.enqueue(1, 2)
    assert fresh(scheduled.id).status == "scheduled"
    for result in (pending, scheduled):
        got = tasks.add.get_result(result.id)
        assert got.status == TaskResultStatus.READY
        assert not got.is_finished
        with pytest.raises(ValueError, match="not finished"):
            _ = got.return_value


@pytest.mark.django_db
def test_get_result__running_is_running(now):
    result = tasks.add.enqueue(1, 2)
    (job,) = Job.objects.claim("w1", limit=1, now=now)
    got = task_backends["default"].get_result(result.id)
    assert got.status == TaskResultStatus.RUNNING
    assert (got.started_at, got.last_attempted_at) == (now, now)
    assert (got.attempts, got.worker_ids) == (1, ["w1"])


@pytest.mark.django_db
def test_get_result__done_is_successful_with_the_return_value(now):
    result = tasks.add.enqueue(1, 2)
    (job,) = Job.objects.claim("w1", limit=1, now=now)
    assert Job.objects.complete(job, "w1", result=3, now=now + S)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 3
    assert result.finished_at == now + S
    assert (result.attempts, result.errors) == (1, [])


@pytest.mark.django_db
def test_get_result__dead_is_failed_with_one_error_per_attempt(now):
    result = tasks.always_fails.using().enqueue("nope")
    Job.objects.filter(pk=result.id).update(max_attempts=3)
    for attempt in range(1, 4):
        at = now + dt.timedelta(hours=attempt)
        promote_due("default", now=at)
        (job,) = Job.objects.claim(f"w{attempt}", limit=1, now=at)
        try:
            tasks.always_fails.call("nope")
        except ValueError as exc:
            Job.objects.fail(job, f"w{attempt}", exc, now=at)
    got = tasks.always_fails.get_result(result.id)
    assert fresh(result.id).status == "dead"
    assert got.status == TaskResultStatus.FAILED
    assert got.attempts == fresh(result.id).attempts == 3
    assert got.worker_ids == ["w1", "w2", "w3"]
    assert len(got.errors) == 3
    assert {e.exception_class_path for e in got.errors} == {"builtins.ValueError"}
    assert got.errors[0].exception_class is ValueError
    assert "ValueError: nope" in got.errors[-1].traceback
    with pytest.raises(ValueError, match="Task failed"):
        _ = got.return_value


@pytest.mark.django_db
def test_get_result__success_after_a_retry_counts_both_attempts(now):
    result = tasks.add.enqueue(1, 2)
    (job,) = Job.objects.claim("w1", limit=1, now=now)
    Job.objects.fail(job, "w1", RuntimeError("transient"), now=now)
    promote_due("default", now=now + dt.timedelta(hours=1))
    (job,) = Job.objects.claim("w2", limit=1, now=now + dt.timedelta(hours=1))
    Job.objects.complete(job, "w2", result=3)
    got = tasks.add.get_result(result.id)
    assert got.status == TaskResultStatus.SUCCESSFUL
    assert (got.attempts, got.worker_ids, len(got.errors)) == (2, ["w1", "w2"], 1)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "result_id", ["999999999", "99999999999999999999", "-1", "1.5", "not-a-number", "", None]
)
def test_get_result__unknown_id_does_not_exist(result_id):
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result(result_id)


@pytest.mark.django_db
def test_get_result__job_whose_task_is_gone_does_not_exist():
    result = tasks.add.enqueue(1, 2)
    Job.objects.filter(pk=result.id).update(task="testproject.demo.tasks.gone")
    with pytest.raises(TaskResultDoesNotExist, match="does not import"):
        task_backends["default"].get_result(result.id)


# --- check() ---------------------------------------------------------------------------


def test_check__default_configuration_is_clean():
    assert task_backends["default"].check() == []
    call_command("check", "--fail-level", "WARNING")


def test_check__missing_app_is_e001():
    apps = [app for app in django_settings.INSTALLED_APPS if app != "django_pgqueue"]
    with override_settings(INSTALLED_APPS=apps):
        messages = PgQueueBackend("x", {"BACKEND": BACKEND}).check()
    assert [m.id for m in messages] == ["pgqueue.E001"]
    assert "INSTALLED_APPS" in messages[0].hint


def test_check__unknown_database_alias_is_e002():
    backend = PgQueueBackend("x", {"BACKEND": BACKEND, "OPTIONS": {"DATABASE": "nope"}})
    messages = backend.check()
    assert [m.id for m in messages] == ["pgqueue.E002"]
    assert "'nope'" in messages[0].msg


def test_check__non_postgresql_database_is_e003(monkeypatch):
    # The dummy engine never connects; only its vendor ("unknown") matters here.
    monkeypatch.setitem(connections.settings, "other", {"ENGINE": "django.db.backends.dummy"})
    try:
        backend = PgQueueBackend("x", {"BACKEND": BACKEND, "OPTIONS": {"DATABASE": "other"}})
        messages = backend.check()
    finally:
        if "other" in connections:
            del connections["other"]
    assert [m.id for m in messages] == ["pgqueue.E003"]
    assert "not PostgreSQL" in messages[0].msg


# --- context, through a real worker ------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_backend__context_task_sees_its_job_id_and_attempt(run_worker):
    result = context_probe.enqueue(fail_first=True)
    run_worker()
    job = fresh(result.id)
    assert (job.status, job.attempts) == ("scheduled", 1)
    promote_due("default", now=job.run_at)
    run_worker()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"id": result.id, "attempt": 2}
    assert result.attempts == 2
    assert len(result.errors) == 1


@pytest.mark.django_db(transaction=True)
def test_backend__demo_context_task_records_one_delivery_per_job(run_worker):
    first = tasks.send_notification.enqueue("ada@example.com")
    second = tasks.send_notification.enqueue("bob@example.com")
    run_worker(concurrency=2)
    for result in (first, second):
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert result.return_value == int(result.id)
    deliveries = dict(Delivery.objects.values_list("job_id", "recipient"))
    assert deliveries == {int(first.id): "ada@example.com", int(second.id): "bob@example.com"}


@pytest.mark.django_db(transaction=True)
def test_backend__async_task_and_async_api(run_worker):
    try:
        result = asyncio.run(async_add.aenqueue(2, 3))
        assert fresh(result.id).task == "tests.tasks.async_add"
        run_worker()
        got = asyncio.run(async_add.aget_result(result.id))
        assert got.status == TaskResultStatus.SUCCESSFUL
        assert got.return_value == 5
        asyncio.run(result.arefresh())
        assert result.status == TaskResultStatus.SUCCESSFUL
    finally:
        # The async API ran in asgiref's sync thread: close that thread's connection.
        asyncio.run(sync_to_async(connections.close_all)())


@pytest.mark.django_db
def test_backend__enqueue_joins_the_callers_transaction():
    with pytest.raises(RuntimeError), transaction.atomic():
        result = tasks.add.enqueue(1, 2)
        assert Job.objects.filter(pk=result.id).exists()
        raise RuntimeError
    assert Job.objects.count() == 0


# --- the app's settings checks (checks.py) ---------------------------------------------


@pytest.mark.parametrize(
    ("setting", "value", "check_id"),
    [
        ("PGQUEUE_LEASE_SECONDS", 0, "pgqueue.E010"),
        ("PGQUEUE_LEASE_SECONDS", "300", "pgqueue.E010"),
        ("PGQUEUE_MAX_ATTEMPTS", 0, "pgqueue.E011"),
        ("PGQUEUE_MAX_ATTEMPTS", True, "pgqueue.E011"),
        ("PGQUEUE_JOB_TIMEOUT_SECONDS", 1, "pgqueue.W001"),
    ],
)
def test_checks__bad_settings_are_reported(settings, setting, value, check_id):
    setattr(settings, setting, value)
    with pytest.raises(SystemCheckError, match=re.escape(f"({check_id})")):
        call_command("check", "--fail-level", "WARNING")
