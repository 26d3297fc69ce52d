"""What a running task says about its own job: snooze it, store its progress, read how its
parents ended. Run by ``django_pgqueue.lifecycle`` only.
"""

from __future__ import annotations

from .common import CLOCK, FENCE, OWNED_ONE, given_back
from .resolve import RESOLVE

JOB_GET_PARENTS = """
-- name: JOB_GET_PARENTS
-- The parents of a job in depends_on order, each with its outcome as its edge keeps it
-- and its last error if its row is still there.
SELECT e.parent_id, coalesce(e.state, p.status) AS status, e.result,
       p.errors -> -1 AS error
FROM pgqueue_job_dependency AS e
LEFT JOIN pgqueue_job AS p ON p.id = e.parent_id
WHERE e.job_id = %(id)s
ORDER BY e.position
"""


JOB_SET_PROGRESS = (
    """
-- name: JOB_SET_PROGRESS
-- Store a running job's progress, fenced; nothing else of the job changes.
UPDATE pgqueue_job AS j
SET progress = %(progress)s::jsonb
FROM """
    + OWNED_ONE
    + """
WHERE """
    + FENCE
    + """
RETURNING j.id
"""
)


JOB_SNOOZE = (
    """
-- name: JOB_SNOOZE
-- A task snoozed: back to scheduled (pending if 0 s), its attempt given back and the
-- snooze counted, fenced; cancelled instead if a cancel was asked.
-- moves: running -> scheduled | pending | cancelled
-- moves: waiting -> pending | scheduled | cancelled
WITH RECURSIVE """
    + CLOCK
    + """, snoozed AS (
UPDATE pgqueue_job AS j
SET status = CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'
                  WHEN %(seconds)s::float8 > 0 THEN 'scheduled' ELSE 'pending' END,
    snoozes = j.snoozes + 1,
    run_at = CASE WHEN j.cancel_requested_at IS NULL
                  THEN clock.now + make_interval(secs => %(seconds)s::float8)
                  ELSE j.run_at END,
    """
    + given_back("'cancellation requested while running; the task snoozed'")
    + """
FROM clock, """
    + OWNED_ONE
    + """
WHERE """
    + FENCE
    + """
RETURNING j.id, j.status
), ended AS (
    SELECT id, status, NULL::jsonb AS result FROM snoozed WHERE status = 'cancelled'
), """
    + RESOLVE
    + """
SELECT status FROM snoozed
"""
)
