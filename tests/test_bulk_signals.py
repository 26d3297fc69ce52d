"""Bulk enqueue announces every job it creates to ``task_enqueued`` receivers with its
real id, as ``enqueue()`` does for one; with no receiver nothing changes."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_pgqueue import enqueue_many
from django_pgqueue.backend import PgQueueBackend
from django_pgqueue.exceptions import InvalidJob
from django_pgqueue.models import Job
from django_pgqueue.taskapi import TaskResultStatus, task_enqueued
from testproject.demo import tasks

pytestmark = pytest.mark.django_db

ADD = "testproject.demo.tasks.add"


@pytest.fixture
def received() -> Any:
    got: list[tuple[type, Any]] = []

    def receiver(sender: type, task_result: Any, **kwargs: Any) -> None:
        got.append((sender, task_result))

    task_enqueued.connect(receiver, weak=False)
    yield got
    task_enqueued.disconnect(receiver)


def test_bulk_enqueue__sends_task_enqueued_for_every_job_with_its_id(received):
    created = Job.objects.bulk_enqueue(
        ({"task": ADD, "args": [i, 1], "queue": "bulk"} for i in range(12)), batch_size=5
    )
    assert created == 12
    jobs = {job.id: job for job in Job.objects.filter(queue="bulk")}
    assert sorted(int(r.id) for _, r in received) == sorted(jobs)
    for sender, result in received:
        job = jobs[int(result.id)]
        assert sender is PgQueueBackend
        assert result.args == job.args and result.kwargs == {}
        assert result.task is tasks.add
        assert result.status == TaskResultStatus.READY
        assert result.backend == "default"
    # In input order: ids ascend with position.
    assert [r.args[0] for _, r in received] == list(range(12))


def test_bulk_enqueue__keyed_jobs_announced_once_skipped_ones_not(received):
    Job.objects.enqueue(ADD, [0, 0], idempotency_key="k1")
    created = Job.objects.bulk_enqueue(
        [
            {"task": ADD, "args": [1, 1], "idempotency_key": "k1"},  # live already: skipped
            {"task": ADD, "args": [2, 2], "idempotency_key": "k2"},
            {"task": ADD, "args": [3, 3], "idempotency_key": "k2"},  # duplicate: skipped
            {"task": ADD, "args": [4, 4]},
        ]
    )
    assert (created, created.skipped) == (2, 2)
    announced = {int(r.id): r.args for _, r in received}
    stored = dict(Job.objects.filter(id__in=announced).values_list("id", "args"))
    assert announced == stored and sorted(stored.values()) == [[2, 2], [4, 4]]


def test_enqueue_many__announces_through_the_tasks_framework(received):
    assert (
        enqueue_many(tasks.add.using(queue_name="many"), [((i, i), None) for i in range(3)]) == 3
    )
    assert [r.task.queue_name for _, r in received] == ["default"] * 3  # the stored Task
    assert {int(r.id) for _, r in received} == set(
        Job.objects.filter(queue="many").values_list("id", flat=True)
    )


def test_bulk_enqueue__a_rejected_call_announces_nothing(received):
    with pytest.raises(InvalidJob, match="job #7"):
        Job.objects.bulk_enqueue(
            [{"task": ADD, "args": [1, 1]}] * 7 + [{"task": ADD, "priority": 1000}], batch_size=5
        )
    # The first batch was written (and announced) inside the call's transaction, which
    # rolled back: like enqueue() inside atomic(), receivers see it before the commit.
    assert Job.objects.count() == 0
    assert len(received) == 5


def test_bulk_enqueue__without_receivers_no_id_round_trip(caplog):
    caplog.set_level("INFO", logger="django.tasks")
    caplog.set_level("INFO", logger="django_tasks")
    from django_pgqueue.bulk import wants_announcements

    assert not wants_announcements()  # Django's own debug-log receiver does not count
    with CaptureQueriesContext(connection) as queries:
        Job.objects.bulk_enqueue({"task": ADD, "args": [i, 1]} for i in range(10))
    assert not [q for q in queries if "nextval" in q["sql"]]
    assert Job.objects.count() == 10
