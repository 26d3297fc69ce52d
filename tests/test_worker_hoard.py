"""Issue 28, item 1, with real worker processes: a worker that ran one coroutine job
must not then hoard plain jobs. Its claims were sized by a share of coroutine jobs that
the first claim set outright, so after one coroutine job a worker of ``--concurrency
4`` leased 32 plain jobs, which waited while the other workers idled. Now plain jobs
are leased only for free threads, plus at most one waiting (claimer.py)."""

from __future__ import annotations

import time

import pytest
from django.db import connection, transaction

from django_pgqueue.models import Job
from tests.conftest import wait_for
from tests.tasks import async_nap, marked_sleep

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

CONCURRENCY = 4
WORKER = ("pgqueue_worker", "--poll-interval", "0.2", "--concurrency", str(CONCURRENCY))

#: Per worker, in the database's time: plain jobs it holds leased whose task has not
#: returned (no ``end`` row; those that have wait only for their batched completion),
#: and those of them whose task has not started yet (no ``start`` row).
SAMPLE = """
SELECT clock_timestamp(), j.lease_owner,
       count(*) FILTER (WHERE NOT EXISTS (
           SELECT 1 FROM demo_execution AS e WHERE e.job_id = j.id AND e.kind = 'end')),
       count(*) FILTER (WHERE NOT EXISTS (
           SELECT 1 FROM demo_execution AS e WHERE e.job_id = j.id AND e.kind = 'start'))
FROM pgqueue_job AS j
WHERE j.status = 'running' AND j.task = %s
GROUP BY j.lease_owner
"""


def sample() -> list[tuple[object, str, int, int]]:
    """(database time, worker, leased and not returned, not started) per worker."""
    with connection.cursor() as cursor:
        cursor.execute(SAMPLE, [marked_sleep.module_path])
        return [tuple(row) for row in cursor.fetchall()]


def test_hoard__after_a_coroutine_job_plain_jobs_are_leased_only_for_free_threads(
    job_factory, manage
):
    """The issue's reproduction: two workers of queue ``hoard`` and one of every
    queue, ``--concurrency 4`` each; one coroutine job on ``hoard``, then 40 plain
    jobs at once. Sampled until the last ends, no worker ever holds more plain jobs
    than its threads plus one (leased but not started <= free threads + 1)."""
    workers = [
        manage(*WORKER, "--queue", "hoard", "--worker-id", "hoard-1"),
        manage(*WORKER, "--queue", "hoard", "--worker-id", "hoard-2"),
        manage(*WORKER, "--worker-id", "all-1"),
    ]
    with connection.cursor() as cursor:
        wait_for(
            lambda: cursor.execute("SELECT count(*) FROM pgqueue_worker").fetchone()[0] == 3,
            timeout=30,
        )
    first = job_factory(task=async_nap, args=[0.05], queue="hoard")
    wait_for(lambda: Job.objects.get(pk=first.pk).status == "done", timeout=30)
    with transaction.atomic():  # all 40 at once, as a burst
        jobs = [job_factory(task=marked_sleep, args=[0.4], queue="hoard") for _ in range(40)]
    samples = []
    deadline = time.monotonic() + 60
    while Job.objects.filter(pk__in=[j.pk for j in jobs]).exclude(status="done").exists():
        assert time.monotonic() < deadline, "the 40 jobs did not drain in 60 s"
        samples.extend(sample())
        time.sleep(0.02)
    for process in workers:
        assert process.popen.poll() is None, process.output()
    assert samples, "no job was ever seen running"
    over = [
        (at, owner, leased, waiting)
        for at, owner, leased, waiting in samples
        # waiting beyond the free threads: waiting - (CONCURRENCY - started)
        if waiting - (CONCURRENCY - (leased - waiting)) > 1
    ]
    worst = max(samples, key=lambda row: row[2])
    assert not over, (
        f"{len(over)} of {len(samples)} samples over the bound; the first "
        f"{over[0]}, the worst {worst} (at, worker, leased, not started)"
    )
    # (the async job's worker, which hoarded before, ran its share)
    owners = set(
        Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("lease_owner", flat=True)
    )
    assert len(owners) == 3, owners
