"""Claiming pending jobs when no flow control is in force: from the head of the claim
index, or resumed after the worker's previous claim, of all queues or some. Run by
``django_pgqueue.claim`` only.
"""

from __future__ import annotations

from .common import CLOCK, LEASE_CANDIDATES, resume_ranges

# LEASE_CANDIDATES after a claim's candidate CTE, with the clock.
_CLAIM_LEASE = ", " + CLOCK + LEASE_CANDIDATES


# A claim that takes each kind of job for its own side of the worker (jobs of the tasks
# that run on its event loop, and jobs of the tasks that need a thread): of the
# candidates, in claim order, only as many jobs of the loop's tasks as loop_limit and of
# the threads' tasks as thread_limit; the rest stay pending (unlocked at the commit). A
# task the worker has not met yet (in neither list) may turn out to be either, so its
# jobs count against both limits and are kept only while both have room. So a worker
# whose loop has room for 100 coroutine jobs and its threads for 5 plain ones locks up to
# 105 candidates, and never leases more jobs of either kind than that side has room for,
# whatever the queue holds (issue 28). The kind is read from the locked rows by primary
# key, as LEASE_CANDIDATES leases them. The lease is a CTE joined to one row about the
# candidates, so a claim that leased nothing still returns it (with NULLs for the job):
# how many were scanned (fewer than the limit: the line is drained for now) and whether
# one passed over comes before a job leased in claim order (then it is behind the
# worker's position, which must read the line from its head next).
_KEPT = """, ranked AS (
    SELECT j.id,
           j.task = ANY (%(loop_tasks)s::text[]) AS on_loop,
           j.task = ANY (%(thread_tasks)s::text[]) AS on_thread,
           row_number() OVER claim_order AS nth,
           count(*) FILTER (WHERE NOT j.task = ANY (%(thread_tasks)s::text[]))
               OVER claim_order AS nth_loop,
           count(*) FILTER (WHERE NOT j.task = ANY (%(loop_tasks)s::text[]))
               OVER claim_order AS nth_thread
    FROM pgqueue_job AS j
    WHERE j.id = ANY (ARRAY(SELECT id FROM candidate))
    WINDOW claim_order AS (ORDER BY j.priority DESC, j.id)
), judged AS (
    SELECT id, nth,
           CASE WHEN on_loop THEN nth_loop <= %(loop_limit)s::int
                WHEN on_thread THEN nth_thread <= %(thread_limit)s::int
                ELSE nth_loop <= %(loop_limit)s::int AND nth_thread <= %(thread_limit)s::int
           END AS kept
    FROM ranked
), kept AS (
    SELECT id FROM judged WHERE kept
)"""
_KIND_LEASE = (
    _KEPT
    + ", "
    + CLOCK
    + ", leased AS ("
    + LEASE_CANDIDATES.replace("FROM candidate", "FROM kept")
    + """)
SELECT leased.*, s.scanned, s.passed_behind
FROM (SELECT count(*) AS scanned,
             coalesce(min(nth) FILTER (WHERE NOT kept) < max(nth) FILTER (WHERE kept),
                      false) AS passed_behind
      FROM judged) AS s
LEFT JOIN leased ON true"""
)


def _by_kind(statement: str, name: str, why: str) -> str:
    """``statement`` (a claim of one limit) as a claim by kind named ``name``, whose
    header says ``why`` (the same candidates, leased by kind)."""
    body = statement[statement.index("-- moves: pending -> running\n") :]
    body = body[: body.index(_CLAIM_LEASE)].removeprefix("-- moves: pending -> running\n")
    return (
        f"""
-- name: {name}
-- {why}
-- moves: pending -> running
"""
        + body
        + _KIND_LEASE
    )


# One range of a resumed claim of all queues (pgqueue_job_claim_idx).
_RESUME_RANGE = """{name} AS (
    SELECT id
    FROM pgqueue_job
    WHERE status = 'pending' AND {range}
    ORDER BY priority DESC, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)"""


# One range of a resumed claim of some queues, walked for each queue's position
# (pgqueue_job_queue_claim_idx, from that queue's own start in it).
_RESUME_QUEUE_RANGE = """{name} AS (
    SELECT c.id, c.priority
    FROM queue_position AS q
    CROSS JOIN LATERAL (
        SELECT id, priority
        FROM pgqueue_job
        WHERE status = 'pending' AND queue = q.name AND {range}
        ORDER BY priority DESC, id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS c
)"""


