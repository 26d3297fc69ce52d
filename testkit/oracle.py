"""The chaos suite's oracle: fault injection helpers, invariants sampled while the faults
run, and the end-of-run verdict, judged job by job.

It lives in ``testkit/`` because ``bench/chaos.py`` runs it and ``tests/test_chaos.py``
tests it.
The harness hands it the **identity** of every job it enqueued (id and kind: ``plain``,
``tx``, ``poison``, ``leak``), so a job deleted and another duplicated cannot cancel
out in a total. Over the jobs table and the ``demo_execution`` ledger (one row per
execution of a chaos task) it counts, each of which must be 0 unless said otherwise:

* lost: an expected job missing, or ``done`` without its effect (ledger row);
* dup_jobs: a job row nobody enqueued (a duplicated job), or effects of such a job;
* dup_tx (I3): a transactional job with more than one effect;
* stuck (I1 after the drain): an expected job neither ``done`` nor ``dead``;
* i1: a running job whose lease reaches further than one lease from now;
* i2: ``attempts > max_attempts``;
* i4: a running job without owner or lease, or a lease on a job not running;
* i5: a transactional job is ``done`` if and only if it has exactly one effect;
* dead_unexpected: a dead job that is not a poison pill or a leaking task, or a pill
  not dead after all its attempts;
* leak_undetected / leaked_rows: a task that leaks a transaction or session state
  (defect of issue 8) ended ``done`` (unless a terminated backend or a restart ended
  that session first: ``leak_session_ended``, reported), or a write made inside a
  leaked transaction was committed;
* poison_runs: executions of poison pills, at most pills x their attempts;
* dup_plain: extra runs of ordinary tasks (at-least-once): reported, not a fault.

:data:`SAMPLE` is run about every 0.5 s while the faults run (see ``bench/chaos.py``):
no job ``running`` past its lease by more than the allowed lateness, none both
finished and still leased, attempts never above the limit, and no concurrency key
with more jobs running than its limit in ``PGQUEUE_LIMITS`` (``over_limit``), and no
worker holding more jobs leased but not started than its free room allows
(``hoarded``: plain jobs beyond its threads plus one, coroutine jobs beyond its loop
slots plus one).
"""

from __future__ import annotations

import datetime as dt
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psycopg
from cronsim import CronSim

#: The run's limit (``PGQUEUE_LIMITS`` of bench/chaos_settings.py): a third of the jobs
#: have a key ``chaos:0`` .. ``chaos:<KEYS - 1>``, each a budget of KEY_CONCURRENCY.
KEY_PREFIX = "chaos:"
KEY_CONCURRENCY = 2
KEYS = 8

# Jobs per status, for progress lines and the drain check. Sequential scan; small table.
STATUS_COUNTS = """
SELECT status, count(*) FROM pgqueue_job GROUP BY status
"""

# Backends the killer may terminate: every client of the chaos database but ourselves.
CLIENT_BACKENDS = """
SELECT pid FROM pg_stat_activity
WHERE datname = current_database()
  AND backend_type = 'client backend'
  AND pid <> pg_backend_pid()
"""

# Terminate one backend, as an administrator (or a failover) would.
TERMINATE_BACKEND = """
SELECT pg_terminate_backend(%(pid)s)
"""

# Planted faults (``bench.chaos --plant``), which the oracle must catch. A job deleted:
PLANT_DELETE = """
DELETE FROM pgqueue_job WHERE id = %(id)s
"""

# A job row copied under a new id (a duplicated job: the totals do not change when
# another job is deleted).
PLANT_COPY = """
INSERT INTO pgqueue_job (task, queue, priority, args, kwargs, status, attempts,
                         max_attempts, run_at, created_at, errors, backend)
SELECT task, queue, priority, args, kwargs, status, attempts, max_attempts, run_at,
       created_at, errors, backend
FROM pgqueue_job WHERE id = %(id)s
"""

# A second effect of one transactional job.
PLANT_EFFECT = """
INSERT INTO demo_execution (job_id, attempt, kind, worker_id, created_at)
VALUES (%(id)s, 0, 'tx', 'planted', clock_timestamp())
"""

# A cancelled job put back to pending, as a cancel that was lost would leave it: a
# worker claims it again after the acknowledgement.
PLANT_UNCANCEL = """
UPDATE pgqueue_job
SET status = 'pending', cancel_requested_at = NULL, finished_at = NULL
WHERE id = %(id)s
"""

