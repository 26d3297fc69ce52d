"""Claiming pending jobs when no flow control is in force: from the head of the claim
index, or resumed after the worker's previous claim, of all queues or some. Run by
``django_pgqueue.claim`` only.
"""

from __future__ import annotations

from .common import CLOCK, LEASE_CANDIDATES, resume_ranges

# LEASE_CANDIDATES after a claim's candidate CTE, with the clock.
_CLAIM_LEASE = ", " + CLOCK + LEASE_CANDIDATES


# A claim that takes each kind of job for its own side of the worker (the jobs of the
# tasks that run on its event loop, and the others, which need a thread): of the
# candidates, in claim order, the first loop_limit of those tasks and the first
# thread_limit of any other; the rest stay pending (unlocked at the commit). So a worker
# whose loop has room for 100 coroutine jobs and its threads for 5 plain ones claims
# 100 + 5 candidates, and never leases more plain jobs than its threads have room for
# whatever the queue holds (issue 28). The kind is read from the locked rows by
# primary key, as LEASE_CANDIDATES leases them. Each row leased comes with how many
# candidates were locked, and a claim that leased none returns one row of NULLs with it
# (the lease is a CTE, joined to the count): more candidates than jobs, some were passed
# over (the worker then reads the line from its head next, since its position is past
# them, and waits for room rather than new work); fewer than the limit, the line is
# drained for now.
_KEPT = """, kept AS (
    SELECT c.id
    FROM (
        SELECT j.id,
               j.task = ANY (%(loop_tasks)s::text[]) AS on_loop,
               row_number() OVER (PARTITION BY j.task = ANY (%(loop_tasks)s::text[])
                                  ORDER BY j.priority DESC, j.id) AS nth
        FROM pgqueue_job AS j
        WHERE j.id = ANY (ARRAY(SELECT id FROM candidate))
    ) AS c
    WHERE c.nth <= CASE WHEN c.on_loop THEN %(loop_limit)s::int ELSE %(thread_limit)s::int END
)"""
_KIND_LEASE = (
    _KEPT
    + ", "
    + CLOCK
    + ", leased AS ("
    + LEASE_CANDIDATES.replace("FROM candidate", "FROM kept")
    + """)
SELECT leased.*, s.scanned
FROM (SELECT count(*) AS scanned FROM candidate) AS s
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
    "-- of any other task (the rest passed over); each row says how many were scanned.",
)


JOB_CLAIM_KINDS = _by_kind(
    JOB_CLAIM,
    "JOB_CLAIM_KINDS",
    "JOB_CLAIM by kind: of its candidates, loop_limit of loop_tasks, thread_limit of\n"
    "-- any other task (the rest passed over); each row says how many were scanned.",
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
    "-- thread_limit of any other task; each row says how many were scanned.",
)


JOB_CLAIM_QUEUES_KINDS = _by_kind(
    JOB_CLAIM_QUEUES,
    "JOB_CLAIM_QUEUES_KINDS",
    "JOB_CLAIM_QUEUES by kind: of its candidates, loop_limit of loop_tasks,\n"
    "-- thread_limit of any other task; each row says how many were scanned.",
)
