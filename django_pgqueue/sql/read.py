"""Reads for the operator (``pgqueue_status``, the dashboard, the metrics), each bounded
whatever the size of the table. Run by ``django_pgqueue.monitoring`` only.
"""

from __future__ import annotations

from .common import CLOCK
from .flow import FLOW_LIMITS, KEY_MATCHES

# Each queue with pending jobs and its oldest run_at, as the CTE "head": a loose scan of
# pgqueue_job_pending_age_idx, one seek per queue.
_PENDING_HEADS = """WITH RECURSIVE head(queue, run_at) AS (
    (SELECT queue, run_at
     FROM pgqueue_job
     WHERE status = 'pending'
     ORDER BY queue, run_at
     LIMIT 1)
    UNION ALL
    SELECT n.queue, n.run_at
    FROM head AS h
    CROSS JOIN LATERAL (
        SELECT queue, run_at
        FROM pgqueue_job
        WHERE status = 'pending' AND queue > h.queue
        ORDER BY queue, run_at
        LIMIT 1) AS n
)"""

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


JOB_COUNT_ENDED = """
-- name: JOB_COUNT_ENDED
-- Dead and cancelled jobs for the admin's summary, each counted up to cap through its
-- small partial index (pgqueue_job_dead_idx, pgqueue_job_cancelled_idx).
SELECT (SELECT count(*)
        FROM (SELECT 1 FROM pgqueue_job WHERE status = 'dead' LIMIT %(cap)s) AS d) AS dead,
       (SELECT count(*)
        FROM (SELECT 1 FROM pgqueue_job WHERE status = 'cancelled' LIMIT %(cap)s) AS c)
           AS cancelled
"""


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
-- Status figures per queue but pending (JOB_GET_QUEUE_BACKLOG counts it per queue), at
-- most cap rows of each status from its own partial index.
WITH sample AS (
    (SELECT 'scheduled'::text AS status, queue
     FROM pgqueue_job
     WHERE status = 'scheduled'
     LIMIT %(cap)s)
    UNION ALL
    (SELECT 'running'::text, queue
     FROM pgqueue_job
     WHERE status = 'running'
     LIMIT %(cap)s)
    UNION ALL
    (SELECT 'dead'::text, queue
     FROM pgqueue_job
     WHERE status = 'dead'
     LIMIT %(cap)s)
    UNION ALL
    (SELECT 'waiting'::text, queue
     FROM pgqueue_job
     WHERE status = 'waiting'
     LIMIT %(cap)s)
)
SELECT status, queue, count(*) AS jobs
FROM sample
GROUP BY status, queue
ORDER BY status, queue
"""


JOB_COUNT_TAG = """
-- name: JOB_COUNT_TAG
-- The jobs carrying one tag, by status and queue (pgqueue_status --tag): read through
-- pgqueue_job_tags_search_idx, at most cap of them, so a tag on millions of jobs is
-- bounded.
SELECT status, queue, count(*) AS jobs
FROM (SELECT status, queue
      FROM pgqueue_job
      -- The tag index leaves running jobs out (a claim adds no entry to it): they are
      -- asked apart, through pgqueue_job_lease_idx. Each arm of the OR implies one
      -- index's predicate, and the planner ORs the two in a bitmap.
      WHERE (tags @> ARRAY[%(tag)s]::text[] AND NOT status = 'running')
         OR (tags @> ARRAY[%(tag)s]::text[] AND status = 'running')
      LIMIT %(cap)s) AS tagged
GROUP BY status, queue
ORDER BY queue, status
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


JOB_GET_COMMON_TAGS = """
-- name: JOB_GET_COMMON_TAGS
-- Tags for the admin's filter: the planner's most common elements of the tags column
-- (no scan), or, on a small table (small), every tag in use.
SELECT tag
FROM (SELECT unnest(st.most_common_elems::text::text[]) AS tag
      FROM pg_stats AS st
      WHERE st.tablename = 'pgqueue_job' AND st.attname = 'tags' AND NOT st.inherited
        AND st.schemaname = current_schema()
        AND NOT %(small)s
      UNION
      SELECT DISTINCT unnest(tags)
      FROM pgqueue_job
      WHERE %(small)s AND tags <> '{}') AS found
ORDER BY tag
LIMIT %(limit)s
"""


JOB_GET_HEALTH = (
    """
-- name: JOB_GET_HEALTH
-- The longest wait of a pending job (each queue's oldest: a loose scan of
-- pgqueue_job_pending_age_idx) and the count of expired leases, capped.
"""
    + _PENDING_HEADS
    + """, clock AS (
    SELECT coalesce(%(now)s::timestamptz, clock_timestamp()) AS now
)
SELECT greatest(clock.now - (SELECT min(run_at)
                             FROM (SELECT run_at FROM head LIMIT %(queues)s) AS h),
                interval '0') AS oldest_pending_wait,
       (SELECT count(*)
        FROM (SELECT 1
              FROM pgqueue_job
              WHERE status = 'running'
                AND lease_expires_at < clock.now
              ORDER BY lease_expires_at
              LIMIT %(cap)s) AS expired) AS expired_leases
FROM clock
"""
)