# One periodic tick enqueued twice: two finished jobs with its key, each with its effect.
PLANT_TICK = """
WITH job AS (
    INSERT INTO pgqueue_job (task, queue, priority, args, kwargs, status, attempts,
                             max_attempts, run_at, created_at, finished_at, errors,
                             backend, idempotency_key)
    SELECT 'testproject.demo.fault_tasks.ledger_plain', 'default', 0, '[]', '{}', 'done',
           1, 3, clock_timestamp(), clock_timestamp(), clock_timestamp(), '[]',
           'default', %(key)s
    FROM generate_series(1, 2)
    RETURNING id
)
INSERT INTO demo_execution (job_id, attempt, kind, worker_id, created_at)
SELECT id, 1, 'plain', 'planted', clock_timestamp() FROM job
"""

# Make one pending job look claimed by a worker whose lease runs out at once...
PLANT_RUNNING = """
UPDATE pgqueue_job AS j
SET status = 'running', lease_owner = 'planted', attempts = j.attempts + 1,
    last_attempted_at = clock_timestamp(),
    lease_expires_at = clock_timestamp() + interval '0.2 seconds'
FROM (SELECT id FROM pgqueue_job WHERE status = 'pending' AND task LIKE '%%.ledger_plain'
      ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) AS pick
WHERE j.id = pick.id
RETURNING j.id
"""

# ... and keep it locked, as a leaked transaction on a live worker would: the
# sweeper's SKIP LOCKED rescue passes it by for as long as the lock is held.
PLANT_LOCK = """
SELECT id FROM pgqueue_job WHERE id = %(id)s FOR UPDATE
"""

# Invariants that must hold at every moment, sampled while faults run: a lease the
# sweeper should have taken back long ago (``late``, more than %(lateness)s seconds past
# its expiry: a row locked by a leaked transaction, a sweeper that stopped working), a
# finished job still holding a lease, attempts above the limit, and a concurrency key
# of the run's limit (``PGQUEUE_LIMITS`` of bench/chaos_settings.py: %(key_prefix)s...,
# %(key_concurrency)s each) with more jobs running than it allows (``over_limit``: the
# most by which any key exceeds it; ``key_peak``, not a fault: the most any key ran,
# which shows the limit was reached). ``hoarded`` (issue 28): the most by which a worker
# holds more ledger jobs leased but not started (no ledger row of their attempt yet; a
# transactional job's row commits only with it) than its free room allows: plain and
# transactional ones beyond its %(threads)s threads plus one, coroutine ones
# (%(coroutine_task)s) beyond its %(loop_slots)s loop slots plus one. Sequential scan.
SAMPLE = """
SELECT
    count(*) FILTER (WHERE status = 'running'
                       AND lease_expires_at < clock_timestamp()
                                              - make_interval(secs => %(lateness)s))
        AS late_leases,
    count(*) FILTER (WHERE status <> 'running' AND lease_expires_at IS NOT NULL)
        AS finished_leased,
    count(*) FILTER (WHERE attempts > max_attempts) AS over_attempts,
    (SELECT greatest(coalesce(max(k.running), 0) - %(key_concurrency)s, 0)
     FROM (SELECT count(*) AS running
           FROM pgqueue_job
           WHERE status = 'running' AND starts_with(concurrency_key, %(key_prefix)s)
           GROUP BY concurrency_key) AS k) AS over_limit,
    (SELECT coalesce(max(greatest(h.plain - %(threads)s - 1,
                                  h.coroutine - %(loop_slots)s - 1, 0)), 0)
     FROM (SELECT j.lease_owner,
                  count(*) FILTER (WHERE j.task <> %(coroutine_task)s) AS plain,
                  count(*) FILTER (WHERE j.task = %(coroutine_task)s) AS coroutine
           FROM pgqueue_job AS j
           WHERE j.status = 'running'
             AND starts_with(j.task, 'testproject.demo.fault_tasks.ledger_')
             AND j.lease_owner <> 'planted'
             AND NOT EXISTS (SELECT 1 FROM demo_execution AS e
                             WHERE e.job_id = j.id AND e.attempt = j.attempts)
           GROUP BY j.lease_owner) AS h) AS hoarded,
    (SELECT coalesce(max(k.running), 0)
     FROM (SELECT count(*) AS running
           FROM pgqueue_job
           WHERE status = 'running' AND starts_with(concurrency_key, %(key_prefix)s)
           GROUP BY concurrency_key) AS k) AS key_peak
FROM pgqueue_job
"""

