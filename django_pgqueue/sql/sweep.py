"""The sweeper's bounded maintenance passes: rescue expired leases, promote due jobs,
prune finished jobs, closed keys and rate windows, and lost workers. Run by
``django_pgqueue.sweeper`` only.
"""

from __future__ import annotations

from .common import CLOCK, ENTRY, KEEP_NEWEST, WAITING, cancelled_entry
from .resolve import RESOLVE

JOB_DELETE_EXPIRED_KEYS = (
    """
-- name: JOB_DELETE_EXPIRED_KEYS
-- Delete keys whose window closed (unique_for) or whose job started (debounce), one
-- bounded batch of pgqueue_job_key_expires_idx, SKIP LOCKED.
WITH closed AS (
    SELECT k.kind, k.queue, k.key
    FROM pgqueue_job_key AS k
    WHERE k.expires_at < coalesce(%(now)s::timestamptz, clock_timestamp())
      AND (k.kind = 'unique' OR NOT """
    + WAITING
    + """)
    ORDER BY k.expires_at
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM pgqueue_job_key AS k
USING closed
WHERE (k.kind, k.queue, k.key) = (closed.kind, closed.queue, closed.key)
"""
)


# Delete the jobs JOB_LOCK_FINISHED_BEFORE locked (%(ids)s), in its transaction, with
# their own edges. The edge check is made again here, on a snapshot taken after the
# locks: a dependant's enqueue that held its parent FOR KEY SHARE committed before the
# lock was granted, and its edge, invisible to the locking statement's older snapshot,
# is seen now; such a parent is kept (unlocked at commit) for JOB_RESOLVE_MISSED (or
# JOB_RESOLVE_STRANDED) to resolve from its row. Primary keys.
JOB_DELETE_FINISHED_LOCKED = """
-- name: JOB_DELETE_FINISHED_LOCKED
-- Delete the finished jobs JOB_LOCK_FINISHED_BEFORE locked, with their own edges, except
-- one with an unresolved edge committed before the lock (re-checked on this snapshot).
-- moves: done -> gone
-- moves: dead -> gone
-- moves: cancelled -> gone
WITH pruned AS (
    DELETE FROM pgqueue_job AS j
    WHERE j.id = ANY(%(ids)s::bigint[])
      AND j.status IN ('done', 'dead', 'cancelled')
      AND NOT EXISTS (SELECT FROM pgqueue_job_dependency AS e
                      WHERE e.parent_id = j.id AND e.state IS NULL)
    RETURNING j.id, j.parents_left
), own_edges AS (
    DELETE FROM pgqueue_job_dependency AS e
    WHERE e.job_id IN (SELECT id FROM pruned WHERE parents_left IS NOT NULL)
)
SELECT count(*) FROM pruned
"""


# Lock jobs of one final state (%(status)s: done, cancelled or dead) that finished
# before that state's retention horizon, one bounded batch, for JOB_DELETE_FINISHED_LOCKED
# in the same transaction. The state is a literal when Django binds it, so each uses its
# own partial index; SKIP LOCKED splits the work. A parent with an edge still unresolved
# is kept (pgqueue_job_dep_unresolved_idx): the sweeper's repairs resolve it from the
# parent's row, which nothing else needs; the delete checks it again under the lock.
JOB_LOCK_FINISHED_BEFORE = """
-- name: JOB_LOCK_FINISHED_BEFORE
-- Lock jobs of one final state finished before its retention horizon, one bounded
-- batch of that state's partial index, SKIP LOCKED: JOB_DELETE_FINISHED_LOCKED's.
SELECT id
FROM pgqueue_job AS j
WHERE status = %(status)s
  AND finished_at < coalesce(%(now)s::timestamptz, clock_timestamp())
                    - make_interval(secs => %(retention_seconds)s)
  AND NOT EXISTS (SELECT FROM pgqueue_job_dependency AS e
                  WHERE e.parent_id = j.id AND e.state IS NULL)
ORDER BY finished_at
LIMIT %(batch_size)s
FOR UPDATE SKIP LOCKED
"""


