"""What the worker skips on every job because it would change nothing, and that it
skips nothing that would: Django's own log receivers whose line reaches no handler
(``Reporter.wants``, ``would_log``), spans with no tracer provider, the cancellation
flag's event."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from django_pgqueue.backend import PgQueueBackend
from django_pgqueue.models import Job
from django_pgqueue.taskapi import FRAMEWORK, task_finished, task_started
from django_pgqueue.tasks import CancelFlag
from django_pgqueue.worker import outcomes, runner
from django_pgqueue.worker.outcomes import Reporter, would_log
from testproject.demo import tasks

# --- would_log: the logging module's own rules ------------------------------------------


class Keep(logging.Handler):
    def __init__(self, level: int = logging.NOTSET) -> None:
        super().__init__(level)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def log() -> logging.Logger:
    """A logger under a parent of its own, outside the logging tree (so that neither
    the root's handlers nor those pytest adds to every logger apply)."""
    parent = logging.Logger("pgqueue_test_reporting")
    child = logging.Logger("pgqueue_test_reporting.child")
    child.parent = parent
    return child


def test_would_log__follows_levels_filters_and_propagation(log):
    parent = log.parent
    assert parent is not None
    parent.setLevel(logging.INFO)
    handler = Keep(logging.WARNING)
    parent.addHandler(handler)
    assert not would_log(log, logging.INFO)  # below the only handler's level
    assert would_log(log, logging.WARNING)
    handler.addFilter(lambda record: False)
    assert not would_log(log, logging.ERROR)  # the handler's filter drops everything
    log.addHandler(Keep())
    assert would_log(log, logging.INFO)  # the child's own handler takes it
    log.propagate = False
    log.handlers.clear()
    assert would_log(log, logging.WARNING)  # no handler at all: the last resort prints it
    assert not would_log(log, logging.INFO)  # ... from WARNING up only
    log.propagate = True
    log.addFilter(lambda record: False)
    assert not would_log(log, logging.CRITICAL)  # the logger's own filter
    log.filters.clear()
    log.disabled = True
    assert not would_log(log, logging.CRITICAL)
    # Probing emits nothing.
    assert handler.records == []


# --- Reporter.wants: Django's own receivers ---------------------------------------------


@pytest.fixture
def django_lines_dropped() -> Iterator[None]:
    """The framework's INFO lines dropped, as a project logging ``django.tasks`` at
    WARNING has them. (Django's default, a console handler that drops them without
    DEBUG, cannot be had under pytest, whose capture handlers take every line; the
    handler's filter is the case of ``test_would_log__...`` above.)"""
    framework = logging.getLogger(FRAMEWORK)
    level = framework.level
    framework.setLevel(logging.WARNING)
    yield
    framework.setLevel(level)


def test_reporter__skips_django_log_receivers_whose_line_is_dropped(django_lines_dropped):
    reporter = Reporter(sender=PgQueueBackend, worker_id="w")
    assert not reporter.wants(task_started)
    assert not reporter.wants(task_finished)
    assert reporter.wants(task_finished, logging.ERROR)  # a failure's line is kept


def test_reporter__sees_logging_reconfigured_at_run_time(django_lines_dropped):
    reporter = Reporter(sender=PgQueueBackend, worker_id="w")
    assert not reporter.wants(task_started)
    logging.getLogger(FRAMEWORK).setLevel(logging.INFO)  # the line is wanted now
    # Asked again once the cached answer is older than RECHECK_SECONDS.
    deadline = time.monotonic() + outcomes.RECHECK_SECONDS + 5
    while not reporter.wants(task_started):
        assert time.monotonic() < deadline, "the new logging level was never seen"
        time.sleep(0.05)


def test_reporter__sends_at_once_to_a_receiver_connected_later(django_lines_dropped):
    """A new receiver changes the signal's receivers: the cached answer is not used."""
    reporter = Reporter(sender=PgQueueBackend, worker_id="w")
    assert not reporter.wants(task_started)

    def receiver(sender: object, **kwargs: object) -> None:
        pass

    task_started.connect(receiver)
    try:
        assert reporter.wants(task_started)
    finally:
        task_started.disconnect(receiver)
    assert not reporter.wants(task_started)


# --- the worker's per-job path ----------------------------------------------------------


@pytest.fixture
def task_results(monkeypatch) -> list[str]:
    """Job ids of every ``TaskResult`` the runner builds."""
    built: list[str] = []
    real = runner.to_task_result

    def counting(job: Job, task: Any) -> Any:
        built.append(str(job.id))
        return real(job, task)

    monkeypatch.setattr(runner, "to_task_result", counting)
    monkeypatch.setattr(outcomes, "to_task_result", counting)  # a failure's, if needed
    return built


@pytest.mark.django_db(transaction=True)
def test_worker__builds_no_task_result_nobody_reads(
    django_lines_dropped, task_results, job_factory, run_worker, settings
):
    """A job whose signals reach only Django's dropped log lines costs no TaskResult;
    the final failure of another is still sent (its ERROR line is kept)."""
    settings.PGQUEUE_RETRY_BACKOFF_BASE = 0
    ok = job_factory(args=[1, 2])
    bad = job_factory(task=tasks.always_fails, args=["kaput"], max_attempts=1)
    run_worker()
    assert Job.objects.get(pk=ok.pk).status == "done"
    assert Job.objects.get(pk=bad.pk).status == "dead"
    assert task_results == [str(bad.id)]  # built at the failure, for task_finished


@pytest.mark.django_db(transaction=True)
def test_worker__django_lines_still_logged_when_a_handler_takes_them(job_factory, run_worker):
    job = job_factory(args=[1, 2])
    handler = Keep()
    framework = logging.getLogger(FRAMEWORK)
    level = framework.level
    # INFO on, as a project that wants these lines has it (Django's own logging sets
    # it for "django.tasks"; the backport's "django_tasks" is under the root's WARNING).
    framework.setLevel(logging.INFO)
    framework.addHandler(handler)
    try:
        run_worker()
    finally:
        framework.removeHandler(handler)
        framework.setLevel(level)
    states = [str(r.args[2]) for r in handler.records if r.args and r.args[0] == str(job.id)]
    assert states == ["RUNNING", "SUCCESSFUL"]


# --- CancelFlag ---------------------------------------------------------------------------


def test_cancel_flag__is_an_event():
    flag = CancelFlag()
    assert not flag.is_set()
    assert flag.wait(0.01) is False
    threading.Timer(0.05, flag.set).start()
    assert flag.wait(10) is True  # woken by set() from another thread
    assert flag.is_set()
    assert CancelFlag().wait(0) is False
    early = CancelFlag()
    early.set()
    assert early.wait(0) is True  # set before anything waited
