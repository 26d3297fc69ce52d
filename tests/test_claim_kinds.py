"""The claim by kind (``Job.objects.claim_kinds``, ``sql.JOB_CLAIM*_KINDS``): a worker
with an event loop leases, of its next candidates, at most the loop's room of its
coroutine tasks' jobs and the threads' room of any other, so a loop of 100 slots fills
in one claim while plain jobs are never leased beyond the threads (issue 28's bound,
``worker/claimer.py``). The candidates it passes over stay pending and unlocked."""

from __future__ import annotations

import pytest

from django_pgqueue.models import Job
from tests import tasks

pytestmark = pytest.mark.django_db(transaction=True)

LOOP = [tasks.async_echo.module_path]
THREAD = [tasks.echo.module_path]


def mixed(job_factory, kinds: str, **options) -> list[Job]:
    """Jobs in claim order, ``p`` plain (echo) and ``c`` coroutine (async_echo)."""
    return [
        job_factory(
            task=(tasks.echo if kind == "p" else tasks.async_echo).module_path,
            args=[i],
            **options,
        )
        for i, kind in enumerate(kinds)
    ]


def status(jobs: list[Job]) -> str:
    by_id = dict(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("pk", "status"))
    return "".join("R" if by_id[j.pk] == "running" else "." for j in jobs)


def test_claim_kinds__each_side_takes_its_own_kind_in_claim_order(job_factory):
    jobs = mixed(job_factory, "pcpccp")
    claimed, scanned, behind = Job.objects.claim_kinds(
        "w", loop_tasks=LOOP, thread_tasks=THREAD, loop_limit=2, thread_limit=1
    )
    # Candidates p c p: the first plain one and the coroutine one; the second plain
    # one is passed over (scanned 3, leased 2), pending and free for anyone.
    assert [j.pk for j in claimed] == [jobs[0].pk, jobs[1].pk]
    assert scanned == 3
    assert not behind  # (passed over after the last job leased)
    assert status(jobs) == "RR...."
    assert all(j.lease_owner == "w" and j.attempts == 1 for j in claimed)
    assert [j.pk for j in Job.objects.claim("other", limit=1)] == [jobs[2].pk]
    # Only coroutine jobs now: candidates c c p (the limit 5 reads the line to its end).
    claimed, scanned, behind = Job.objects.claim_kinds(
        "w", loop_tasks=LOOP, thread_tasks=THREAD, loop_limit=5, thread_limit=0
    )
    assert [j.pk for j in claimed] == [jobs[3].pk, jobs[4].pk]
    assert scanned == 3  # fewer than the limit: the line is drained
    assert not behind
    assert status(jobs) == "RRRRR."


def test_claim_kinds__a_job_passed_over_before_one_leased_is_said_to_be_behind(job_factory):
    """Candidates p p c with room for one plain job: the second plain one is passed
    over before the coroutine job leased after it (a position after that job would
    skip it); a task met on neither side counts against both rooms."""
    jobs = mixed(job_factory, "ppc")
    claimed, scanned, behind = Job.objects.claim_kinds(
        "w", loop_tasks=LOOP, thread_tasks=THREAD, loop_limit=2, thread_limit=1
    )
    assert [j.pk for j in claimed] == [jobs[0].pk, jobs[2].pk]
    assert (scanned, behind) == (3, True)
    unknown = [job_factory(task=tasks.async_other_nap.module_path, args=[0]) for _ in range(3)]
    claimed, scanned, behind = Job.objects.claim_kinds(
        "w", loop_tasks=LOOP, thread_tasks=THREAD, loop_limit=3, thread_limit=2
    )
    # jobs[1] (plain) is leased; of the unknown ones, only while both sides have room:
    # the second one would be a third job the threads might have to run.
    assert [j.pk for j in claimed] == [jobs[1].pk, unknown[0].pk]
    assert (scanned, behind) == (4, False)


def test_claim_kinds__plain_jobs_never_beyond_the_threads_room(job_factory):
    """Issue 28's bound in one statement: a loop with room for 50 and threads for 2,
    on a line of 40 plain jobs, leases 2 of them."""
    jobs = mixed(job_factory, "p" * 40)
    claimed, scanned, behind = Job.objects.claim_kinds(
        "w", loop_tasks=LOOP, thread_tasks=THREAD, loop_limit=50, thread_limit=2
    )
    assert [j.pk for j in claimed] == [jobs[0].pk, jobs[1].pk]
    assert scanned == 40
    assert Job.objects.filter(status="running").count() == 2


def test_claim_kinds__none_leased_still_says_how_many_were_scanned(job_factory):
    """A claim by kind whose candidates are all of the full side leases nothing, yet
    says it scanned them (the worker then waits for room, not for new work); an empty
    line scans none."""
    jobs = mixed(job_factory, "ppp")
    assert Job.objects.claim_kinds(
        "w", loop_tasks=LOOP, thread_tasks=THREAD, loop_limit=2, thread_limit=0
    ) == (
        [],
        2,
        False,
    )
    assert status(jobs) == "..."
    Job.objects.all().delete()
    assert Job.objects.claim_kinds(
        "w", loop_tasks=LOOP, thread_tasks=THREAD, loop_limit=2, thread_limit=1
    ) == (
        [],
        0,
        False,
    )


def test_claim_kinds__resumed_and_by_queue(job_factory):
    """The other three statements: resumed after a position, of some queues (each from
    its own position), and of some queues from their heads."""
    jobs = mixed(job_factory, "cpcc")
    after = (jobs[0].priority, jobs[0].id)
    claimed, scanned, behind = Job.objects.claim_kinds(
        "w", loop_tasks=LOOP, thread_tasks=THREAD, loop_limit=1, thread_limit=1, after=after
    )
    assert [j.pk for j in claimed] == [jobs[1].pk, jobs[2].pk]  # (from after the first)
    assert scanned == 2
    other = mixed(job_factory, "ccp", queue="q2")
    claimed, scanned, behind = Job.objects.claim_kinds(
        "w", loop_tasks=LOOP, thread_tasks=THREAD, loop_limit=1, thread_limit=0, queues=["q2"]
    )
    assert [j.pk for j in claimed] == [other[0].pk] and scanned == 1
    claimed, scanned, behind = Job.objects.claim_kinds(
        "w",
        loop_tasks=LOOP,
        thread_tasks=THREAD,
        loop_limit=4,
        thread_limit=0,
        queues=["q2", "default"],
        after={"q2": (other[0].priority, other[0].id)},
    )
    assert {j.pk for j in claimed} == {other[1].pk, jobs[0].pk, jobs[3].pk}
    assert scanned == 4  # q2's c p, default's c c: the plain one passed over
    assert not behind  # (the last in claim order)


@pytest.mark.parametrize(
    ("loop_limit", "thread_limit", "named"),
    [(-1, 1, "loop_limit"), (1, 1.5, "thread_limit"), (True, 0, "loop_limit"), (0, 0, "limit")],
)
def test_claim_kinds__bad_limits_are_named(job_factory, loop_limit, thread_limit, named):
    job = job_factory(task=tasks.async_echo.module_path)
    with pytest.raises(ValueError, match=f"claim {named} must be an int >= "):
        Job.objects.claim_kinds(
            "w",
            loop_tasks=LOOP,
            thread_tasks=THREAD,
            loop_limit=loop_limit,
            thread_limit=thread_limit,
        )
    assert Job.objects.get(pk=job.pk).status == "pending"