# A key of the run's limit made to look over it: %(jobs)s of its pending jobs leased to
# a worker that does not exist, whose leases run out in %(seconds)s s (the sweeper then
# takes them back, and they run): the over_limit sample must see it meanwhile.
PLANT_OVER_LIMIT = """
UPDATE pgqueue_job AS j
SET status = 'running', lease_owner = 'planted', attempts = j.attempts + 1,
    last_attempted_at = clock_timestamp(),
    lease_expires_at = clock_timestamp() + make_interval(secs => %(seconds)s)
FROM (SELECT id FROM pgqueue_job
      WHERE status = 'pending' AND concurrency_key = %(key)s
      ORDER BY id LIMIT %(jobs)s FOR UPDATE SKIP LOCKED) AS pick
WHERE j.id = pick.id
RETURNING j.id
"""

# Every end-of-run invariant in one pass: the expected jobs (by identity) fully joined
# to the jobs table, each with its ledger rows; then effects of jobs nobody enqueued.
CHECK = """
WITH expected AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(kinds)s::text[], %(acks)s::timestamptz[],
                         %(sure)s::bool[]) AS e(job_id, kind, ack, sure)
), ledger AS (
    SELECT job_id,
           count(*) FILTER (WHERE kind = 'tx') AS tx_rows,
           count(*) FILTER (WHERE kind = 'plain') AS plain_rows,
           count(*) FILTER (WHERE kind = 'poison') AS poison_rows,
           count(*) FILTER (WHERE kind = 'leaked') AS leaked_rows,
           array_agg(attempt) FILTER (WHERE backend_pid = ANY(%(ended_pids)s::int[]))
               AS ended_attempts
    FROM demo_execution
    GROUP BY job_id
), j AS (
    SELECT expected.job_id AS expected_id,
           expected.kind, expected.ack, expected.sure,
           job.id, job.status, job.attempts, job.max_attempts, job.lease_owner,
           job.lease_expires_at, job.last_attempted_at,
           coalesce(ledger.tx_rows, 0) AS tx_rows,
           coalesce(ledger.plain_rows, 0) AS plain_rows,
           coalesce(ledger.poison_rows, 0) AS poison_rows,
           coalesce(ledger.leaked_rows, 0) AS leaked_rows,
           coalesce(job.attempts = ANY(ledger.ended_attempts), false) AS session_ended
    FROM expected
    FULL JOIN pgqueue_job AS job ON job.id = expected.job_id
    LEFT JOIN ledger ON ledger.job_id = coalesce(job.id, expected.job_id)
)
SELECT
    count(expected_id) AS expected,
    count(*) FILTER (WHERE expected_id IS NOT NULL AND id IS NULL) AS missing,
    count(*) FILTER (WHERE expected_id IS NULL) AS unexpected_jobs,
    (SELECT count(*) FROM ledger
     WHERE job_id NOT IN (SELECT job_id FROM expected)) AS unexpected_effects,
    count(*) FILTER (WHERE status = 'done') AS done,
    count(*) FILTER (WHERE status = 'dead') AS dead,
    count(*) FILTER (WHERE status = 'cancelled') AS cancelled,
    count(*) FILTER (WHERE expected_id IS NOT NULL
                       AND status NOT IN ('done', 'dead', 'cancelled')) AS stuck,
    count(*) FILTER (WHERE status = 'done'
                       AND ((kind = 'tx' AND tx_rows = 0)
                            OR (kind IN ('plain', 'periodic') AND plain_rows = 0)))
        AS lost_effects,
    count(*) FILTER (WHERE kind = 'tx' AND tx_rows > 1) AS dup_tx,
    coalesce(sum(plain_rows - 1) FILTER (WHERE kind IN ('plain', 'periodic')
                                           AND plain_rows > 1), 0) AS dup_plain,
    count(*) FILTER (WHERE ack IS NOT NULL AND sure AND status <> 'cancelled')
        AS cancel_ignored,
    count(*) FILTER (WHERE ack IS NOT NULL AND last_attempted_at > ack
                       AND (sure OR status = 'cancelled')) AS run_after_cancel,
    count(*) FILTER (WHERE expected_id IS NOT NULL AND status = 'cancelled'
                       AND ack IS NULL) AS cancelled_unasked,
    count(*) FILTER (WHERE status = 'running'
                       AND lease_expires_at > clock_timestamp()
                                              + make_interval(secs => %(lease_seconds)s))
        AS i1,
    count(*) FILTER (WHERE attempts > max_attempts) AS i2,
    count(*) FILTER (WHERE (status = 'running'
                            AND (lease_owner IS NULL OR lease_expires_at IS NULL))
                        OR (status <> 'running' AND lease_expires_at IS NOT NULL)) AS i4,
    count(*) FILTER (WHERE kind = 'tx' AND (status = 'done') <> (tx_rows = 1)) AS i5,
    count(*) FILTER (WHERE status = 'dead' AND kind NOT IN ('poison', 'leak'))
        AS dead_unexpected,
    count(*) FILTER (WHERE kind = 'poison'
                       AND NOT (status = 'dead' AND attempts = max_attempts))
        AS poison_wrong,
    count(*) FILTER (WHERE kind = 'poison') AS pills,
    coalesce(sum(max_attempts) FILTER (WHERE kind = 'poison'), 0) AS pill_attempts,
    coalesce(sum(poison_rows), 0) AS poison_runs,
    count(*) FILTER (WHERE kind = 'leak' AND status = 'done' AND NOT session_ended)
        AS leak_undetected,
    count(*) FILTER (WHERE kind = 'leak' AND status = 'done' AND session_ended)
        AS leak_session_ended,
    coalesce(sum(leaked_rows), 0) AS leaked_rows
FROM j
"""

