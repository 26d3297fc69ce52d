"""The claim-sizing policy (django_pgqueue/worker/claimer.py), on its own: whatever
kinds of job were claimed before, a claim never takes more plain jobs than the free
thread slots plus one, nor more coroutine jobs than the free loop slots plus one
(issue 28: a worker that had claimed one coroutine job took 32 plain jobs for 4
threads). tests/test_worker_hoard.py checks it with real worker processes."""

from __future__ import annotations

import pytest

from django_pgqueue.worker.claimer import (
    LATELY,
    SHORT_BATCH_MAX,
    SHORT_JOB_SECONDS,
    SHORT_PREFETCH,
    ClaimSizer,
)


def sizer(concurrency: int = 4, batch_size: int | None = None, loop: int = 100) -> ClaimSizer:
    return ClaimSizer(
        concurrency=concurrency, batch_size=batch_size or concurrency, async_concurrency=loop
    )


def test_sizer__without_a_loop_claims_for_the_threads_only():
    s = sizer(loop=0)
    assert s.size(4, 0, waiting=0) == 4
    assert s.size(0, 0, waiting=0) == 0
    s.claimed(plain=0, coroutine=5)  # (cannot happen; changes nothing)
    assert s.size(0, 0, waiting=0) == 0


def test_sizer__after_one_coroutine_job_plain_jobs_are_not_hoarded():
    """The reproduction of issue 28: one coroutine job claimed alone, then only plain
    jobs: each claim is at most the free threads, plus one while none waits."""
    s = sizer()
    assert s.size(4, 100, waiting=0) == 4
    s.claimed(plain=0, coroutine=1)
    assert s.size(4, 99, waiting=0) == 5  # four threads, one may wait (old policy: 104)
    s.claimed(plain=4, coroutine=0)
    assert s.size(0, 100, waiting=0) == 1  # one may wait, so coroutine jobs are found
    s.claimed(plain=1, coroutine=0)
    assert s.size(-1, 100, waiting=1) == 0  # one waits: nothing more


def test_sizer__a_full_loop_still_finds_plain_jobs_one_at_a_time():
    s = sizer()
    s.claimed(plain=1, coroutine=0)
    s.claimed(plain=0, coroutine=10)
    assert s.size(4, 0, waiting=0) == 1  # one coroutine job may wait for a slot
    assert s.size(4, -1, waiting=0) == 0  # one does
    assert s.size(4, 3, waiting=0) == 3  # no more than the loop's room


def test_sizer__a_kind_not_claimed_lately_gets_no_extra_one():
    s = sizer()
    assert s.size(0, 100, waiting=0) == 0  # no coroutine job ever: as a thread worker
    assert s.size(4, 0, waiting=0) == 0  # no plain job ever
    s.claimed(plain=0, coroutine=1)
    s.claimed(plain=LATELY, coroutine=0)
    assert s.lately(coroutine=True) is False
    assert s.size(0, 100, waiting=0) == 0
    s.claimed(plain=0, coroutine=1)
    assert s.lately(coroutine=True) and s.lately(coroutine=False)


def test_sizer__whole_batches_while_prefetched_jobs_wait():
    s = sizer(concurrency=4, batch_size=50)
    assert s.size(100, 100, waiting=0) == 50
    assert s.size(20, 100, waiting=0) == 20  # nothing waits locally: what fits
    assert s.size(20, 100, waiting=1) == 0  # jobs still wait: a whole batch
    assert s.size(50, 10, waiting=1) == 10  # and never more than the loop's room


