"""An operator's writes: cancel, requeue and discard dead letters, and the notification
that tells workers of a cancel. Run by ``django_pgqueue.operate`` only.
"""

from __future__ import annotations

from .common import CLOCK, cancelled_entry
from .resolve import RESOLVE

# Cancel jobs by id: waiting, pending and scheduled ones end 'cancelled' now, and what
# waits on them with them (RESOLVE); running ones get cancel_requested_at, which makes
# whatever write ends them end them 'cancelled'. Rows are locked in id order with SKIP
# LOCKED; a locked one comes back 'busy', to retry.
JOB_CANCEL = (
    """
-- name: JOB_CANCEL
-- Cancel jobs by id: waiting, pending and scheduled ones end cancelled now (and what
-- waits on them), running ones are marked to end cancelled. Locked in id order, SKIP
-- LOCKED: a locked one comes back busy.
-- moves: pending -> cancelled
-- moves: scheduled -> cancelled
-- moves: waiting -> cancelled | pending | scheduled
WITH RECURSIVE """
    + CLOCK
    + """, target AS (
    SELECT id
    FROM pgqueue_job
    WHERE id = ANY(%(ids)s::bigint[])
      AND status IN ('pending', 'scheduled', 'running', 'waiting')
    ORDER BY id
    FOR UPDATE SKIP LOCKED
), changed AS (
    UPDATE pgqueue_job AS j
    SET status = CASE WHEN j.status = 'running' THEN 'running' ELSE 'cancelled' END,
        cancel_requested_at = coalesce(j.cancel_requested_at, clock.now),
        finished_at = CASE WHEN j.status = 'running' THEN j.finished_at ELSE clock.now END,
        errors = CASE WHEN j.status = 'running' THEN j.errors
                      ELSE j.errors || jsonb_build_array("""
    + cancelled_entry("'cancelled before it ran (' || j.status || ')'", worker_id="''")
    + """) END
    FROM target, clock
    WHERE j.id = target.id
      AND j.status IN ('pending', 'scheduled', 'running', 'waiting')
    RETURNING j.id, j.status, j.result
), ended AS (
    SELECT id, status, result FROM changed WHERE status = 'cancelled'
), """
    + RESOLVE
    + """
SELECT id, status FROM changed
UNION ALL
SELECT id, 'busy'
FROM pgqueue_job
WHERE id = ANY(%(ids)s::bigint[])
  AND status IN ('pending', 'scheduled', 'running', 'waiting')
  AND id NOT IN (SELECT id FROM target)
"""
)


# Discard dead letters by id (admin), guarded by status = 'dead' and locked in id order
# like JOB_REQUEUE_DEAD, so overlapping discards and requeues wait, never deadlock. Their
# own edges go with them; an edge out of one still unresolved (a dependant enqueued as
# it died) is resolved first (RESOLVE), so nothing waits on a job that is gone.
JOB_DELETE_DEAD = (
    """
-- name: JOB_DELETE_DEAD
-- Discard dead letters by id, locked in id order like JOB_REQUEUE_DEAD; their edges go
-- with them, and what waits on them is resolved first (RESOLVE).
-- moves: dead -> gone
-- moves: waiting -> pending | scheduled | cancelled
WITH RECURSIVE """
    + CLOCK
    + """, locked AS (
    SELECT id
    FROM pgqueue_job
    WHERE id = ANY(%(ids)s::bigint[])
      AND status = 'dead'
    ORDER BY id
    FOR UPDATE
), ended AS (
    DELETE FROM pgqueue_job AS j
    USING locked
    WHERE j.id = locked.id
      AND j.status = 'dead'
    RETURNING j.id, j.status, j.result, j.parents_left
), own_edges AS (
    DELETE FROM pgqueue_job_dependency AS e
    WHERE e.job_id IN (SELECT id FROM ended WHERE parents_left IS NOT NULL)
), """
    + RESOLVE
    + """
SELECT id FROM ended
"""
)


