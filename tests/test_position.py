"""worker/position.py: where a worker's next claim of all queues starts."""

from __future__ import annotations

from django_pgqueue.models import Job
from django_pgqueue.worker.position import ClaimPosition


def job(priority: int, id_: int) -> Job:
    return Job(id=id_, priority=priority)


def test_position__resumes_after_the_last_job_of_a_claim():
    position = ClaimPosition(rescan_seconds=60)
    assert position.start() is None  # the first claim starts at the head
    position.claimed(None, [job(5, 1), job(0, 7)])
    assert position.start() == (0, 7)  # claim order: the last is the lowest position
    position.claimed((0, 7), [job(0, 9)])  # a short claim keeps resuming
    assert position.start() == (0, 9)


def test_position__a_claim_that_found_nothing_keeps_the_position():
    position = ClaimPosition(rescan_seconds=60)
    position.claimed(None, [job(0, 1)])
    position.claimed((0, 1), [])
    assert position.start() == (0, 1)


def test_position__rescan_sends_the_next_claim_to_the_head():
    position = ClaimPosition(rescan_seconds=60)
    position.claimed(None, [job(0, 1)])
    position.rescan()
    assert position.start() is None
    position.claimed(None, [])
    assert position.start() == (0, 1)  # and the one after resumes again


def test_position__rescans_from_the_head_once_the_interval_has_passed():
    position = ClaimPosition(rescan_seconds=0)
    position.claimed(None, [job(0, 1)])
    assert position.start() is None
