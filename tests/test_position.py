"""worker/position.py: where a worker's next claim of all queues starts."""

from __future__ import annotations

from django_pgqueue.models import Job
from django_pgqueue.worker.position import ClaimPosition


def job(priority: int, id_: int) -> Job:
    return Job(id=id_, priority=priority)


def test_position__resumes_after_the_last_job_of_a_full_claim():
    position = ClaimPosition(rescan_seconds=60)
    assert position.start() is None  # the first claim starts at the head
    assert position.claimed(None, [job(5, 1), job(0, 7)], limit=2) is False
    assert position.start() == (0, 7)  # claim order: the last is the lowest position


def test_position__a_short_claim_sends_the_next_one_to_the_head():
    position = ClaimPosition(rescan_seconds=60)
    position.claimed(None, [job(0, 1), job(0, 2)], limit=2)
    assert position.claimed((0, 2), [job(0, 3)], limit=2) is False
    assert position.start() is None


def test_position__resuming_that_finds_nothing_asks_for_the_head_at_once():
    position = ClaimPosition(rescan_seconds=60)
    position.claimed(None, [job(0, 1)], limit=1)
    assert position.claimed((0, 1), [], limit=1) is True
    assert position.start() is None
    # Nothing from the head either: no immediate retry (the worker waits as usual).
    assert position.claimed(None, [], limit=1) is False


def test_position__rescans_from_the_head_once_the_interval_has_passed():
    position = ClaimPosition(rescan_seconds=0)
    position.claimed(None, [job(0, 1)], limit=1)
    assert position.start() is None