# Delete finished jobs by id (the admin's "delete finished"): done, cancelled and dead
# ones, locked in id order like JOB_DELETE_DEAD, with their own edges. As the
# sweeper's pruning (JOB_DELETE_FINISHED_BEFORE), a parent with an edge the sweeper has
# yet to resolve is kept: a dependant still needs its row.
JOB_DELETE_FINISHED = """
-- name: JOB_DELETE_FINISHED
-- Delete finished jobs by id, locked in id order, with their own edges; a parent whose
-- edge the sweeper has yet to resolve is kept, as pruning keeps it.
-- moves: done -> gone
-- moves: dead -> gone
-- moves: cancelled -> gone
WITH locked AS (
    SELECT id
    FROM pgqueue_job AS j
    WHERE id = ANY(%(ids)s::bigint[])
      AND status IN ('done', 'dead', 'cancelled')
      AND NOT EXISTS (SELECT FROM pgqueue_job_dependency AS e
                      WHERE e.parent_id = j.id AND e.repair AND e.state IS NULL)
    ORDER BY id
    FOR UPDATE
), deleted AS (
    DELETE FROM pgqueue_job AS j
    USING locked
    WHERE j.id = locked.id
      AND j.status IN ('done', 'dead', 'cancelled')
    RETURNING j.id, j.parents_left
), own_edges AS (
    DELETE FROM pgqueue_job_dependency AS e
    WHERE e.job_id IN (SELECT id FROM deleted WHERE parents_left IS NOT NULL)
)
SELECT id FROM deleted
"""


JOB_NOTIFY_CANCEL = """
-- name: JOB_NOTIFY_CANCEL
-- Tell workers that running jobs were cancelled: prefix and ids, per_payload ids a
-- notification (payloads stay under 8000 bytes), at commit.
SELECT pg_notify(%(channel)s, %(prefix)s || string_agg(t.id::text, ',' ORDER BY t.n))
FROM unnest(%(ids)s::bigint[]) WITH ORDINALITY AS t(id, n)
GROUP BY (t.n - 1) / %(per_payload)s
"""


JOB_REQUEUE_DEAD = """
-- name: JOB_REQUEUE_DEAD
-- Requeue dead letters by id: pending, attempts reset, errors kept, locked in id order;
-- a job whose key a live job holds is skipped.
-- moves: dead -> pending
WITH picked AS (
    SELECT DISTINCT ON (target_queue, idempotency_key,
                        CASE WHEN idempotency_key IS NULL THEN id END)
           id, target_queue
    FROM (SELECT id, idempotency_key, coalesce(%(queue)s::text, queue) AS target_queue
          FROM pgqueue_job
          WHERE id = ANY(%(ids)s::bigint[])
            AND status = 'dead'
          ORDER BY id
          FOR UPDATE) AS dead
    ORDER BY target_queue, idempotency_key,
             CASE WHEN idempotency_key IS NULL THEN id END, id DESC
)
UPDATE pgqueue_job AS j
SET status = 'pending',
    queue = picked.target_queue,
    priority = coalesce(%(priority)s::int, j.priority),
    attempts = 0,
    run_at = coalesce(%(now)s::timestamptz, clock_timestamp()),
    lease_owner = NULL,
    lease_expires_at = NULL,
    finished_at = NULL,
    result = NULL
FROM picked
WHERE j.id = picked.id
  AND j.status = 'dead'
  AND (j.idempotency_key IS NULL OR NOT EXISTS (
      SELECT 1
      FROM pgqueue_job AS live
      WHERE live.queue = picked.target_queue
        AND live.idempotency_key = j.idempotency_key
        AND live.status IN ('pending', 'scheduled', 'running', 'waiting')))
RETURNING j.id, j.queue, pg_notify(%(channel)s, j.queue)::text AS notified
"""


# Run scheduled jobs now (the admin's "retry now" of a job waiting for its retry or its
# run time): pending, due now, attempts and errors kept. Locked in id order like the
# other operations; the sweeper's promotion (SKIP LOCKED) passes over them meanwhile.
JOB_RUN_NOW = """
-- name: JOB_RUN_NOW
-- Scheduled jobs by id to pending, due now, attempts and errors kept; locked in id
-- order, and NOTIFY at commit.
-- moves: scheduled -> pending
WITH locked AS (
    SELECT id
    FROM pgqueue_job
    WHERE id = ANY(%(ids)s::bigint[])
      AND status = 'scheduled'
    ORDER BY id
    FOR UPDATE
)
UPDATE pgqueue_job AS j
SET status = 'pending',
    run_at = coalesce(%(now)s::timestamptz, clock_timestamp())
FROM locked
WHERE j.id = locked.id
  AND j.status = 'scheduled'
RETURNING j.id, pg_notify(%(channel)s, j.queue)::text AS notified
"""
