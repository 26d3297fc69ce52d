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
    # A failure's line is kept where only Django's lines go (a project handler on the
    # framework's logger; on Django 6, its own mail_admins under "django" too).
    framework = logging.getLogger(FRAMEWORK)
    handler = Keep()
    framework.addHandler(handler)
    try:
        assert reporter.wants(task_finished, logging.ERROR)
        assert not reporter.wants(task_finished)
    finally:
        framework.removeHandler(handler)


def test_reporter__sees_logging_reconfigured_at_run_time(django_lines_dropped):
    reporter = Reporter(sender=PgQueueBackend, worker_id="w")
    assert not reporter.wants(task_started)
    framework = logging.getLogger(FRAMEWORK)
    # The line is wanted now: on, and taken by a handler the worker's own line does not
    # reach (under pytest both reach the root's capture handlers, where it is folded).
    framework.setLevel(logging.INFO)
    handler = Keep()
    framework.addHandler(handler)
    try:
        # Asked again once the cached answer is older than RECHECK_SECONDS.
        deadline = time.monotonic() + outcomes.RECHECK_SECONDS + 5
        while not reporter.wants(task_started):
            assert time.monotonic() < deadline, "the new logging level was never seen"
            time.sleep(0.05)
    finally:
        framework.removeHandler(handler)


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


# --- folding Django's per-job lines into the worker's own ---------------------------------


@pytest.fixture
def framework_info() -> Iterator[logging.Logger]:
    """The framework's logger at INFO (as Django's default logging has ``django``),
    its handlers and level put back afterwards."""
    framework = logging.getLogger(FRAMEWORK)
    level, handlers = framework.level, list(framework.handlers)
    framework.setLevel(logging.INFO)
    yield framework
    framework.setLevel(level)
    framework.handlers[:] = handlers


def test_reporter__folds_django_lines_where_the_workers_line_goes(framework_info, tmp_path):
    """Under pytest both lines reach the root's capture handlers: Django's is folded
    into the worker's. A handler only on ``django.tasks`` (another file) takes it: sent.
    Two handlers writing to one file are one place: folded again."""
    reporter = Reporter(sender=PgQueueBackend, worker_id="w")
    assert reporter.plan(task_started) is outcomes.Send.NOTHING
    assert reporter.plan(task_finished) is outcomes.Send.NOTHING
    own = logging.getLogger(outcomes.__name__)
    theirs = logging.FileHandler(tmp_path / "tasks.log")
    mine = logging.FileHandler(tmp_path / "tasks.log")  # the same file, another handler
    framework_info.addHandler(theirs)
    try:
        assert outcomes.destinations(framework_info, logging.INFO) - outcomes.destinations(
            own, logging.INFO
        )
        assert reporter._decide(task_started, logging.INFO) is outcomes.Send.ALL
        own.addHandler(mine)
        assert reporter._decide(task_started, logging.INFO) is outcomes.Send.NOTHING
    finally:
        own.removeHandler(mine)
        for handler in (theirs, mine):
            handler.close()


@pytest.mark.parametrize(
    ("choice", "expected"),
    [(True, outcomes.Send.ALL), (False, outcomes.Send.NOTHING), (None, outcomes.Send.NOTHING)],
)
def test_reporter__framework_log_lines_setting(framework_info, settings, choice, expected):
    settings.PGQUEUE_FRAMEWORK_LOG_LINES = choice
    reporter = Reporter(sender=PgQueueBackend, worker_id="w")
    assert reporter._decide(task_finished, logging.INFO) is expected
    framework_info.addHandler(Keep())  # a handler of django.tasks' own
    assert reporter._decide(task_finished, logging.INFO) is (
        outcomes.Send.NOTHING if choice is False else outcomes.Send.ALL
    )
    framework_info.setLevel(logging.WARNING)  # nothing to write: True sends nothing either
    assert reporter._decide(task_finished, logging.INFO) is outcomes.Send.NOTHING