JOB_GET_HISTORY = """
-- name: JOB_GET_HISTORY
-- The dashboard's per-minute history: done jobs a minute counted up to count_cap and
-- their wait from the first cap (pgqueue_job_done_idx), and the newest cap dead
-- letters (a minute they may not cover whole is marked dead_capped).
WITH clock AS (
    SELECT date_trunc('minute', coalesce(%(now)s::timestamptz, clock_timestamp())) AS minute
), minutes AS (
    SELECT clock.minute - make_interval(mins => n) AS start
    FROM clock, generate_series(0, %(minutes)s - 1) AS n
), dead_sample AS (
    SELECT finished_at
    FROM pgqueue_job
    WHERE status = 'dead'
    ORDER BY id DESC
    LIMIT %(cap)s
), dead AS (
    SELECT date_trunc('minute', d.finished_at) AS start, count(*) AS jobs
    FROM dead_sample AS d, clock
    WHERE d.finished_at >= clock.minute - make_interval(mins => %(minutes)s - 1)
    GROUP BY 1
)
SELECT m.start, counted.jobs, done.wait_avg, done.wait_max,
       coalesce(dead.jobs, 0) AS dead,
       (SELECT count(*) >= %(cap)s AND m.start <= min(finished_at)
        FROM dead_sample) AS dead_capped
FROM minutes AS m
CROSS JOIN LATERAL (
    SELECT count(*) AS jobs
    FROM (SELECT 1
          FROM pgqueue_job
          WHERE status = 'done'
            AND finished_at >= m.start
            AND finished_at < m.start + interval '1 minute'
          LIMIT %(count_cap)s) AS c
) AS counted
CROSS JOIN LATERAL (
    SELECT avg(date_part('epoch', s.last_attempted_at - s.run_at)) AS wait_avg,
           max(date_part('epoch', s.last_attempted_at - s.run_at)) AS wait_max
    FROM (SELECT last_attempted_at, run_at
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


JOB_GET_LIVE_VALUES = """
-- name: JOB_GET_LIVE_VALUES
-- The queues and tasks that hold live jobs, for the admin's filters: every queue with
-- pending jobs (a loose scan), the tasks of its first per_queue, and of cap jobs of
-- each other live status.
WITH RECURSIVE head(queue) AS (
    (SELECT queue
     FROM pgqueue_job
     WHERE status = 'pending'
     ORDER BY queue
     LIMIT 1)
    UNION ALL
    SELECT n.queue
    FROM head AS h
    CROSS JOIN LATERAL (
        SELECT queue
        FROM pgqueue_job
        WHERE status = 'pending' AND queue > h.queue
        ORDER BY queue
        LIMIT 1) AS n
), live AS (
    SELECT p.queue, p.task
    FROM (SELECT queue FROM head LIMIT %(queues)s) AS h
    CROSS JOIN LATERAL (
        SELECT queue, task
        FROM pgqueue_job
        WHERE status = 'pending' AND queue = h.queue
        LIMIT %(per_queue)s) AS p
    UNION ALL
    (SELECT queue, task
     FROM pgqueue_job
     WHERE status = 'scheduled'
     LIMIT %(cap)s)
    UNION ALL
    (SELECT queue, task
     FROM pgqueue_job
     WHERE status = 'running'
     LIMIT %(cap)s)
    UNION ALL
    (SELECT queue, task
     FROM pgqueue_job
     WHERE status = 'waiting'
     LIMIT %(cap)s)
)
SELECT DISTINCT queue, task
FROM live
"""


JOB_GET_QUEUE_BACKLOG = (
    """
-- name: JOB_GET_QUEUE_BACKLOG
-- Each queue with pending jobs, its oldest run_at and its pending count up to cap: a
-- loose scan of pgqueue_job_pending_age_idx, one seek and one capped range per queue.
"""
    + _PENDING_HEADS
    + """
SELECT h.queue, h.run_at,
       (SELECT count(*)
        FROM (SELECT 1
              FROM pgqueue_job
              WHERE status = 'pending' AND queue = h.queue
              LIMIT %(cap)s) AS x) AS jobs
FROM head AS h
LIMIT %(queues)s
"""
)


JOB_GET_RUNNING = """
-- name: JOB_GET_RUNNING
-- The running jobs with their progress and durable steps (how many, the last), soonest
-- lease expiry first: a bounded range of pgqueue_job_lease_idx.
SELECT j.id, j.queue, j.task, j.lease_owner, j.attempts, j.last_attempted_at, j.progress,
       s.count, s.kind, s.name, s.finished_at
FROM (SELECT id, queue, task, lease_owner, attempts, last_attempted_at, progress,
             lease_expires_at
      FROM pgqueue_job
      WHERE status = 'running'
      ORDER BY lease_expires_at
      LIMIT %(limit)s) AS j
LEFT JOIN LATERAL (
    SELECT count(*) OVER () AS count, kind, name, finished_at
    FROM pgqueue_step
    WHERE job_id = j.id
    ORDER BY id DESC
    LIMIT 1
) AS s ON true
ORDER BY j.lease_expires_at
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