JOB_CLAIM = (
    """
-- name: JOB_CLAIM
-- Lease up to limit pending jobs, highest priority first, from the head of
-- pgqueue_job_claim_idx (WHERE and ORDER BY match it exactly); SKIP LOCKED, one
-- statement.
-- moves: pending -> running
WITH candidate AS (
    SELECT id
    FROM pgqueue_job
    WHERE status = 'pending'
    ORDER BY priority DESC, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)"""
    + _CLAIM_LEASE
)


JOB_CLAIM_AFTER = (
    """
-- name: JOB_CLAIM_AFTER
-- JOB_CLAIM resumed after the worker's previous claim, in three ranges of
-- pgqueue_job_claim_idx, so it never walks the dead entries of jobs claimed while xmin
-- is pinned.
-- moves: pending -> running
WITH """
    + resume_ranges(_RESUME_RANGE, "%(after_priority)s", "%(after_id)s")
    + """, candidate AS (
    SELECT id
    FROM (SELECT id FROM above UNION ALL SELECT id FROM level
          UNION ALL SELECT id FROM below) AS branches
    LIMIT %(limit)s
)"""
    + _CLAIM_LEASE
)


JOB_CLAIM_AFTER_KINDS = _by_kind(
    JOB_CLAIM_AFTER,
    "JOB_CLAIM_AFTER_KINDS",
    "JOB_CLAIM_AFTER by kind: of its candidates, loop_limit of loop_tasks, thread_limit\n"
    "-- of thread_tasks (unknown ones count against both); the rest passed over.",
)


JOB_CLAIM_KINDS = _by_kind(
    JOB_CLAIM,
    "JOB_CLAIM_KINDS",
    "JOB_CLAIM by kind: of its candidates, loop_limit of loop_tasks, thread_limit of\n"
    "-- thread_tasks (unknown ones count against both); the rest passed over.",
)


JOB_CLAIM_QUEUES = (
    """
-- name: JOB_CLAIM_QUEUES
-- JOB_CLAIM for a worker of some queues: the head of each queue's range of
-- pgqueue_job_queue_claim_idx, so a small queue behind a huge one is reached at once.
-- moves: pending -> running
WITH candidate AS (
    SELECT c.id
    FROM unnest(%(queues)s::text[]) AS q(name)
    CROSS JOIN LATERAL (
        SELECT id, priority
        FROM pgqueue_job
        WHERE status = 'pending' AND queue = q.name
        ORDER BY priority DESC, id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS c
    ORDER BY c.priority DESC, c.id
    LIMIT %(limit)s
)"""
    + _CLAIM_LEASE
)


# JOB_CLAIM_QUEUES resumed after the worker's previous claim, per queue: the three
# RESUME_RANGES of each queue's part of pgqueue_job_queue_claim_idx (as
# JOB_CLAIM_AFTER), so the claim never walks the dead entries of jobs claimed while xmin
# is pinned. A queue with no position yet starts above every priority and id
# (manager.QUEUE_HEAD), where its third range is its whole line from the head.
JOB_CLAIM_QUEUES_AFTER = (
    """
-- name: JOB_CLAIM_QUEUES_AFTER
-- JOB_CLAIM_QUEUES resumed after the worker's previous claim, per queue, in three
-- ranges of each queue's part of pgqueue_job_queue_claim_idx.
-- moves: pending -> running
WITH queue_position AS (
    SELECT *
    FROM unnest(%(queues)s::text[], %(after_priorities)s::int[], %(after_ids)s::bigint[])
         AS q(name, after_priority, after_id)
), """
    + resume_ranges(_RESUME_QUEUE_RANGE, "q.after_priority", "q.after_id")
    + """, candidate AS (
    SELECT id
    FROM (SELECT id, priority FROM above UNION ALL SELECT id, priority FROM level
          UNION ALL SELECT id, priority FROM below) AS branches
    ORDER BY priority DESC, id
    LIMIT %(limit)s
)"""
    + _CLAIM_LEASE
)


JOB_CLAIM_QUEUES_AFTER_KINDS = _by_kind(
    JOB_CLAIM_QUEUES_AFTER,
    "JOB_CLAIM_QUEUES_AFTER_KINDS",
    "JOB_CLAIM_QUEUES_AFTER by kind: of its candidates, loop_limit of loop_tasks,\n"
    "-- thread_limit of thread_tasks (unknown ones against both); the rest passed over.",
)


JOB_CLAIM_QUEUES_KINDS = _by_kind(
    JOB_CLAIM_QUEUES,
    "JOB_CLAIM_QUEUES_KINDS",
    "JOB_CLAIM_QUEUES by kind: of its candidates, loop_limit of loop_tasks,\n"
    "-- thread_limit of thread_tasks (unknown ones against both); the rest passed over.",
)
