"""Periodic jobs: the schedules' rows kept in step with the settings, and each due tick
enqueued once across sweepers. Run by ``django_pgqueue.periodic`` only.
"""

from __future__ import annotations

from .common import UNIQUE_WINDOW

# Enqueue each entry's due tick once however many sweepers run: advance its row (by key,
# locked in name order, SKIP LOCKED) only to a newer tick not after the clock, and insert
# the job (key periodic:<name>:<tick>; a live job holding it wins) from that same row.
# An entry with unique_for keys its jobs periodic:<name> and first takes the key's window
# row as JOB_ENQUEUE_UNIQUE does (one row per entry: names are unique, so no row is
# upserted twice): its job is inserted only if it opened a new window. Each advanced row
# comes back, with its job (if inserted) and the job its window names; a window this
# statement opened for a job a live holder kept out is given back (SCHEDULE_GIVE_BACK_KEYS).
SCHEDULE_ENQUEUE_TICKS = (
    """
-- name: SCHEDULE_ENQUEUE_TICKS
-- Enqueue each periodic entry's due tick once however many sweepers run: advance its
-- row only to a newer tick not after the clock, and insert the job from that same row.
-- moves: new -> pending
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, clock_timestamp()) AS now
), entry AS (
    SELECT *
    FROM unnest(
        %(names)s::text[], %(crons)s::text[], %(timezones)s::text[],
        %(ticks)s::timestamptz[], %(keys)s::text[], %(backends)s::text[],
        %(queues)s::text[], %(tasks)s::text[], %(args)s::text[], %(kwargs)s::text[],
        %(priorities)s::int[], %(max_attempts)s::int[], %(concurrency_keys)s::text[],
        %(unique_fors)s::float8[], %(tags)s::text[]
    ) AS e(name, cron, timezone, tick, key, backend, queue, task, args, kwargs,
           priority, max_attempts, concurrency_key, unique_for, tags)
), due AS (
    SELECT s.name
    FROM pgqueue_schedule AS s
    JOIN entry AS e ON e.name = s.name, clock
    WHERE s.last_tick < e.tick
      AND e.tick <= clock.now
    ORDER BY s.name
    FOR UPDATE OF s SKIP LOCKED
), advanced AS (
    UPDATE pgqueue_schedule AS s
    SET last_tick = e.tick,
        task = e.task,
        cron = e.cron,
        timezone = e.timezone,
        enabled = true,
        last_job_id = nextval(pg_get_serial_sequence('pgqueue_job', 'id')),
        updated_at = clock.now
    FROM due, entry AS e, clock
    WHERE s.name = due.name
      AND e.name = due.name
    RETURNING s.name, s.last_job_id
), held AS (
    INSERT INTO pgqueue_job_key AS k (kind, queue, key, job_id, created_at, expires_at)
    SELECT 'unique', e.queue, e.key, a.last_job_id, clock.now,
           clock.now + make_interval(secs => e.unique_for)
    FROM advanced AS a
    JOIN entry AS e ON e.name = a.name, clock
    WHERE e.unique_for IS NOT NULL
"""
    + UNIQUE_WINDOW
    + """
    RETURNING k.queue, k.key, k.job_id
), inserted AS (
    INSERT INTO pgqueue_job AS j (
        id, backend, queue, task, args, kwargs, priority, status, attempts, max_attempts,
        run_at, idempotency_key, errors, created_at, concurrency_key, tags
    )
    SELECT a.last_job_id, e.backend, e.queue, e.task, e.args::jsonb, e.kwargs::jsonb,
           e.priority, 'pending', 0, e.max_attempts, e.tick, e.key, '[]'::jsonb, clock.now,
           e.concurrency_key,
           -- the task's @task(tags=...), one JSON array per entry (arrays of arrays
           -- must not be ragged)
           ARRAY(SELECT jsonb_array_elements_text(e.tags::jsonb))
    FROM advanced AS a
    JOIN entry AS e ON e.name = a.name, clock
    WHERE e.unique_for IS NULL
       OR a.last_job_id IN (SELECT job_id FROM held)
    ON CONFLICT (queue, idempotency_key)
        WHERE idempotency_key IS NOT NULL
          AND status IN ('pending', 'scheduled', 'running')
        DO NOTHING
    RETURNING j.id, j.queue, pg_notify(%(channel)s, j.queue)::text AS notified
)
SELECT a.name, a.last_job_id, i.id, e.queue, h.job_id
FROM advanced AS a
JOIN entry AS e ON e.name = a.name
LEFT JOIN inserted AS i ON i.id = a.last_job_id
LEFT JOIN held AS h ON (h.queue, h.key) = (e.queue, e.key)
ORDER BY a.name
"""
)


