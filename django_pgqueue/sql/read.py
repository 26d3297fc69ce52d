"""Reads for the operator (``pgqueue_status``, the dashboard, the metrics), each bounded
whatever the size of the table. Run by ``django_pgqueue.monitoring`` only.
"""

from __future__ import annotations

from .common import CLOCK
from .flow import FLOW_LIMITS, KEY_MATCHES

# Each budget of the limits in force, for pgqueue_status, the dashboard and the metrics:
# a key limit's budgets are its exact key and every matching key that runs now (a scan
# of pgqueue_job_running_key_idx: as many as run) or started in its rate window (the
# %(subjects)s latest of pgqueue_rate); a queue limit's is its queue. For each, what runs, what its
# rate window holds, and what is pending: at most %(cap)s jobs per priority level of
# each queue (the levels found by a loose scan of pgqueue_job_queue_claim_idx), counted
# over a range of pgqueue_job_key_claim_idx. Bounded whatever the backlog.
FLOW_GET_BUDGETS = (
    """
-- name: FLOW_GET_BUDGETS
-- Each budget of the limits in force (pgqueue_status, the dashboard, the metrics): what
-- runs, what its rate window holds and what is pending, each count capped; bounded
-- whatever the backlog.
WITH RECURSIVE """
    + CLOCK
    + ", "
    + FLOW_LIMITS
    + """, running AS (
    SELECT concurrency_key AS key, count(*) AS jobs
    FROM pgqueue_job
    WHERE (status = 'running') IS TRUE AND concurrency_key > ''
    GROUP BY concurrency_key
), level(queue, priority) AS (
    (SELECT queue, priority
     FROM pgqueue_job
     WHERE status = 'pending'
     ORDER BY queue, priority DESC
     LIMIT 1)
    UNION ALL
    SELECT n.queue, n.priority
    FROM level AS v
    CROSS JOIN LATERAL (
        (SELECT queue, priority
         FROM pgqueue_job
         WHERE status = 'pending' AND queue = v.queue AND priority < v.priority
         ORDER BY queue, priority DESC
         LIMIT 1)
        UNION ALL
        (SELECT queue, priority
         FROM pgqueue_job
         WHERE status = 'pending' AND queue > v.queue
         ORDER BY queue, priority DESC
         LIMIT 1)
        LIMIT 1) AS n
), subject AS (
    SELECT l.name, r.key AS subject
    FROM key_limit AS l
    JOIN running AS r ON """
    + KEY_MATCHES.format(key="r.key")
    + """
    UNION
    SELECT l.name, l.pattern
    FROM key_limit AS l
    WHERE NOT l.prefix
    UNION
    (SELECT w.name, w.subject
     FROM pgqueue_rate AS w
     WHERE w.expires_at > (SELECT now FROM clock)
       AND w.name IN (SELECT name FROM key_limit)
     ORDER BY w.expires_at DESC
     LIMIT %(subjects)s)
)
SELECT 'key' AS kind, s.name, s.subject, l.concurrency, coalesce(r.jobs, 0) AS running,
       l.rate, l.period,
       (SELECT count(*)
        FROM pgqueue_rate AS w, unnest(w.starts) AS st(at)
        WHERE w.name = s.name AND w.subject = s.subject
          AND st.at > clock.now - make_interval(secs => l.period)) AS started,
       (SELECT coalesce(sum(c.jobs), 0)::bigint
        FROM level AS v
        CROSS JOIN LATERAL (
            SELECT count(*) AS jobs
            FROM (SELECT 1
                  FROM pgqueue_job AS j
                  WHERE j.status = 'pending' AND j.queue = v.queue
                    AND j.priority = v.priority AND j.concurrency_key = s.subject
                  LIMIT %(cap)s) AS x) AS c) AS pending
FROM subject AS s
JOIN key_limit AS l ON l.name = s.name
LEFT JOIN running AS r ON r.key = s.subject
CROSS JOIN clock
UNION ALL
SELECT 'queue', 'queue:' || l.queue, l.queue, l.concurrency,
       (SELECT count(*)
        FROM (SELECT 1
              FROM pgqueue_job
              WHERE status = 'running' AND queue = l.queue
              LIMIT %(cap)s) AS x),
       l.rate, l.period,
       (SELECT count(*)
        FROM pgqueue_rate AS w, unnest(w.starts) AS st(at)
        WHERE w.name = 'queue:' || l.queue AND w.subject = l.queue
          AND st.at > clock.now - make_interval(secs => l.period)),
       (SELECT count(*)
        FROM (SELECT 1
              FROM pgqueue_job
              WHERE status = 'pending' AND queue = l.queue
              LIMIT %(cap)s) AS x)
FROM queue_limit AS l
CROSS JOIN clock
ORDER BY 1, 2, 3
"""
)