#: What ``check`` returns that must be 0 for the run to pass.
MUST_BE_ZERO = (
    "lost",
    "dup_jobs",
    "stuck",
    "dup_tx",
    "i1",
    "i2",
    "i4",
    "i5",
    "dead_unexpected",
    "leak_undetected",
    "leaked_rows",
    "poison_overrun",
    "cancel_ignored",
    "run_after_cancel",
    "cancelled_unasked",
)


@dataclass(frozen=True)
class Cancel:
    """One job the harness cancelled: ``ack`` is the database's clock when
    ``Job.objects.cancel()`` returned. ``sure``: that call said the job was cancelled or
    its cancellation requested. Not sure: an earlier call for it failed midway, so it
    may have been cancelled (by then) or may have finished before; it may then end
    either way, but no attempt may start after ``ack``."""

    ack: dt.datetime
    sure: bool = True


def check(
    url: str,
    *,
    expected: dict[int, str],
    lease_seconds: float,
    cancels: dict[int, Cancel] | None = None,
    ended_pids: Iterable[int] = (),
) -> dict[str, int]:
    """Judge the final state against ``expected`` (job id -> kind, every job the
    harness enqueued) and ``cancels`` (the jobs it cancelled). ``lost``: expected jobs
    missing or done without an effect; ``dup_jobs``: jobs, or effects, of ids nobody
    enqueued; ``poison_overrun``: more poison executions than pills x attempts;
    ``cancel_ignored``: a job whose cancellation was acknowledged that did not end
    ``cancelled``; ``run_after_cancel``: one claimed again (``last_attempted_at``, the
    claim's database clock) after the acknowledgement; ``cancelled_unasked``: a job
    ``cancelled`` that nobody cancelled. ``ended_pids``: backends the harness
    terminated or restarted away; a leaking task whose attempt ran on one of them and
    ended ``done`` is ``leak_session_ended`` (the fault ended its session before the
    worker could look: nothing was left to reach a later job), not ``leak_undetected``."""
    cancels = cancels or {}
    ids = list(expected)
    params = {
        "ids": ids,
        "kinds": [expected[i] for i in ids],
        "acks": [cancels[i].ack if i in cancels else None for i in ids],
        "sure": [cancels[i].sure if i in cancels else None for i in ids],
        "lease_seconds": lease_seconds,
        "ended_pids": sorted(set(ended_pids)),
    }
    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(CHECK, params)
        names = [column.name for column in cursor.description or []]
        row = dict(zip(names, cursor.fetchone() or (), strict=True))
    result = {name: int(value or 0) for name, value in row.items()}
    result["lost"] = result["missing"] + result["lost_effects"]
    result["dup_jobs"] = result["unexpected_jobs"] + result["unexpected_effects"]
    result["dead_unexpected"] += result["poison_wrong"]
    result["poison_overrun"] = max(0, result["poison_runs"] - result["pill_attempts"])
    return result


class Sampler:
    """Runs :data:`SAMPLE` on the harness's monitor connection and keeps the worst
    count seen for each invariant (a sample that cannot run, e.g. during a restart,
    is skipped and counted)."""

    NAMES = ("late_leases", "finished_leased", "over_attempts", "over_limit", "hoarded")

    def __init__(self, lateness: float, *, threads: int = 4, loop_slots: int = 100) -> None:
        self.lateness = lateness
        #: Each worker's ``--concurrency`` and ``--async-concurrency`` (``hoarded``).
        self.threads = threads
        self.loop_slots = loop_slots
        self.worst = dict.fromkeys(self.NAMES, 0)
        #: The most jobs any key of the run's limit was seen running (it should reach
        #: the limit, or the limit was never put to the test).
        self.key_peak = 0
        self.samples = 0
        self.skipped = 0

    def sample(self, rows: list[tuple[Any, ...]] | None) -> None:
        """Record one sample (the rows of SAMPLE, or None when it could not run)."""
        if not rows:
            self.skipped += 1
            return
        self.samples += 1
        for name, value in zip(self.NAMES, rows[0][: len(self.NAMES)], strict=True):
            self.worst[name] = max(self.worst[name], int(value or 0))
        self.key_peak = max(self.key_peak, int(rows[0][len(self.NAMES)] or 0))