# Give back the windows SCHEDULE_ENQUEUE_TICKS opened (in the same transaction) for jobs
# it did not insert, since a live job held the key: as JOB_ENQUEUE_UNIQUE's roll-back,
# the key is free again, for the next tick or enqueue. By primary key; the job_id
# condition leaves alone a row that names any other job.
SCHEDULE_GIVE_BACK_KEYS = """
-- name: SCHEDULE_GIVE_BACK_KEYS
-- Give back the unique_for windows SCHEDULE_ENQUEUE_TICKS opened for jobs it did not
-- insert (a live job held the key).
DELETE FROM pgqueue_job_key AS k
USING unnest(%(queues)s::text[], %(keys)s::text[], %(job_ids)s::bigint[]) AS g(queue, key, job_id)
WHERE (k.kind, k.queue, k.key) = ('unique', g.queue, g.key)
  AND k.job_id = g.job_id
"""


SCHEDULE_SYNC = """
-- name: SCHEDULE_SYNC
-- Make the schedules' rows agree with the settings, locking only rows that differ; a
-- clock gone back rewinds the last tick and puts its future job back to scheduled.
-- moves: pending -> scheduled
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, clock_timestamp()) AS now
), entry AS (
    SELECT e.*, e.tick <= clock.now - make_interval(secs => %(grace)s) AS old, clock.now
    FROM unnest(
        %(names)s::text[], %(tasks)s::text[], %(crons)s::text[], %(timezones)s::text[],
        %(enabled)s::boolean[], %(ticks)s::timestamptz[]
    ) AS e(name, task, cron, timezone, enabled, tick), clock
), stale AS (
    SELECT s.name
    FROM pgqueue_schedule AS s
    JOIN entry AS e ON e.name = s.name
    WHERE s.task <> e.task OR s.cron <> e.cron OR s.timezone <> e.timezone
       OR s.enabled <> e.enabled
       OR (NOT e.enabled AND s.last_tick < e.tick AND e.old)
       OR s.last_tick > e.now
    ORDER BY s.name
    FOR UPDATE OF s
), changed AS (
    UPDATE pgqueue_schedule AS s
    SET task = e.task,
        cron = e.cron,
        timezone = e.timezone,
        enabled = e.enabled,
        last_tick = CASE
            WHEN s.last_tick > e.now THEN e.tick
            WHEN (s.cron <> e.cron OR s.timezone <> e.timezone OR s.enabled <> e.enabled
                  OR NOT e.enabled) AND e.old
            THEN greatest(s.last_tick, e.tick)
            ELSE s.last_tick END,
        updated_at = e.now
    FROM stale, entry AS e
    WHERE s.name = stale.name
      AND e.name = stale.name
    RETURNING s.name
), rescheduled AS (
    UPDATE pgqueue_job AS j
    SET status = 'scheduled'
    FROM pgqueue_schedule AS s, entry AS e
    WHERE e.name = s.name
      AND s.last_tick > e.now
      AND j.id = s.last_job_id
      AND j.status = 'pending'
      AND j.run_at > e.now
)
INSERT INTO pgqueue_schedule (
    name, task, cron, timezone, enabled, last_tick, created_at, updated_at
)
SELECT e.name, e.task, e.cron, e.timezone, e.enabled, e.tick, e.now, e.now
FROM entry AS e
WHERE e.name NOT IN (SELECT name FROM changed)
ORDER BY e.name
ON CONFLICT (name) DO NOTHING
"""
