"""A worker process's row: registered, touched by its heartbeat, deleted at exit. Run by
``django_pgqueue.worker.presence`` only.

A row belongs to one process instance (``instance``, a random token): a worker touches
and deletes only its own, so two processes given the same ``--worker-id`` never write
or delete each other's row.
"""

from __future__ import annotations

WORKER_DELETE = """
-- name: WORKER_DELETE
-- Forget a worker that exits cleanly (the last thing it does): its own row only, not
-- one another process took over meanwhile. Primary-key lookup.
DELETE FROM pgqueue_worker
WHERE id = %(id)s AND instance = %(instance)s
"""


WORKER_HOLDER = """
-- name: WORKER_HOLDER
-- Who holds a worker id that WORKER_REGISTER could not take: host, pid, and seconds
-- since it was last seen. Primary-key lookup.
SELECT hostname, pid,
       extract(epoch FROM coalesce(%(now)s::timestamptz, clock_timestamp()) - last_seen_at)
FROM pgqueue_worker
WHERE id = %(id)s
"""


WORKER_REGISTER = """
-- name: WORKER_REGISTER
-- Register a worker process at start (or again, after the sweeper deleted it while it
-- was cut off); takes over only its own row, a lost one, or one found dead (take_over).
INSERT INTO pgqueue_worker AS w (
    id, instance, hostname, pid, queues, concurrency, lease_seconds, version,
    started_at, last_seen_at, jobs_held, jobs_done, jobs_failed, rss_bytes, restarts
)
VALUES (
    %(id)s, %(instance)s, %(hostname)s, %(pid)s, %(queues)s::text[], %(concurrency)s,
    %(lease_seconds)s, %(version)s, coalesce(%(now)s::timestamptz, clock_timestamp()),
    coalesce(%(now)s::timestamptz, clock_timestamp()), %(jobs_held)s, %(jobs_done)s,
    %(jobs_failed)s, %(rss_bytes)s, %(restarts)s
)
ON CONFLICT (id) DO UPDATE
SET instance = excluded.instance,
    hostname = excluded.hostname,
    pid = excluded.pid,
    queues = excluded.queues,
    concurrency = excluded.concurrency,
    lease_seconds = excluded.lease_seconds,
    version = excluded.version,
    started_at = CASE WHEN %(restart)s THEN excluded.started_at ELSE w.started_at END,
    last_seen_at = excluded.last_seen_at,
    jobs_held = excluded.jobs_held,
    jobs_done = excluded.jobs_done,
    jobs_failed = excluded.jobs_failed,
    rss_bytes = excluded.rss_bytes,
    restarts = excluded.restarts
WHERE w.instance = excluded.instance
   OR w.last_seen_at + make_interval(secs => w.lease_seconds) < excluded.last_seen_at
   OR %(take_over)s
RETURNING w.id
"""


WORKER_TOUCH = """
-- name: WORKER_TOUCH
-- The heartbeat's still alive: last seen now, with its counts, on its own row; zero
-- rows means the row is gone (or another process took the id) and it registers again.
UPDATE pgqueue_worker
SET last_seen_at = coalesce(%(now)s::timestamptz, clock_timestamp()),
    jobs_held = %(jobs_held)s,
    jobs_done = %(jobs_done)s,
    jobs_failed = %(jobs_failed)s,
    rss_bytes = %(rss_bytes)s
WHERE id = %(id)s AND instance = %(instance)s
"""