# The jobs of periodic entries, by idempotency key (``periodic:<name>:<tick>``), with how
# many rows carry each key: more than one is a tick enqueued twice. Sequential scan.
PERIODIC_KEYS = """
SELECT idempotency_key, count(*), array_agg(id ORDER BY id)
FROM pgqueue_job
WHERE idempotency_key LIKE 'periodic:%%'
GROUP BY idempotency_key
"""

# The database's clock, for the times the harness records (cancel acknowledgements, a
# sweeper's start and death).
CLOCK = """
SELECT clock_timestamp()
"""


def judge_periodic(
    keys: Iterable[tuple[str, int]],
    *,
    crons: dict[str, str],
    alive: list[tuple[dt.datetime, dt.datetime]],
    cover: float,
) -> dict[str, int]:
    """Judge the periodic jobs (``keys``: idempotency key, rows with it) of the entries
    ``crons`` (name -> 5-field cron, UTC). ``dup_ticks``: rows beyond the first of a
    key; ``tick_holes``: ticks of an entry without a job although a sweeper was alive
    from the tick to ``cover`` seconds after it (``alive``: each sweeper's interval, in
    the database's clock); ``stray_ticks``: a key of no known entry or no tick of its
    cron. ``periodic_ticks``: distinct ticks enqueued."""
    seen: dict[str, set[dt.datetime]] = {name: set() for name in crons}
    dup = stray = 0
    for key, rows in keys:
        dup += max(0, int(rows) - 1)
        _, name, tick_text = key.split(":", 2)
        tick = dt.datetime.fromisoformat(tick_text)
        if name not in crons or tick.second or tick.microsecond:
            stray += 1
            continue
        seen[name].add(tick)
    span = cover_windows(alive, cover)
    holes = 0
    for name, cron in crons.items():
        for begin, end in span:
            for tick in CronSim(cron, begin - dt.timedelta(microseconds=1)):
                if tick > end:
                    break
                holes += tick not in seen[name]
    return {
        "periodic_ticks": sum(len(ticks) for ticks in seen.values()),
        "dup_ticks": dup,
        "tick_holes": holes,
        "stray_ticks": stray,
    }


def cover_windows(
    alive: list[tuple[dt.datetime, dt.datetime]], cover: float
) -> list[tuple[dt.datetime, dt.datetime]]:
    """The instants ``t`` at which some sweeper was alive from ``t`` to ``t + cover``:
    the union of the intervals, each shortened at its end by ``cover``."""
    shortened = sorted(
        (begin, end - dt.timedelta(seconds=cover))
        for begin, end in alive
        if end - begin >= dt.timedelta(seconds=cover)
    )
    merged: list[tuple[dt.datetime, dt.datetime]] = []
    for begin, end in shortened:
        if merged and begin <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((begin, end))
    return merged


#: A worker's log line for a job it recorded done (``Reporter.done``).
DONE_LINE = re.compile(r"\bjob (\d+) \S+ done in ")
#: A worker's last line (``Worker.run``), with its counters.
EXIT_LINE = re.compile(r"\bworker \S+ stopped: done=(\d+) ")


def judge_logs(logs: dict[str, str], cancelled: set[int]) -> dict[str, int]:
    """Judge the workers' logs (name -> text) against the jobs that ended
    ``cancelled``. ``cancelled_as_done``: a cancelled job some worker logged (so
    counted) as done. ``counter_mismatch``: a single-process worker (one exit line in
    its log) whose ``done=`` counter differs from the done lines it logged, as when a
    cancelled job is counted done but logged cancelled."""
    done_logged: Counter[int] = Counter()
    mismatch = 0
    for text in logs.values():
        ids = [int(m) for m in DONE_LINE.findall(text)]
        done_logged.update(ids)
        exits = EXIT_LINE.findall(text)
        if len(exits) == 1 and "worker process" not in text and int(exits[0]) != len(ids):
            mismatch += 1
    return {
        "cancelled_as_done": sum(1 for job_id in cancelled if done_logged[job_id]),
        "counter_mismatch": mismatch,
    }
