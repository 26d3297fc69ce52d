"""django_pgqueue.testing through the ``pgqueue`` fixture of the package's pytest plugin,
as a project's pytest-django tests use it."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import tomllib
import traceback
from unittest import mock

import pytest
from django.db import OperationalError, transaction
from django.utils import timezone

from django_pgqueue import chain, step, testing
from django_pgqueue.exceptions import NotRecorded
from django_pgqueue.manager import JobManager
from django_pgqueue.models import Job
from testproject.demo import tasks as demo
from testproject.demo.models import Delivery
from tests import tasks
from tests.conftest import REPO, connect_test_db


def later(**delta: float) -> dt.datetime:
    return timezone.now() + dt.timedelta(**delta)


def job_of(result) -> Job:
    """The Job of a ``task.enqueue()`` result."""
    return Job.objects.get(pk=result.id)


def running() -> list[int]:
    return list(Job.objects.filter(status="running").values_list("id", flat=True))


@pytest.fixture
def slow_backoff(settings):
    """Retries at least 45 s after a failure: not due unless the test moves the clock."""
    settings.PGQUEUE_RETRY_BACKOFF_BASE = 60.0


def test_pgqueue__is_the_testing_module_with_database_access(pgqueue):
    assert pgqueue is testing
    job = job_of(demo.add.enqueue(1, 2))
    assert pgqueue.enqueued(demo.add) == [job]


def test_pgqueue__a_failing_task_retried_by_now_until_dead(pgqueue, slow_backoff):
    job = job_of(demo.always_fails.using(priority=5).enqueue("bad input"))
    assert pgqueue.run_jobs().counts == {"retried": 1}
    pgqueue.assert_enqueued(demo.always_fails, args=["bad input"], status="scheduled")
    assert pgqueue.run_jobs().runs == ()  # the retry is not due yet
    summary = pgqueue.run_jobs(now=later(days=1))
    assert summary.counts == {"retried": 3, "dead": 1}
    row = Job.objects.get(pk=job.pk)
    assert (row.status, row.attempts, len(row.errors)) == ("dead", 5, 5)
    pgqueue.assert_not_enqueued(demo.always_fails)


def test_pgqueue__a_chain_runs_to_its_end(pgqueue):
    chain(step(tasks.double, 3), tasks.double, tasks.double).enqueue()
    summary = pgqueue.run_jobs()
    assert [(j.task, j.result) for j in summary.jobs] == [
        ("tests.tasks.double", n) for n in (6, 12, 24)
    ]


def test_pgqueue__a_debounced_job_runs_once(pgqueue):
    for n in range(3):
        Job.objects.enqueue(tasks.echo, [n], idempotency_key="k", debounce=60)
    pgqueue.assert_enqueued(tasks.echo, count=1, status="scheduled")
    assert pgqueue.run_jobs().runs == ()
    (run,) = pgqueue.run_jobs(now=later(minutes=2)).runs
    assert (run.outcome, run.job.result) == ("done", {"args": [2], "kwargs": {}})


def test_pgqueue__a_limited_key(pgqueue, settings):
    settings.PGQUEUE_LIMITS = {"testing-limited": {"rate": "1/h"}}
    first, second = (job_of(tasks.limited.enqueue(n)) for n in (1, 2))
    assert [j.id for j in pgqueue.run_jobs().jobs] == [first.id]
    pgqueue.assert_enqueued(tasks.limited, args=[2], count=1)
    assert [j.id for j in pgqueue.run_jobs(now=later(hours=2)).jobs] == [second.id]


def test_pgqueue__a_transactional_task_rolled_back_by_the_test(pgqueue):
    job = job_of(tasks.deliver.enqueue("ann"))
    with transaction.atomic():
        assert pgqueue.run_jobs().done == 1
        assert Delivery.objects.filter(job_id=job.id).exists()
        transaction.set_rollback(True)
    assert not Delivery.objects.exists()
    assert Job.objects.get(pk=job.pk).status == "pending"
    pgqueue.assert_enqueued(tasks.deliver, args=["ann"])


def test_pgqueue__raise_errors_after_the_failure_is_written(pgqueue, slow_backoff):
    job = job_of(tasks.deliver.enqueue("ben", fail=True))
    with pytest.raises(ValueError, match="could not deliver to ben") as caught:
        pgqueue.run_jobs(raise_errors=True)
    assert traceback.extract_tb(caught.value.__traceback__)[-1].name == "deliver"
    row = Job.objects.get(pk=job.pk)
    assert (row.status, row.attempts) == ("scheduled", 1)
    assert not Delivery.objects.exists()
    assert running() == []


def test_pgqueue__never_leaves_a_job_running_when_its_outcome_cannot_be_written(pgqueue):
    job = job_of(demo.always_fails.enqueue("x"))
    with mock.patch.object(JobManager, "fail", side_effect=OperationalError("planted")):
        with pytest.raises(NotRecorded, match=f"job {job.id} .*given back") as caught:
            pgqueue.run_jobs()
    assert isinstance(caught.value.__cause__, ValueError)  # the task's own error
    assert running() == []
    assert Job.objects.get(pk=job.pk).attempts == 0


@pytest.mark.django_db(transaction=True)
def test_pgqueue__with_transaction_true_each_job_commits(pgqueue):
    job = job_of(tasks.deliver.enqueue("cat"))
    failing = job_of(tasks.deliver.enqueue("dan", fail=True))
    assert pgqueue.run_jobs().counts == {"done": 1, "retried": 1}
    with connect_test_db() as other:
        rows = other.execute("SELECT id, status FROM pgqueue_job ORDER BY id").fetchall()
        assert rows == [(job.id, "done"), (failing.id, "scheduled")]
        assert other.execute("SELECT recipient FROM demo_delivery").fetchall() == [("cat",)]
    assert running() == []


@pytest.mark.django_db(transaction=True)
def test_pgqueue__with_transaction_true_a_raising_task_is_not_left_running(pgqueue, slow_backoff):
    demo.always_fails.enqueue("y")
    with pytest.raises(ValueError, match="y"):
        pgqueue.run_jobs(raise_errors=True)
    assert running() == []


def test_plugin__declared_as_a_pytest11_entry_point():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    entry = project["entry-points"]["pytest11"]
    assert entry == {"django_pgqueue.pytest_plugin": "django_pgqueue.pytest_plugin"}


def test_plugin__loading_it_imports_no_django():
    code = (
        "import sys, django_pgqueue.pytest_plugin\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'psycopg')"
        " or m.startswith('django_pgqueue.')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout.strip()
    assert out == "['django_pgqueue.pytest_plugin', 'django_pgqueue.signals']"


@pytest.mark.slow
def test_plugin__a_test_asking_only_for_pgqueue_gets_the_test_database(tmp_path):
    """pytest-django creates the test databases for the tests that ask for ``db`` when
    collected: the fixture asks for it in its signature. (Looked up when the fixture
    ran, the lone test below ran against the settings' own database.)"""
    (tmp_path / "test_alone.py").write_text(
        "import os\n"
        "from django.db import connection\n"
        "from testproject.demo import tasks\n\n\n"
        "def test_alone(pgqueue):\n"
        "    assert connection.settings_dict['NAME'] == os.environ['PGQUEUE_TEST_DB']\n"
        "    tasks.add.enqueue(2, 2)\n"
        "    assert [job.result for job in pgqueue.run_jobs().jobs] == [4]\n"
    )
    database = os.environ.get("PGQUEUE_TEST_DB") or "test_pgqueue"
    result = subprocess.run(
        [
            sys.executable,
            *("-m", "pytest", "-p", "django_pgqueue.pytest_plugin", "-p", "no:cacheprovider"),
            *("--ds", "testproject.settings", "-q", "test_alone.py"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO), "PGQUEUE_TEST_DB": f"{database}_alone"},
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
    assert "1 passed" in result.stdout