JOB_COUNT_LIVE_BY_QUEUE = """
-- name: JOB_COUNT_LIVE_BY_QUEUE
-- Live jobs per status and queue for the admin, at most cap rows of each status, each
-- from its own partial index: bounded whatever the backlog.
WITH live AS (
    (SELECT 'pending'::text AS status, queue
     FROM pgqueue_job
     WHERE status = 'pending'
     LIMIT %(cap)s)
    UNION ALL
    (SELECT 'scheduled'::text, queue
     FROM pgqueue_job
     WHERE status = 'scheduled'
     LIMIT %(cap)s)
    UNION ALL
    (SELECT 'running'::text, queue
     FROM pgqueue_job
     WHERE status = 'running'
     LIMIT %(cap)s)
    UNION ALL
    (SELECT 'waiting'::text, queue
     FROM pgqueue_job
     WHERE status = 'waiting'
     LIMIT %(cap)s)
)
SELECT status, queue, count(*) AS jobs
FROM live
GROUP BY status, queue
ORDER BY status, queue
"""


JOB_COUNT_SAMPLE_BY_QUEUE = """
-- name: JOB_COUNT_SAMPLE_BY_QUEUE
-- Status figures per queue, at most cap rows of each status from its own partial index,
-- with the oldest pending run_at.
WITH sample AS (
    (SELECT 'pending'::text AS status, queue, run_at
     FROM pgqueue_job
     WHERE status = 'pending'
     LIMIT %(cap)s)
    UNION ALL
    (SELECT 'scheduled'::text, queue, NULL::timestamptz
     FROM pgqueue_job
     WHERE status = 'scheduled'
     LIMIT %(cap)s)
    UNION ALL
    (SELECT 'running'::text, queue, NULL::timestamptz
     FROM pgqueue_job
     WHERE status = 'running'
     LIMIT %(cap)s)
    UNION ALL
    (SELECT 'dead'::text, queue, NULL::timestamptz
     FROM pgqueue_job
     WHERE status = 'dead'
     LIMIT %(cap)s)
    UNION ALL
    (SELECT 'waiting'::text, queue, NULL::timestamptz
     FROM pgqueue_job
     WHERE status = 'waiting'
     LIMIT %(cap)s)
)
SELECT status, queue, count(*) AS jobs, min(run_at) AS oldest_run_at
FROM sample
GROUP BY status, queue
ORDER BY status, queue
"""


JOB_GET_COLUMN_STATS = """
-- name: JOB_GET_COLUMN_STATS
-- The planner's statistics of one column and the table's size, from the catalogs: no
-- table scan.
SELECT c.reltuples::bigint AS total,
       pg_relation_size(c.oid) AS bytes,
       st.most_common_vals::text::text[] AS vals,
       st.most_common_freqs AS freqs
FROM pg_class AS c
JOIN pg_namespace AS n ON n.oid = c.relnamespace
LEFT JOIN pg_stats AS st
       ON st.schemaname = n.nspname
      AND st.tablename = c.relname
      AND st.attname = %(column)s
      AND NOT st.inherited
WHERE c.oid = 'pgqueue_job'::regclass
"""


JOB_GET_HEALTH = """
-- name: JOB_GET_HEALTH
-- The longest wait of a pending job and the count of expired leases, each from a
-- bounded range of its index.
WITH RECURSIVE head AS (
    (SELECT priority, run_at
     FROM pgqueue_job
     WHERE status = 'pending'
     ORDER BY priority DESC, id
     LIMIT 1)
    UNION ALL
    SELECT nxt.priority, nxt.run_at
    FROM head,
         LATERAL (SELECT priority, run_at
                  FROM pgqueue_job
                  WHERE status = 'pending'
                    AND priority < head.priority
                  ORDER BY priority DESC, id
                  LIMIT 1) AS nxt
), clock AS (
    SELECT coalesce(%(now)s::timestamptz, clock_timestamp()) AS now
)
SELECT greatest(clock.now - least(
           (SELECT min(run_at) FROM head),
           (SELECT min(run_at)
            FROM (SELECT run_at
                  FROM pgqueue_job
                  WHERE status = 'pending'
                  LIMIT %(cap)s) AS sample)), interval '0') AS oldest_pending_wait,
       (SELECT count(*)
        FROM (SELECT 1
              FROM pgqueue_job
              WHERE status = 'running'
                AND lease_expires_at < clock.now
              ORDER BY lease_expires_at
              LIMIT %(cap)s) AS expired) AS expired_leases
FROM clock
"""


