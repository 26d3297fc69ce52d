"""A running task's durable steps, cursors and sleeps (``pgqueue_step``): read once per
run, each written by one fenced statement. Run by ``django_pgqueue.steps`` only.

A step's row is written only while the job is running, leased to the writer, at the
attempt and claim time it holds (``common.FENCE``), and the job's row is locked
``FOR SHARE`` for the rest of the writer's transaction: a rescue (which updates the
row) waits for a transactional step to commit, or the step sees the rescued row and
writes nothing.
"""

from __future__ import annotations

from .common import FENCE, OWNED_ONE

# The job, if this worker still owns it at this attempt, locked until the writer's
# transaction ends (a no-op lock for a statement run on its own).
_OWNER = (
    """owner AS (
    SELECT j.id, clock_timestamp() AS now
    FROM pgqueue_job AS j, """
    + OWNED_ONE
    + """
    WHERE """
    + FENCE
    + """
    FOR SHARE OF j
)"""
)


STEP_CLEAR = """
-- name: STEP_CLEAR
-- Forget the steps of jobs (a requeue "from the start"): they run again from the top.
DELETE FROM pgqueue_step WHERE job_id = ANY (%(ids)s::bigint[])
"""


STEP_LIST = """
-- name: STEP_LIST
-- Every step, cursor and sleep a job recorded, read once per run (the first step
-- asked for), with the database's now (a sleep compares its end with it).
SELECT kind, name, value, clock_timestamp()
FROM pgqueue_step
WHERE job_id = %(id)s
ORDER BY id
"""


STEP_RECORD = (
    """
-- name: STEP_RECORD
-- Record a step's value (a cursor's: replace it), fenced; no row back if the lease
-- was lost, or for a step recorded already.
WITH """
    + _OWNER
    + """
INSERT INTO pgqueue_step AS s (job_id, kind, name, attempt, value, size, finished_at)
SELECT owner.id, %(kind)s, %(name)s, %(attempt)s, %(value)s::jsonb, %(size)s, owner.now
FROM owner
ON CONFLICT (job_id, kind, name) DO UPDATE
SET value = excluded.value, attempt = excluded.attempt, size = excluded.size,
    finished_at = excluded.finished_at
WHERE %(replace)s::boolean
RETURNING s.id
"""
)


STEP_SLEEP = (
    """
-- name: STEP_SLEEP
-- Record a durable sleep's end (now + seconds, or the given time), fenced; the
-- seconds left until then, by the database's clock (none back if the lease was lost).
WITH """
    + _OWNER
    + """, ending AS (
    SELECT owner.id, owner.now,
           coalesce(%(until)s::timestamptz,
                    owner.now + make_interval(secs => %(seconds)s::float8)) AS until
    FROM owner
), recorded AS (
INSERT INTO pgqueue_step AS s (job_id, kind, name, attempt, value, size, finished_at)
SELECT ending.id, 'sleep', %(name)s, %(attempt)s,
       jsonb_build_object('until', ending.until), 0, ending.now
FROM ending
ON CONFLICT (job_id, kind, name) DO NOTHING
RETURNING s.id
)
SELECT greatest(extract(epoch FROM ending.until - ending.now)::float8, 0)
FROM ending, recorded
"""
)