JOB_PROMOTE_DUE = """
-- name: JOB_PROMOTE_DUE
-- Move due scheduled jobs to pending, one bounded batch of pgqueue_job_scheduled_idx;
-- SKIP LOCKED: several sweepers and idle workers may promote at once.
-- moves: scheduled -> pending
WITH due AS (
    SELECT id
    FROM pgqueue_job
    WHERE status = 'scheduled'
      AND run_at <= coalesce(%(now)s::timestamptz, clock_timestamp())
    ORDER BY run_at
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED
)
UPDATE pgqueue_job AS j
SET status = 'pending'
FROM due
WHERE j.id = due.id
RETURNING j.queue
"""


# Take back expired leases: to pending, to dead on the last attempt, or to cancelled,
# with an error entry saying whose lease expired; a job that ends dead or cancelled
# resolves what waits on it (RESOLVE). One bounded batch of pgqueue_job_lease_idx;
# SKIP LOCKED never waits on a worker completing a row.
JOB_RESCUE_EXPIRED = (
    """
-- name: JOB_RESCUE_EXPIRED
-- Take back expired leases, one bounded batch of pgqueue_job_lease_idx, SKIP LOCKED: to
-- pending, to dead on the last attempt, or to cancelled, with an entry naming whose
-- lease expired.
-- moves: running -> pending | dead | cancelled
-- moves: waiting -> pending | scheduled | cancelled
WITH RECURSIVE """
    + CLOCK
    + """, expired AS (
    SELECT id
    FROM pgqueue_job, clock
    WHERE status = 'running'
      AND lease_expires_at < clock.now
    ORDER BY lease_expires_at
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED
), rescued AS (
UPDATE pgqueue_job AS j
SET status = CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'
                  WHEN j.attempts >= j.max_attempts THEN 'dead' ELSE 'pending' END,
    lease_owner = CASE WHEN j.attempts >= j.max_attempts
                            OR j.cancel_requested_at IS NOT NULL THEN j.lease_owner END,
    lease_expires_at = NULL,
    finished_at = CASE WHEN j.attempts >= j.max_attempts
                            OR j.cancel_requested_at IS NOT NULL THEN clock.now END,
    errors = """
    + KEEP_NEWEST.format(
        entries="j.errors || jsonb_build_array(CASE WHEN j.cancel_requested_at IS NULL THEN "
        + ENTRY.format(
            path="'django_pgqueue.exceptions.LeaseExpired'",
            traceback="'LeaseExpired: lease of worker ' || j.lease_owner"
            " || ' expired after attempt ' || j.attempts || ' of ' || j.max_attempts",
            worker_id="j.lease_owner",
            attempt="j.attempts",
        )
        + " ELSE "
        + cancelled_entry(
            "'cancellation requested while running; the lease of worker '"
            " || j.lease_owner || ' expired'"
        )
        + " END)"
    )
    + """
FROM expired, clock
WHERE j.id = expired.id
RETURNING j.id, j.status
), ended AS (
    SELECT id, status, NULL::jsonb AS result FROM rescued WHERE status IN ('dead', 'cancelled')
), """
    + RESOLVE
    + """
SELECT id, status FROM rescued
"""
)


RATE_DELETE_CLOSED = """
-- name: RATE_DELETE_CLOSED
-- Delete the rate windows with no start left in them, one bounded batch of
-- pgqueue_rate_expires_idx, SKIP LOCKED.
WITH closed AS (
    SELECT name, subject
    FROM pgqueue_rate
    WHERE expires_at < coalesce(%(now)s::timestamptz, clock_timestamp())
    ORDER BY expires_at
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM pgqueue_rate AS r
USING closed
WHERE (r.name, r.subject) = (closed.name, closed.subject)
RETURNING r.name
"""


WORKER_DELETE_LOST = """
-- name: WORKER_DELETE_LOST
-- Delete the rows of workers lost for longer than keep_seconds past their lease, one
-- bounded batch, SKIP LOCKED.
WITH lost AS (
    SELECT id
    FROM pgqueue_worker
    WHERE last_seen_at + make_interval(secs => lease_seconds + %(keep_seconds)s)
          < coalesce(%(now)s::timestamptz, clock_timestamp())
    ORDER BY last_seen_at
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM pgqueue_worker AS w
USING lost
WHERE w.id = lost.id
RETURNING w.id
"""