@pytest.mark.parametrize(
    ("concurrency", "batch_size", "loop"), [(1, 1, 100), (4, 4, 3), (2, 8, 5)]
)
def test_sizer__no_history_and_no_mix_breaks_the_bound(concurrency, batch_size, loop):
    """Exhaustively over small states and histories: a claim of the size asked for,
    whatever its mix, leaves at most one plain job over the thread window and at most
    one coroutine job over the loop's slots; and so does a claim by kind, which leases
    at most each of :meth:`ClaimSizer.split`'s numbers of its kind (whose smaller is
    the size)."""
    window = max(concurrency, batch_size)
    ahead = batch_size if batch_size > concurrency else 0
    for history in (None, "plain", "coroutine", "both"):
        s = sizer(concurrency, batch_size, loop)
        if history in ("plain", "both"):
            s.claimed(plain=1, coroutine=0)
        if history in ("coroutine", "both"):
            s.claimed(plain=0, coroutine=1)
        for plain_held in range(window + 2):
            for loop_held in range(loop + 2):
                waiting = max(0, plain_held - concurrency)
                n = s.size(window - plain_held + ahead, loop - loop_held, waiting=waiting)
                # all plain, or all coroutine: the worst case of either side
                assert plain_held + n <= max(window + ahead, plain_held) + (
                    1 if plain_held <= window + ahead else 0
                ), (history, plain_held, loop_held, n)
                assert loop_held + n <= max(loop, loop_held) + (1 if loop_held <= loop else 0)
                threads, coroutines = s.split(
                    window - plain_held + ahead, loop - loop_held, waiting=waiting
                )
                assert plain_held + threads <= max(window + ahead, plain_held) + (
                    1 if plain_held <= window + ahead else 0
                ), (history, plain_held, loop_held, threads)
                assert loop_held + coroutines <= max(loop, loop_held) + (
                    1 if loop_held <= loop else 0
                ), (history, plain_held, loop_held, coroutines)
                assert n == min(threads, coroutines)


def test_sizer__short_jobs_are_claimed_ahead_unless_a_batch_size_was_given():
    """Jobs of a few ms: claims of SHORT_PREFETCH times the concurrency, the next one
    ahead; slow jobs (the mean over SHORT_JOB_SECONDS) back to the free threads only;
    a --batch-size given is kept whatever the jobs take."""
    s = ClaimSizer(concurrency=4, batch_size=4, async_concurrency=0, prefetch_short=True)
    assert (s.batch_size, s.ahead) == (4, 0)  # nothing ran yet: no prefetch
    s.ran(0.001)
    assert (s.batch_size, s.ahead) == (SHORT_PREFETCH * 4, SHORT_PREFETCH * 4)
    assert s.size(4 + s.ahead, 0, waiting=0) == SHORT_PREFETCH * 4
    for _ in range(200):
        s.ran(1.0)
    assert s.run_time > SHORT_JOB_SECONDS
    assert (s.batch_size, s.ahead) == (4, 0)
    given = ClaimSizer(concurrency=4, batch_size=4, async_concurrency=0)
    given.ran(0.001)
    assert (given.batch_size, given.ahead) == (4, 0)
    wide = ClaimSizer(concurrency=200, batch_size=200, async_concurrency=0, prefetch_short=True)
    wide.ran(0.001)
    assert wide.batch_size == SHORT_BATCH_MAX  # never below the concurrency, capped


def test_sizer__no_short_job_prefetch_while_flow_control_deals_by_claim():
    """Fair turns and rate limits count claims: a worker under them claims for its
    free threads, however short its jobs."""
    s = ClaimSizer(concurrency=4, batch_size=4, async_concurrency=0, prefetch_short=True)
    s.ran(0.001)
    s.prefetch_allowed = False
    assert (s.batch_size, s.ahead) == (4, 0)
    s.prefetch_allowed = True
    assert s.batch_size == SHORT_PREFETCH * 4


def test_sizer__short_coroutine_jobs_are_held_ahead_for_the_loop():
    """Coroutine jobs of a few ms: the loop's window doubles (its capacity held
    waiting for a slot), and while jobs wait its side of a claim waits for half a
    loop's room; slow ones, a --batch-size given, or flow control dealing by claim:
    no window ahead."""
    s = ClaimSizer(concurrency=4, batch_size=4, async_concurrency=100, prefetch_short=True)
    assert s.loop_ahead == 0  # nothing ran yet
    s.ran_coroutine(0.001)
    assert s.loop_ahead == 100
    s.claimed(plain=0, coroutine=1)
    assert s.split(4, 30, waiting=0, loop_waiting=0)[1] == 30  # none waits: what fits
    assert s.split(4, 30, waiting=0, loop_waiting=5)[1] == 0  # some wait: half a loop
    assert s.split(4, 50, waiting=0, loop_waiting=5)[1] == 50
    s.prefetch_allowed = False
    assert s.loop_ahead == 0
    s.prefetch_allowed = True
    for _ in range(200):
        s.ran_coroutine(1.0)
    assert s.loop_run_time > SHORT_JOB_SECONDS and s.loop_ahead == 0
    given = ClaimSizer(concurrency=4, batch_size=4, async_concurrency=100)
    given.ran_coroutine(0.001)
    assert given.loop_run_time is None and given.loop_ahead == 0
