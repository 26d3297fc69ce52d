"""Enqueueing one job: plain, keyed (``unique_for``, ``debounce``), and the wake-ups.
Run by ``django_pgqueue.enqueue`` only.
"""

from __future__ import annotations

from .common import UNIQUE_WINDOW, WAITING

# A keyed enqueue's job (JOB_ENQUEUE_DEBOUNCED, JOB_ENQUEUE_UNIQUE), inserted only if its
# key row ("held") was given this statement's new id; {key} is its idempotency_key.
_KEYED_INSERT = """INSERT INTO pgqueue_job AS j (
        id, backend, queue, task, args, kwargs, priority, status, attempts, max_attempts,
        run_at, idempotency_key, errors, created_at, trace_context, concurrency_key,
        soft_time_limit, time_limit, tags
    )
    SELECT held.job_id, %(backend)s, %(queue)s, %(task)s, %(args)s::jsonb,
           %(kwargs)s::jsonb, %(priority)s,
           CASE WHEN clock.run_at > clock.now THEN 'scheduled' ELSE 'pending' END,
           0, %(max_attempts)s, coalesce(clock.run_at, clock.now), {key},
           '[]'::jsonb, clock.now, %(trace_context)s::jsonb, %(concurrency_key)s,
           %(soft_time_limit)s::float8, %(time_limit)s::float8, %(tags)s::text[]
    FROM held, clock
    WHERE held.fresh"""


# WAITING in an enqueue, whose snapshot may predate the key's job (a concurrent
# enqueue made both): a job not seen before its run time is taken as waiting.
_DEBOUNCING = (
    "("
    + WAITING
    + """
               OR (k.expires_at > excluded.created_at
                   AND NOT EXISTS (SELECT FROM pgqueue_job AS w WHERE w.id = k.job_id)))"""
)


JOB_ENQUEUE = """
-- name: JOB_ENQUEUE
-- Insert one job, or find the live one holding its idempotency key
-- (pgqueue_job_idempotency_uniq), and NOTIFY at commit.
-- moves: new -> pending | scheduled
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, clock_timestamp()) AS now,
           %(run_at)s::timestamptz AS run_at
)
INSERT INTO pgqueue_job AS j (
    backend, queue, task, args, kwargs, priority, status, attempts, max_attempts,
    run_at, idempotency_key, errors, created_at, trace_context, concurrency_key,
    soft_time_limit, time_limit, tags
)
SELECT %(backend)s, %(queue)s, %(task)s, %(args)s::jsonb, %(kwargs)s::jsonb,
       %(priority)s,
       CASE WHEN clock.run_at > clock.now THEN 'scheduled' ELSE 'pending' END,
       0, %(max_attempts)s, coalesce(clock.run_at, clock.now), %(idempotency_key)s,
       '[]'::jsonb, clock.now, %(trace_context)s::jsonb, %(concurrency_key)s,
       %(soft_time_limit)s::float8, %(time_limit)s::float8, %(tags)s::text[]
FROM clock
ON CONFLICT (queue, idempotency_key)
    WHERE idempotency_key IS NOT NULL
      AND status IN ('pending', 'scheduled', 'running')
    DO NOTHING
RETURNING j.id, j.status, j.run_at, j.created_at, pg_notify(%(channel)s, j.queue)::text
"""


JOB_ENQUEUE_DEBOUNCED = (
    """
-- name: JOB_ENQUEUE_DEBOUNCED
-- Debounced enqueue: the key's row names the job that has not started, which gets these
-- arguments and run time; else a new job.
-- moves: new -> pending | scheduled
-- moves: pending -> scheduled
-- moves: scheduled -> pending
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, clock_timestamp()) AS now,
           coalesce(%(now)s::timestamptz, clock_timestamp())
               + make_interval(secs => %(debounce)s) AS run_at,
           nextval(pg_get_serial_sequence('pgqueue_job', 'id')) AS new_id
), held AS (
    INSERT INTO pgqueue_job_key AS k (kind, queue, key, job_id, created_at, expires_at)
    SELECT 'debounce', %(queue)s, %(idempotency_key)s, clock.new_id, clock.now, clock.run_at
    FROM clock
    ON CONFLICT (kind, queue, key) DO UPDATE
    SET job_id = CASE WHEN """
    + _DEBOUNCING
    + """ THEN k.job_id ELSE excluded.job_id END,
        created_at = CASE WHEN """
    + _DEBOUNCING
    + """ THEN k.created_at ELSE excluded.created_at END,
        expires_at = excluded.expires_at
    RETURNING k.job_id, k.job_id = (SELECT new_id FROM clock) AS fresh
), updated AS (
    UPDATE pgqueue_job AS j
    SET args = %(args)s::jsonb,
        kwargs = %(kwargs)s::jsonb,
        tags = %(tags)s::text[],
        run_at = clock.run_at,
        status = CASE WHEN clock.run_at > clock.now THEN 'scheduled' ELSE 'pending' END
    FROM held, clock
    WHERE j.id = held.job_id
      AND NOT held.fresh
      AND j.status IN ('pending', 'scheduled')
    RETURNING j.id
), inserted AS (
    """
    + _KEYED_INSERT.format(key="NULL")
    + """
    RETURNING j.id
)
SELECT held.job_id, held.fresh, pg_notify(%(channel)s, %(queue)s)::text
FROM held
WHERE EXISTS (SELECT FROM updated) OR EXISTS (SELECT FROM inserted)
"""
)


JOB_ENQUEUE_UNIQUE = (
    """
-- name: JOB_ENQUEUE_UNIQUE
-- Enqueue unique for a period: the key's row names the job created in its window, or,
-- once the window closed, this new one.
-- moves: new -> pending | scheduled
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, clock_timestamp()) AS now,
           %(run_at)s::timestamptz AS run_at,
           nextval(pg_get_serial_sequence('pgqueue_job', 'id')) AS new_id
), held AS (
    INSERT INTO pgqueue_job_key AS k (kind, queue, key, job_id, created_at, expires_at)
    SELECT 'unique', %(queue)s, %(idempotency_key)s, clock.new_id, clock.now,
           clock.now + make_interval(secs => %(unique_for)s)
    FROM clock
"""
    + UNIQUE_WINDOW
    + """
    RETURNING k.job_id, k.job_id = (SELECT new_id FROM clock) AS fresh
), inserted AS (
    """
    + _KEYED_INSERT.format(key="%(idempotency_key)s")
    + """
    ON CONFLICT (queue, idempotency_key)
        WHERE idempotency_key IS NOT NULL
          AND status IN ('pending', 'scheduled', 'running')
        DO NOTHING
    RETURNING j.id, pg_notify(%(channel)s, j.queue)::text
)
SELECT held.job_id, held.fresh, EXISTS (SELECT FROM inserted) AS inserted
FROM held
"""
)


JOB_NOTIFY = """
-- name: JOB_NOTIFY
-- Wake idle workers listening on the channel (payload: the queue name), at commit.
SELECT pg_notify(%(channel)s, %(queue)s)
"""


JOB_NOTIFY_MANY = """
-- name: JOB_NOTIFY_MANY
-- Wake idle workers once for each of several queues, in one statement, at commit.
SELECT pg_notify(%(channel)s, queue)
FROM unnest(%(queues)s::text[]) AS queue
"""