JOB_GET_HISTORY = """
-- name: JOB_GET_HISTORY
-- The dashboard's per-minute history: up to cap done jobs a minute
-- (pgqueue_job_done_idx) and the newest dead letters.
WITH clock AS (
    SELECT date_trunc('minute', coalesce(%(now)s::timestamptz, clock_timestamp())) AS minute
), minutes AS (
    SELECT generate_series(clock.minute - make_interval(mins => %(minutes)s - 1),
                           clock.minute, interval '1 minute') AS start
    FROM clock
), dead AS (
    SELECT date_trunc('minute', d.finished_at) AS start, count(*) AS jobs
    FROM (SELECT finished_at
          FROM pgqueue_job
          WHERE status = 'dead'
          ORDER BY id DESC
          LIMIT %(cap)s) AS d, clock
    WHERE d.finished_at >= clock.minute - make_interval(mins => %(minutes)s - 1)
    GROUP BY 1
)
SELECT m.start, done.jobs, done.first_at, done.last_at, done.wait_avg, done.wait_max,
       coalesce(dead.jobs, 0) AS dead
FROM minutes AS m
CROSS JOIN LATERAL (
    SELECT count(*) AS jobs, min(s.finished_at) AS first_at, max(s.finished_at) AS last_at,
           avg(date_part('epoch', s.last_attempted_at - s.run_at)) AS wait_avg,
           max(date_part('epoch', s.last_attempted_at - s.run_at)) AS wait_max
    FROM (SELECT finished_at, last_attempted_at, run_at
          FROM pgqueue_job
          WHERE status = 'done'
            AND finished_at >= m.start
            AND finished_at < m.start + interval '1 minute'
          ORDER BY finished_at
          LIMIT %(cap)s) AS s
) AS done
LEFT JOIN dead ON dead.start = m.start
ORDER BY m.start
"""


JOB_GET_PENDING_HEADS = """
-- name: JOB_GET_PENDING_HEADS
-- The head of each priority's line of pending jobs: a loose index scan of
-- pgqueue_job_claim_idx.
WITH RECURSIVE head AS (
    (SELECT priority, queue, run_at
     FROM pgqueue_job
     WHERE status = 'pending'
     ORDER BY priority DESC, id
     LIMIT 1)
    UNION ALL
    SELECT nxt.priority, nxt.queue, nxt.run_at
    FROM head,
         LATERAL (SELECT priority, queue, run_at
                  FROM pgqueue_job
                  WHERE status = 'pending'
                    AND priority < head.priority
                  ORDER BY priority DESC, id
                  LIMIT 1) AS nxt
)
SELECT queue, min(run_at)
FROM head
GROUP BY queue
"""


JOB_GET_RUNNING = """
-- name: JOB_GET_RUNNING
-- The running jobs with their progress, soonest lease expiry first: a bounded range of
-- pgqueue_job_lease_idx.
SELECT id, queue, task, lease_owner, attempts, last_attempted_at, progress
FROM pgqueue_job
WHERE status = 'running'
ORDER BY lease_expires_at
LIMIT %(limit)s
"""


JOB_SAMPLE_FINISHED = """
-- name: JOB_SAMPLE_FINISHED
-- Jobs finished in the last window_seconds per outcome and queue, at most cap of each,
-- from each outcome's partial index.
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, clock_timestamp()) AS now
), done AS (
    SELECT queue, finished_at
    FROM pgqueue_job
    WHERE status = 'done'
      AND finished_at >= (SELECT now FROM clock) - make_interval(secs => %(window_seconds)s)
    ORDER BY finished_at DESC
    LIMIT %(cap)s
), cancelled AS (
    SELECT queue, finished_at
    FROM pgqueue_job
    WHERE status = 'cancelled'
      AND finished_at >= (SELECT now FROM clock) - make_interval(secs => %(window_seconds)s)
    ORDER BY finished_at DESC
    LIMIT %(cap)s
), dead AS (
    SELECT d.queue, d.finished_at
    FROM (SELECT queue, finished_at
          FROM pgqueue_job
          WHERE status = 'dead'
          ORDER BY id DESC
          LIMIT %(cap)s) AS d, clock
    WHERE d.finished_at >= clock.now - make_interval(secs => %(window_seconds)s)
)
SELECT 'done'::text AS outcome, queue, count(*) AS jobs,
       count(*) FILTER (WHERE finished_at >= clock.now - interval '1 minute') AS last_minute,
       min(finished_at) AS oldest, clock.now
FROM done, clock
GROUP BY queue, clock.now
UNION ALL
SELECT 'dead'::text, queue, count(*),
       count(*) FILTER (WHERE finished_at >= clock.now - interval '1 minute'),
       min(finished_at), clock.now
FROM dead, clock
GROUP BY queue, clock.now
UNION ALL
SELECT 'cancelled'::text, queue, count(*),
       count(*) FILTER (WHERE finished_at >= clock.now - interval '1 minute'),
       min(finished_at), clock.now
FROM cancelled, clock
GROUP BY queue, clock.now
"""


WORKER_GET_ALL = """
-- name: WORKER_GET_ALL
-- Every registered worker, with whether it is lost, judged by the database clock.
SELECT id, hostname, pid, queues, concurrency, lease_seconds, version, started_at,
       last_seen_at, jobs_held, jobs_done, jobs_failed, rss_bytes, restarts,
       last_seen_at + make_interval(secs => lease_seconds)
           < coalesce(%(now)s::timestamptz, clock_timestamp()) AS lost,
       coalesce(%(now)s::timestamptz, clock_timestamp()) - last_seen_at AS unseen_for
FROM pgqueue_worker
ORDER BY hostname, id
LIMIT %(limit)s
"""
