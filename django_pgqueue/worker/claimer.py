"""How many jobs a worker's next claim takes: the claim-sizing policy, apart from the
claim loop so that it can be read and tested on its own.

A claim cannot choose the kind of the jobs it takes (a job's task is known once it is
claimed), so with an event loop beside the thread slots any job of a claim may turn out
to be a plain one (it needs a thread) or a coroutine one (it needs a loop slot). A claim
sized by a guess of the mix hoards jobs whenever the guess is wrong: a worker that had
claimed one coroutine job alone once took 32 plain jobs for its 4 threads, and they
waited, leased, while other workers idled (issue 28). So each claim is sized for the
worst case of both kinds, whatever ran before:

* no more jobs than the thread slots have room for (were all of them plain), and no more
  than the loop has room for (were all of them coroutine jobs);
* one over, so that the other side's work is still found when a side is full: at most
  one plain job waits for a thread (only when a coroutine job was claimed lately and no
  plain job waits already), at most one coroutine job waits for a loop slot beyond its
  window (only when a plain job was claimed lately and the loop is exactly full).

A worker that claims only plain jobs claims as a worker without a loop. One whose
recent claims held coroutine jobs and no plain one claims *by kind*
(``Job.objects.claim_kinds``, one statement): of its next candidates, at most the
loop's room of the jobs of the tasks it has met running on its loop, and the threads'
room (plus one) of those of the tasks it has met running on threads; a job of a task it
has not met counts against both, and is taken only while both have room. The rest stay
pending. So a loop of 100 slots is filled 100 jobs a claim while
its 4 threads never lease more than 5 plain jobs, whatever the queue holds. Otherwise
(a mixed line, whose head is often plain jobs the threads have no room for and which a
claim by kind would pass over again and again; flow control, whose claims cannot tell
the kinds apart; tasks not met yet) a claim takes at most the smaller of the two sides'
room, its free threads plus one.

Short jobs are claimed ahead. A claim costs a round trip and a commit, during which
a thread without a claimed job waits: with jobs of a millisecond, 16 threads claiming
only their free slots spent most of their time waiting (2,300-3,500 jobs/s of 1 ms
jobs, ``bench.steady``). So a worker whose ``--batch-size`` was not given claims
``SHORT_PREFETCH`` times its concurrency per claim, with the next batch claimed while
the threads work through the current one, as long as its plain jobs run in under
``SHORT_JOB_SECONDS`` on average: a job held ahead then waits for a thread at most
about ``2 * SHORT_PREFETCH`` job times (tens of milliseconds), while another worker
could hardly have run it sooner. Above that mean (or with ``--batch-size`` given) it
claims for its free threads only, so that slow jobs are never hoarded. Nor does it
prefetch while a fair queue or a rate limit applies to its claims: fair turns are
dealt per claim, and a rate counts claims, not task starts.

The loop is fed ahead the same way: while its coroutine jobs take under
``SHORT_JOB_SECONDS`` on average (and ``--batch-size`` was not given), it holds up to
twice its ``--async-concurrency``, the second half waiting for a slot, and its side of
a claim is left for a whole half loop while jobs still wait. With 128 slots and jobs of
a millisecond, slots freed during a claim's round trip otherwise stayed empty: the loop
idled half the time (``bench.steady --async-concurrency 128``).
"""

from __future__ import annotations

#: A kind of job counts as "claimed lately" for this many claimed jobs after its last one.
LATELY = 100
#: Plain jobs this short (mean run time, seconds) are claimed ahead of the threads.
SHORT_JOB_SECONDS = 0.01
#: ... in claims of this many times the concurrency (capped at ``SHORT_BATCH_MAX``).
SHORT_PREFETCH = 4
SHORT_BATCH_MAX = 256
#: The weight of the latest job's run time in the running mean.
RUN_TIME_WEIGHT = 0.05


