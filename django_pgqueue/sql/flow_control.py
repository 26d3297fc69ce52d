"""Flow control set at run time: the limits and paused queues stored in the database, read by
workers, and the notification that tells them of a change. Run by ``django_pgqueue.flow`` only.
"""

from __future__ import annotations

FLOW_GET_STATE = """
-- name: FLOW_GET_STATE
-- What a worker must know of flow control beyond the settings: the limits set at run
-- time and the paused queues. Two tiny tables, scanned.
SELECT 'limit' AS kind, key, concurrency, rate
FROM pgqueue_limit
UNION ALL
SELECT 'paused', name, NULL, NULL
FROM pgqueue_queue
WHERE paused_at IS NOT NULL
"""


FLOW_NOTIFY = """
-- name: FLOW_NOTIFY
-- Tell workers that limits or paused queues changed (payload: flow.NOTIFY_PREFIX);
-- delivered at commit.
SELECT pg_notify(%(channel)s, %(payload)s)
"""


LIMIT_DELETE = """
-- name: LIMIT_DELETE
-- Lift a limit set at run time (the settings' entry of its key, if any, is in force
-- again).
DELETE FROM pgqueue_limit
WHERE key = %(key)s
RETURNING key
"""


LIMIT_SET = """
-- name: LIMIT_SET
-- Set a limit at run time (concurrency and rate NULL: no limit on this key, whatever
-- the settings declare).
INSERT INTO pgqueue_limit AS l (key, concurrency, rate, updated_at)
VALUES (%(key)s, %(concurrency)s, %(rate)s, coalesce(%(now)s::timestamptz, clock_timestamp()))
ON CONFLICT (key) DO UPDATE
SET concurrency = excluded.concurrency,
    rate = excluded.rate,
    updated_at = excluded.updated_at
"""


QUEUE_PAUSE = """
-- name: QUEUE_PAUSE
-- Pause a queue (since when, kept if it was paused already); workers hear of it by
-- FLOW_NOTIFY in the same transaction.
INSERT INTO pgqueue_queue AS q (name, paused_at, updated_at)
VALUES (%(name)s, coalesce(%(now)s::timestamptz, clock_timestamp()),
        coalesce(%(now)s::timestamptz, clock_timestamp()))
ON CONFLICT (name) DO UPDATE
SET paused_at = coalesce(q.paused_at, excluded.paused_at),
    updated_at = excluded.updated_at
RETURNING q.paused_at
"""


QUEUE_RESUME = """
-- name: QUEUE_RESUME
-- Resume a queue (its row stays, not paused); returns the row if it was paused.
UPDATE pgqueue_queue AS q
SET paused_at = NULL,
    updated_at = coalesce(%(now)s::timestamptz, clock_timestamp())
WHERE q.name = %(name)s
  AND q.paused_at IS NOT NULL
RETURNING q.name
"""