@pytest.mark.django_db(transaction=True)
def test_worker__one_line_per_job_and_every_signal_to_the_projects_receivers(
    framework_info, job_factory, run_worker, caplog
):
    """With Django's lines folded, a project's receivers still get both signals of every
    job (with the job's TaskResult), Django's log receivers none, and the job is one
    line: the worker's, naming id, task, outcome, duration and attempt."""
    caplog.set_level(logging.INFO)
    jobs = [job_factory(args=[n, 1]) for n in range(3)]
    got: list[tuple[str, str, str]] = []

    def receiver(sender: object, task_result: Any, signal: Any, **kwargs: object) -> None:
        got.append((str(task_result.id), str(task_result.status), signal))

    task_started.connect(receiver)
    task_finished.connect(receiver)
    try:
        run_worker(concurrency=2)
    finally:
        task_started.disconnect(receiver)
        task_finished.disconnect(receiver)
    for job in jobs:
        mine = [(status, signal) for pk, status, signal in got if pk == str(job.id)]
        assert sorted(mine, key=str) == sorted(
            [("RUNNING", task_started), ("SUCCESSFUL", task_finished)], key=str
        )
        lines = [r for r in caplog.records if f"job {job.id} " in r.getMessage()]
        assert [(r.name, r.getMessage().split(" in ")[0], r.action) for r in lines] == [
            (outcomes.__name__, f"job {job.id} testproject.demo.tasks.add done", "done")
        ]
        assert lines[0].getMessage().endswith("(attempt 1)")
        assert (lines[0].job_id, lines[0].funcName) == (job.id, "done")
    assert [r for r in caplog.records if r.name == FRAMEWORK] == []


def test_configure_logging__verbosity_0_silences_djangos_task_lines(framework_info):
    from django_pgqueue.management.base import configure_logging

    ours = logging.getLogger("django_pgqueue")
    level = ours.level
    try:
        configure_logging(0)
        assert not framework_info.isEnabledFor(logging.INFO)
        assert framework_info.isEnabledFor(logging.WARNING)
        assert not ours.isEnabledFor(logging.INFO)
    finally:
        ours.setLevel(level)


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
    framework = logging.getLogger(FRAMEWORK)
    handler = Keep()  # takes Django's (failure) lines, which the worker's do not reach
    framework.addHandler(handler)
    try:
        run_worker()
    finally:
        framework.removeHandler(handler)
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


def test_cancel_flag__calls_back_when_set_or_at_once_if_set_already():
    calls: list[str] = []
    flag = CancelFlag()
    flag.on_set(lambda: calls.append("later"))
    assert calls == []
    threading.Thread(target=flag.set).start()
    wait_until = time.monotonic() + 10
    while not calls and time.monotonic() < wait_until:
        time.sleep(0.01)
    assert calls == ["later"]
    flag.on_set(lambda: calls.append("at once"))  # set already: called here
    assert calls == ["later", "at once"]


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


# --- what a worker process writes per job -------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_process__one_line_per_job_with_root_logging(job_factory, manage, tmp_path):
    """Real workers with a console handler on the root logger at INFO (how most projects
    configure logging): one line per job (the worker's), also with ``DEBUG`` on
    (Django's console handler writes to the same stderr); none with ``-v 0``; and a
    project handler on ``django.tasks`` still gets Django's own two lines."""
    tasks_log = tmp_path / "tasks.log"
    runs = [
        ({}, []),
        ({"DEBUG": "1"}, []),
        ({"TASKS_LOG_FILE": str(tasks_log)}, []),
        ({}, ["-v", "0"]),
    ]
    for env, flags in runs:
        jobs = [job_factory(args=[n, 1]) for n in range(3)]
        worker = manage(
            "pgqueue_worker", "--burst", "--concurrency", "2", "--poll-interval", "0.1", *flags,
            env={"DJANGO_SETTINGS_MODULE": "tests.settings_root_logging", **env},
        )  # fmt: skip
        assert worker.wait(60) == 0, worker.output()
        output = worker.output()
        # None of Django's lines on the console; but where a project handler on
        # django.tasks takes them, they also propagate to the root's, as it configured.
        assert output.count("Task id=") == (6 if "TASKS_LOG_FILE" in env else 0), output
        for job in jobs:
            assert Job.objects.get(pk=job.pk).status == "done"
            lines = [line for line in output.splitlines() if f"job {job.id} " in line]
            if flags:
                assert lines == [], output  # -v 0: warnings only
            else:
                assert len(lines) == 1, output
                assert "testproject.demo.tasks.add done in " in lines[0]
                assert lines[0].endswith("(attempt 1)")
        if flags:
            assert " INFO " not in output, output
    # The project's own handler on django.tasks took Django's lines, as it asked.
    written = tasks_log.read_text()
    for state in ("RUNNING", "SUCCESSFUL"):
        assert written.count(f"state={state}") == 3, written
