"""Issue 28, item 2, with real processes: ``pgqueue_sweep --now``, the documented way
to test schedules, ran the whole pass at the pinned time. On a database with a live
worker a future time deleted the finished jobs and the worker's row, ran a job
scheduled days ahead and took back the running job's lease (it then ran twice). Now the
pinned clock drives the periodic part only."""

from __future__ import annotations

import datetime as dt
import json
import signal

import pytest
from django.db import connection
from django.utils import timezone

from django_pgqueue.models import Job
from tests.conftest import wait_for
from tests.tasks import sleep_after_marking

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

T0 = dt.datetime(2030, 1, 1, 3, 0, 0, tzinfo=dt.UTC)  # years after the database's clock
ENTRIES = {"e": {"task": "tests.tasks.record_tick", "cron": "* * * * *", "args": ["x"]}}


def workers() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT id FROM pgqueue_worker ORDER BY id")
        return [row[0] for row in cursor.fetchall()]


def test_sweep_now__pins_only_the_periodic_part_beside_a_live_worker(manage, tmp_path):
    marker = tmp_path / "started"
    running = Job.objects.enqueue(sleep_after_marking, [str(marker), 20])
    worker = manage(
        "pgqueue_worker", "--worker-id", "live-1", "--lease-seconds", "2",
        "--poll-interval", "0.1", "--grace-seconds", "0",
    )  # fmt: skip
    wait_for(marker.exists, timeout=30)
    finished = Job.objects.enqueue("testproject.demo.tasks.add", [1, 2])
    Job.objects.filter(pk=finished.pk).update(status="done", finished_at=timezone.now(), result=3)
    later = Job.objects.enqueue(
        "testproject.demo.tasks.add", [2, 3], run_at=timezone.now() + dt.timedelta(days=3)
    )
    assert Job.objects.get(pk=later.pk).status == "scheduled"
    assert workers() == ["live-1"]
    attempts = Job.objects.get(pk=running.pk).attempts

    outputs = []
    for at in (T0, T0 + dt.timedelta(minutes=1)):  # a new entry ticks from the second
        sweeper = manage(
            "pgqueue_sweep", "--now", at.isoformat(),
            env={"PGQUEUE_PERIODIC": json.dumps(ENTRIES)},
        )  # fmt: skip
        assert sweeper.wait() == 0, sweeper.output()
        outputs.append(sweeper.output())
    assert "periodic=1" in outputs[1], outputs  # the schedule was tested at T0 + 1 min
    assert Job.objects.filter(task="tests.tasks.record_tick").count() == 1
    for output in outputs:  # and nothing else was touched
        for figure in ("recovered=0", "promoted=0", "pruned=0", "lost_workers=0"):
            assert figure in output, output
    assert Job.objects.filter(pk=finished.pk).exists()  # not pruned
    assert workers() == ["live-1"]  # the live worker's row is kept
    assert Job.objects.get(pk=later.pk).status == "scheduled"  # not run 3 days early
    row = Job.objects.get(pk=running.pk)  # its lease was not taken back
    assert (row.status, row.lease_owner, row.attempts) == ("running", "live-1", attempts)
    assert worker.popen.poll() is None, worker.output()
    worker.signal(signal.SIGTERM)
    worker.wait(30)