class ClaimSizer:
    """The claim-sizing policy of one worker: :meth:`size` before each claim,
    :meth:`claimed` after it with the kinds the claim turned out to hold."""

    def __init__(
        self,
        *,
        concurrency: int,
        batch_size: int,
        async_concurrency: int,
        prefetch_short: bool = False,
    ) -> None:
        self.concurrency = concurrency
        self.async_concurrency = async_concurrency
        #: Whether short jobs are claimed ahead (``--batch-size`` not given).
        self.prefetch_short = prefetch_short
        self._given_batch = batch_size
        self._short_batch = max(batch_size, min(SHORT_BATCH_MAX, SHORT_PREFETCH * concurrency))
        #: Running mean of the plain jobs' run time (None: none ran yet).
        self.run_time: float | None = None
        #: Running mean of the coroutine jobs' run time (None: none ran yet).
        self.loop_run_time: float | None = None
        #: False while flow control deals by claim (a fair queue, a rate limit).
        self.prefetch_allowed = True
        #: Jobs claimed since the last one of each kind (None: none of it ever).
        self._since_plain: int | None = None
        self._since_coroutine: int | None = None

    @property
    def batch_size(self) -> int:
        """Most jobs a claim takes now: ``--batch-size``, or for short jobs more."""
        return self._short_batch if self._short(self.run_time) else self._given_batch

    @property
    def ahead(self) -> int:
        """Room for the next batch claimed while the threads work through the current
        one (0: no prefetch)."""
        return self.batch_size if self.batch_size > self.concurrency else 0

    @property
    def loop_ahead(self) -> int:
        """Coroutine jobs held beyond the loop's slots, waiting for one (0: none): its
        capacity again while its jobs are short (see the module's docstring)."""
        return self.async_concurrency if self._short(self.loop_run_time) else 0

    def _short(self, run_time: float | None) -> bool:
        """Whether jobs of this mean run time are claimed ahead (see the docstring)."""
        return (
            run_time is not None
            and run_time < SHORT_JOB_SECONDS
            and self.prefetch_short
            and self.prefetch_allowed
        )

    def ran_coroutine(self, seconds: float) -> None:
        """Count one coroutine job's run time (on the loop thread), as :meth:`ran`."""
        if self.prefetch_short:
            self.loop_run_time = _mean(self.loop_run_time, seconds)

    def ran(self, seconds: float) -> None:
        """Count one plain job's run time (with ``prefetch_short``: claims are larger
        while the mean is under ``SHORT_JOB_SECONDS``). Called by every runner thread
        without a lock: an update lost to a race only delays the mean a little."""
        if self.prefetch_short:
            self.run_time = _mean(self.run_time, seconds)

    def thread_claim(self, free: int, waiting: int) -> int:
        """How many to claim for ``free`` thread slots (including a prefetch window)
        while ``waiting`` claimed plain jobs wait for a thread (0: wait). Whole batches
        while claimed jobs still wait locally: a claim costs a round trip and a commit
        whatever its size, so a few freed slots wait for more unless the runners are
        about to run dry."""
        if free <= 0:
            return 0
        if free < self.batch_size and waiting > 0:
            return 0
        return min(free, self.batch_size)

    def size(self, thread_free: int, loop_free: int, *, waiting: int) -> int:
        """How many to claim now by a claim that cannot tell the kinds apart: the
        smaller of :meth:`split`'s two."""
        threads, loop = self.split(thread_free, loop_free, waiting=waiting)
        return threads if not self.async_concurrency else max(0, min(threads, loop))

    def split(
        self, thread_free: int, loop_free: int, *, waiting: int, loop_waiting: int = 0
    ) -> tuple[int, int]:
        """The most plain jobs and the most coroutine jobs to claim now (a worker
        without a loop: its threads' claim, and 0). ``thread_free``: room of the thread
        slots' window (negative: that many plain jobs over it); ``loop_free``: room of
        the loop's slots and its window ahead (negative: that many coroutine jobs over
        it); ``waiting``: claimed plain jobs not started yet; ``loop_waiting``: claimed
        coroutine jobs waiting for a slot."""
        threads = self.thread_claim(thread_free, waiting)
        if not self.async_concurrency:
            return threads, 0
        if waiting == 0 and thread_free >= 0 and self.lately(coroutine=True):
            # One plain job may wait: the claim takes one coroutine job more, and still
            # finds coroutine jobs while every thread is busy.
            threads = min(threads, thread_free) + 1
        loop = max(0, loop_free)
        if loop_waiting > 0 and loop < self.async_concurrency // 2:
            loop = 0  # fed ahead: wait for half a loop's room while jobs still wait
        if loop_free == 0 and self.lately(coroutine=False):
            loop = 1  # one coroutine job may wait, so plain jobs are still found
        return max(0, threads), loop

    def lately(self, *, coroutine: bool) -> bool:
        """Whether a job of that kind was among the last ``LATELY`` claimed."""
        since = self._since_coroutine if coroutine else self._since_plain
        return since is not None and since < LATELY

    def claimed(self, plain: int, coroutine: int) -> None:
        """Count a claim's jobs of each kind."""
        if plain:
            self._since_plain = 0
        elif self._since_plain is not None:
            self._since_plain += coroutine
        if coroutine:
            self._since_coroutine = 0
        elif self._since_coroutine is not None:
            self._since_coroutine += plain


def _mean(mean: float | None, seconds: float) -> float:
    """The running mean of run times after one more of ``seconds``."""
    return seconds if mean is None else mean + (seconds - mean) * RUN_TIME_WEIGHT
