"""Claims under flow control (limits, paused and fair queues), the function that counts
what limited budgets use, and the run-time limits and pauses. Run by
``django_pgqueue.flow`` only.
"""

from __future__ import annotations

from .common import CLOCK, LEASE_CANDIDATES, RESUME_RANGES

# The limits in force, as the worker passes them (flow.FlowView.params: one jsonb text,
# cheaper to send than an array per field): key limits (an exact key, or a prefix whose
# every matching key is a budget of its own) and queue limits. NULL: no bound.
FLOW_LIMITS = """key_limit AS (
    SELECT *
    FROM jsonb_to_recordset(%(limits)s::jsonb -> 'keys')
         AS l(name text, pattern text, prefix boolean, concurrency int, rate int, period float8)
), queue_limit AS (
    SELECT *
    FROM jsonb_to_recordset(%(limits)s::jsonb -> 'queues')
         AS l(queue text, concurrency int, rate int, period float8)
)"""


# A key limit l applies to concurrency key {key} ("" is no key: no limit applies).
KEY_MATCHES = """{key} > ''
      AND CASE WHEN l.prefix THEN starts_with({key}, l.pattern) ELSE {key} = l.pattern END"""


# How many more jobs of concurrency key {key} may start now (NULL: no limit applies):
# the least room of its limits, each the concurrency bound less what runs with the key
# (a range of pgqueue_job_running_key_idx, said as its predicate says it: see
# FLOW_USAGE_FUNCTION) and the rate less its window's starts.
_KEY_ROOM = (
    """(SELECT min(least(
            l.concurrency - CASE WHEN l.concurrency IS NOT NULL THEN (
                SELECT count(*)
                FROM pgqueue_job AS r
                WHERE (r.status = 'running') IS TRUE AND r.concurrency_key > ''
                  AND r.concurrency_key = {key}) END,
            l.rate - CASE WHEN l.rate IS NOT NULL THEN (
                SELECT count(*)
                FROM pgqueue_rate AS rw, unnest(rw.starts) AS s(at)
                WHERE rw.name = l.name AND rw.subject = {key}
                  AND s.at > (SELECT now FROM clock) - make_interval(secs => l.period)) END))
     FROM key_limit AS l
     WHERE """
    + KEY_MATCHES
    + ")"
)


# The same for the queue {queue} under its queue:NAME limit. What runs in a queue is
# counted over pgqueue_job_lease_idx (every running job: as many as the fleet runs).
_QUEUE_ROOM = """(SELECT least(
            l.concurrency - CASE WHEN l.concurrency IS NOT NULL THEN (
                SELECT count(*)
                FROM pgqueue_job AS r
                WHERE r.status = 'running' AND r.queue = {queue}) END,
            l.rate - CASE WHEN l.rate IS NOT NULL THEN (
                SELECT count(*)
                FROM pgqueue_rate AS rw, unnest(rw.starts) AS s(at)
                WHERE rw.name = 'queue:' || l.queue AND rw.subject = l.queue
                  AND s.at > (SELECT now FROM clock) - make_interval(secs => l.period)) END)
     FROM queue_limit AS l
     WHERE l.queue = {queue})"""


# Whether this claim holds every budget of a job of key {key} in queue {queue}: for each
# limited key or queue, a transaction-level advisory lock taken if free (never waited
# for; taken again, it is held again). Until commit, no other claim can lease a job of
# that budget (the limited claims). In CASEs, so an unlimited one takes no lock.
_BUDGETS_HELD = (
    """(CASE WHEN EXISTS (SELECT FROM key_limit AS l WHERE """
    + KEY_MATCHES
    + """)
          THEN pg_try_advisory_xact_lock(hashtext('django_pgqueue key'), hashtext({key}))
          ELSE true END
     AND CASE WHEN {queue} = ANY (%(queue_names)s::text[])
          THEN pg_try_advisory_xact_lock(hashtext('django_pgqueue queue'), hashtext({queue}))
          ELSE true END)"""
)


# Queue {queue} may be claimed from: not paused, and its queue limit (if any) has room.
_QUEUE_OPEN = (
    """NOT {queue} = ANY (%(paused)s::text[])
      AND (NOT {queue} = ANY (%(queue_names)s::text[])
           OR coalesce("""
    + _QUEUE_ROOM
    + """, 1) > 0)"""
)


# The head of the line of a flow claim, as the CTE "head" (id, ctid, queue, priority,
# key, ord, key_rank): the first %(window)s pending jobs in claim order (pgqueue_job_claim_idx, or
# each queue's range of pgqueue_job_queue_claim_idx) of the served queues that are not
# fair, paused or at their queue limit (by this snapshot), each with its place in the
# line (ord) and among its key's (key_rank). {everyone}: the jobs of a worker of every
# queue (the CTEs of _HEAD_EVERYONE or _HEAD_EVERYONE_LOCKED); {lock}: nothing (the
# caller locks what it picks), or the locking clause of a worker of some queues.
_FLOW_HEAD_OF = (
    """head AS (
    SELECT h.id, h.ctid, h.queue, h.priority, h.concurrency_key AS key, h.ord,
           row_number() OVER (PARTITION BY h.concurrency_key ORDER BY h.ord) AS key_rank
    FROM (SELECT a.*, row_number() OVER (ORDER BY a.priority DESC, a.id) AS ord
          FROM ({everyone}
                UNION ALL
                (SELECT c.id, c.ctid, c.queue, c.priority, c.concurrency_key
                 FROM unnest(%(queues)s::text[]) AS s(name)
                 CROSS JOIN LATERAL (
                     SELECT id, ctid, queue, priority, concurrency_key
                     FROM pgqueue_job
                     WHERE status = 'pending' AND queue = s.name
                     ORDER BY priority DESC, id
                     LIMIT %(window)s{lock}) AS c
                 WHERE %(queues)s::text[] IS NOT NULL
                   AND NOT s.name = ANY (%(fair)s::text[]))
                ORDER BY 4 DESC, 1
                LIMIT %(window)s) AS a
          WHERE NOT a.queue = ANY (%(fair)s::text[])
            AND """
    + _QUEUE_OPEN.format(queue="a.queue")
    + """) AS h
)"""
)


# The pending jobs of a worker of every queue at the head of the line (the first
# %(window)s, by pgqueue_job_claim_idx).
_HEAD_EVERYONE = """(SELECT id, ctid, queue, priority, concurrency_key
                 FROM pgqueue_job
                 WHERE status = 'pending' AND %(queues)s::text[] IS NULL
                 ORDER BY priority DESC, id
                 LIMIT %(window)s)"""


# One range of _HEAD_EVERYONE_LOCKED (RESUME_RANGES, the position inclusive).
_HEAD_RANGE = """(SELECT *
                 FROM (SELECT id, ctid, queue, priority, concurrency_key
                       FROM pgqueue_job
                       WHERE status = 'pending' AND %(queues)s::text[] IS NULL AND {range}
                       ORDER BY priority DESC, id
                       LIMIT %(window)s
                       FOR UPDATE SKIP LOCKED) AS {name})"""


# The same, locked, from the worker's position (%(after_priority)s, %(after_id)s: the
# first job the previous claim from the head did not lease; manager.QUEUE_HEAD: the
# head): the three RESUME_RANGES of pgqueue_job_claim_idx, each lazily, so a claim
# does not step over the index entries of every job claimed since the last vacuum
# (dead, but read: as many pages a claim as the drain has claimed).
_HEAD_EVERYONE_LOCKED = "\n                UNION ALL\n                ".join(
    _HEAD_RANGE.format(
        name=name,
        range=where.replace("id > {i}", "id >= {i}").format(
            p="%(after_priority)s", i="%(after_id)s"
        ),
    )
    for name, where in RESUME_RANGES
)


_FLOW_HEAD = _FLOW_HEAD_OF.format(everyone=_HEAD_EVERYONE, lock="")


# The head a claim from the head of the line reads: locked as it is read (SKIP LOCKED,
# as a plain claim): the first jobs no other claim has locked, so racing claims take
# turns down the line instead of fighting over the same rows and their budgets.
_FLOW_HEAD_LOCKED = _FLOW_HEAD_OF.format(
    everyone=_HEAD_EVERYONE_LOCKED, lock="\n                     FOR UPDATE SKIP LOCKED"
)


# The candidates of a flow claim, as the CTE "candidate" (id, queue, key, lap, step) of
# at most %(limit)s pending jobs, locked, in the order they should run:
#
# * "served": the queues claimed from: the worker's, or (NULL) every queue with pending
#   jobs (a loose scan of pgqueue_job_queue_claim_idx, a seek per queue), less paused
#   ones and those whose queue limit has no room.
# * "head": the first %(window)s pending jobs in claim order (pgqueue_job_claim_idx, or
#   each queue's range of pgqueue_job_queue_claim_idx), of served queues that are not
#   fair, less those whose key has no room or whose budgets another claim holds
#   (_BUDGETS_HELD, which takes them for this one): FIFO while the head can run.
#   They are locked by their ctid, read in this very snapshot (so no version of theirs
#   can be pruned meanwhile; one a claimer changed since is rechecked, and skipped).
# * "walk": the groups (queue, priority, key) of pending jobs, by seeks of
#   pgqueue_job_key_claim_idx, priority by priority, each priority's keys from the
#   worker's cursor (the key it took last) round to it again: at most %(max_steps)s
#   groups per queue. A full key is a step, never a walk of its backlog.
# * "lap1": each group's first jobs (one in a fair queue, else as many as its key has
#   room for, less what the head took), if this claim holds its budgets; "lap2": fair
#   queues' groups again, for the rest of their room.
#
# All lazy: the walk goes only as far as the head leaves the claim short. Rooms are read
# from this statement's snapshot, so they only prune: JOB_CLAIM_LIMITED decides, with
# what pgqueue_flow_usage reads after the locks.
_FLOW_CANDIDATES = (
    """RECURSIVE """
    + CLOCK
    + """, """
    + FLOW_LIMITS
    + """, pending_queue(name, steps) AS (
    SELECT min(queue), 1
    FROM pgqueue_job
    WHERE status = 'pending' AND %(queues)s::text[] IS NULL
    UNION ALL
    SELECT (SELECT min(j.queue)
            FROM pgqueue_job AS j
            WHERE j.status = 'pending' AND j.queue > p.name), p.steps + 1
    FROM pending_queue AS p
    WHERE p.name IS NOT NULL AND p.steps < 10000
), served AS (
    SELECT q.name, q.name = ANY (%(fair)s::text[]) AS fair, coalesce(c.key, '') AS cursor
    FROM (SELECT name FROM pending_queue WHERE name IS NOT NULL
          UNION ALL
          SELECT unnest(%(queues)s::text[])) AS q(name)
    LEFT JOIN jsonb_each_text(%(cursors)s::jsonb) AS c(queue, key) ON c.queue = q.name
    WHERE """
    + _QUEUE_OPEN.format(queue="q.name")
    + """
), """
    + _FLOW_HEAD
    + """, head_locked AS (
    SELECT id, queue, concurrency_key AS key, priority
    FROM pgqueue_job
    WHERE ctid = ANY (ARRAY(
            SELECT h.ctid
            FROM (SELECT * FROM head ORDER BY ord OFFSET 0) AS h
            WHERE CASE WHEN h.key_rank <= coalesce("""
    + _KEY_ROOM.format(key="h.key")
    + """, %(limit)s)
                       THEN """
    + _BUDGETS_HELD.format(key="h.key", queue="h.queue")
    + """
                       ELSE false END
            LIMIT %(limit)s))
      AND status = 'pending'
    FOR UPDATE SKIP LOCKED
), walk(queue, priority, key, lap, cursor, fair, steps) AS (
    SELECT s.name, 101, NULL::text, 1, s.cursor, s.fair, 0
    FROM served AS s
    UNION ALL
    SELECT w.queue, n.priority, n.key, n.lap, w.cursor, w.fair, w.steps + 1
    FROM walk AS w
    CROSS JOIN LATERAL (
        (SELECT j.priority, j.concurrency_key AS key, w.lap AS lap
         FROM pgqueue_job AS j
         WHERE w.key IS NOT NULL
           AND j.status = 'pending' AND j.queue = w.queue AND j.priority = w.priority
           AND j.concurrency_key > w.key
           AND (w.lap = 0 OR j.concurrency_key <= w.cursor)
         ORDER BY j.concurrency_key
         LIMIT 1)
        UNION ALL
        (SELECT j.priority, j.concurrency_key, 1
         FROM pgqueue_job AS j
         WHERE w.lap = 0
           AND j.status = 'pending' AND j.queue = w.queue AND j.priority = w.priority
           AND j.concurrency_key <= w.cursor
         ORDER BY j.concurrency_key
         LIMIT 1)
        UNION ALL
        (SELECT level.priority, first.key, first.lap
         FROM (SELECT j.priority
               FROM pgqueue_job AS j
               WHERE j.status = 'pending' AND j.queue = w.queue AND j.priority < w.priority
               ORDER BY j.priority DESC
               LIMIT 1) AS level
         CROSS JOIN LATERAL (
             (SELECT j.concurrency_key AS key, 0 AS lap
              FROM pgqueue_job AS j
              WHERE j.status = 'pending' AND j.queue = w.queue
                AND j.priority = level.priority AND j.concurrency_key > w.cursor
              ORDER BY j.concurrency_key
              LIMIT 1)
             UNION ALL
             (SELECT j.concurrency_key, 1
              FROM pgqueue_job AS j
              WHERE j.status = 'pending' AND j.queue = w.queue
                AND j.priority = level.priority
              ORDER BY j.concurrency_key
              LIMIT 1)
             LIMIT 1) AS first)
        LIMIT 1) AS n
    WHERE w.steps < %(max_steps)s
), lap1 AS (
    SELECT c.id, w.queue, w.key, w.steps
    FROM walk AS w
    CROSS JOIN LATERAL (
        SELECT j.id
        FROM pgqueue_job AS j
        WHERE j.status = 'pending' AND j.queue = w.queue AND j.priority = w.priority
          AND j.concurrency_key = w.key
          AND j.id <> ALL (ARRAY(SELECT id FROM head_locked))
          AND """
    + _BUDGETS_HELD.format(key="w.key", queue="w.queue")
    + """
        ORDER BY j.id
        LIMIT greatest(0, least(coalesce("""
    + _KEY_ROOM.format(key="w.key")
    + """ - (SELECT count(*) FROM head_locked AS h WHERE h.key = w.key), %(limit)s),
                                CASE WHEN w.fair THEN 1 ELSE %(limit)s END))
        FOR UPDATE SKIP LOCKED) AS c
    WHERE w.steps > 0
), lap2 AS (
    SELECT c.id, w.queue, w.key, w.steps
    FROM walk AS w
    CROSS JOIN LATERAL (
        SELECT j.id
        FROM pgqueue_job AS j
        WHERE j.status = 'pending' AND j.queue = w.queue AND j.priority = w.priority
          AND j.concurrency_key = w.key
          AND """
    + _BUDGETS_HELD.format(key="w.key", queue="w.queue")
    + """
        ORDER BY j.id
        OFFSET 1
        LIMIT greatest(0, least(coalesce("""
    + _KEY_ROOM.format(key="w.key")
    + """, %(limit)s), %(limit)s) - 1)
        FOR UPDATE SKIP LOCKED) AS c
    WHERE w.steps > 0 AND w.fair
), candidate AS (
    (SELECT h.id, h.queue, h.key, 0 AS lap, 0 AS step
     FROM head_locked AS h
     ORDER BY h.priority DESC, h.id)
    UNION ALL
    (SELECT id, queue, key, 1, steps FROM lap1)
    UNION ALL
    (SELECT id, queue, key, 2, steps FROM lap2)
    LIMIT %(limit)s
)"""
)


# What the budgets of the keys of {keys} and the queues of {queues} (relations of
# distinct key, queue) use, read once their locks are held, as the CTEs rate_budget
# (each rate budget among them: the limit's name, the subject, the period) and usage
# (pgqueue_flow_usage's rows). Its arguments are read from the relations whole, so
# PostgreSQL takes every lock they need before it calls the function.
_BUDGET_USAGE = (
    """rate_budget AS MATERIALIZED (
    SELECT l.name, k.key AS subject, l.period
    FROM {keys} AS k
    JOIN key_limit AS l ON l.rate IS NOT NULL AND """
    + KEY_MATCHES.format(key="k.key")
    + """
    UNION ALL
    SELECT 'queue:' || l.queue, l.queue, l.period
    FROM {queues} AS q
    JOIN queue_limit AS l ON l.rate IS NOT NULL AND l.queue = q.queue
), usage AS MATERIALIZED (
    SELECT *
    FROM pgqueue_flow_usage(
        ARRAY(SELECT k.key
              FROM {keys} AS k
              WHERE EXISTS (SELECT FROM key_limit AS l
                            WHERE l.concurrency IS NOT NULL AND """
    + KEY_MATCHES.format(key="k.key")
    + """)),
        ARRAY(SELECT q.queue
              FROM {queues} AS q
              JOIN queue_limit AS l ON l.concurrency IS NOT NULL AND l.queue = q.queue),
        ARRAY(SELECT name FROM rate_budget ORDER BY name, subject),
        ARRAY(SELECT subject FROM rate_budget ORDER BY name, subject))
)"""
)


# The rooms of a limited claim's budgets, from what pgqueue_flow_usage read (the CTE
# "usage") after their locks were taken, as the CTEs key_room (key, room) for the keys
# of {keys} with a key limit, and queue_room (queue, room) for the queues of {queues}
# with a queue limit: how many more of their jobs may start now, the least room of
# their limits (concurrency less what runs, rate less its window's starts). A budget
# missing from "usage" (its lock was not taken) has no room.
_HELD_ROOMS = (
    """key_room AS MATERIALIZED (
    SELECT k.key, min(least(
               l.concurrency - coalesce(u.running, 0),
               l.rate - CASE WHEN l.rate IS NOT NULL THEN (
                   SELECT count(*)
                   FROM unnest(w.starts) AS s(at)
                   WHERE true
                     AND s.at > (SELECT now FROM clock) - make_interval(secs => l.period)) END))
               AS room
    FROM (SELECT DISTINCT key FROM {keys}) AS k
    JOIN key_limit AS l ON """
    + KEY_MATCHES.format(key="k.key")
    + """
    LEFT JOIN usage AS u ON u.budget_kind = 'key' AND u.budget_subject = k.key
    LEFT JOIN usage AS w
           ON w.budget_kind = 'rate' AND w.budget_name = l.name AND w.budget_subject = k.key
    GROUP BY k.key
), queue_room AS MATERIALIZED (
    SELECT l.queue, least(
               l.concurrency - coalesce(u.running, 0),
               l.rate - CASE WHEN l.rate IS NOT NULL THEN (
                   SELECT count(*)
                   FROM unnest(w.starts) AS s(at)
                   WHERE true
                     AND s.at > (SELECT now FROM clock) - make_interval(secs => l.period)) END)
               AS room
    FROM queue_limit AS l
    LEFT JOIN usage AS u ON u.budget_kind = 'queue' AND u.budget_subject = l.queue
    LEFT JOIN usage AS w ON w.budget_kind = 'rate' AND w.budget_name = 'queue:' || l.queue
                        AND w.budget_subject = l.queue
    WHERE l.queue IN (SELECT queue FROM {queues})
)"""
)


# Each rate budget's window written with the starts of the chosen jobs (the CTE
# "chosen": id, queue, key), as the CTEs started and logged: the window's starts from
# "usage" still in its period (read under the budget's lock, so none is lost), then one
# clock.now per job. In (name, subject) order, the order every claim writes in.
_RATE_LOGGED = (
    """started AS (
    SELECT l.name, c.key AS subject, l.period, count(*) AS jobs
    FROM chosen AS c
    JOIN key_limit AS l ON l.rate IS NOT NULL AND """
    + KEY_MATCHES.format(key="c.key")
    + """
    GROUP BY l.name, c.key, l.period
    UNION ALL
    SELECT 'queue:' || c.queue, c.queue, l.period, count(*)
    FROM chosen AS c
    JOIN queue_limit AS l ON l.rate IS NOT NULL AND l.queue = c.queue
    GROUP BY c.queue, l.period
), logged AS (
    INSERT INTO pgqueue_rate AS w (name, subject, starts, expires_at)
    SELECT b.name, b.subject,
           coalesce((SELECT array_agg(s.at ORDER BY s.at)
                     FROM usage AS u, unnest(u.starts) AS s(at)
                     WHERE u.budget_kind = 'rate' AND u.budget_name = b.name
                       AND u.budget_subject = b.subject
                       AND s.at > clock.now - make_interval(secs => b.period)),
                    ARRAY[]::timestamptz[])
               || array_fill(clock.now, ARRAY[b.jobs::int]),
           clock.now + make_interval(secs => b.period)
    FROM started AS b, clock
    ORDER BY b.name, b.subject
    ON CONFLICT (name, subject) DO UPDATE
    SET starts = excluded.starts, expires_at = excluded.expires_at
)"""
)


# The limited keys of a head of the line (_FLOW_HEAD), as the CTEs head_key (key,
# limited: whether a key limit applies) and held_key: each limited key whose budget
# lock this claim took (if free: never waited for; one another claim holds is passed
# over like a full key).
_HEAD_KEYS_HELD = (
    """head_key AS MATERIALIZED (
    SELECT k.key, EXISTS (SELECT FROM key_limit AS l WHERE """
    + KEY_MATCHES.format(key="k.key")
    + """) AS limited
    FROM (SELECT DISTINCT key FROM head) AS k
), held_key AS MATERIALIZED (
    SELECT k.key
    FROM head_key AS k
    WHERE CASE WHEN k.limited
               THEN pg_try_advisory_xact_lock(hashtext('django_pgqueue key'), hashtext(k.key))
               ELSE false END
)"""
)


# The rows of the CTE "fits" of a claim from the head of the line (its head locked by
# _FLOW_HEAD_LOCKED, so no other claim can have taken them): the CTE "chosen" (id,
# queue, key).
_HEAD_CHOSEN = """chosen AS MATERIALIZED (
    SELECT f.id, f.queue, f.key
    FROM fits AS f
)"""


# The end of a claim from the head of the line: the jobs of "chosen" leased; the
# result: the leased jobs (flow_lap 0), and a row of NULLs whose flow_head is how many
# pending jobs the head held, flow_kept how many of them their budgets had no room for
# (the CTE "kept_back"; not those whose budget another claim held: that claim is
# taking them), and flow_resume_* the first of them not leased, where the worker's next
# claim from the head starts (NULL: every one was leased).
_HEAD_LEASED = (
    """leased AS ("""
    + LEASE_CANDIDATES.replace("FROM candidate", "FROM chosen")
    + """), resume AS (
    SELECT h.priority, h.id
    FROM head AS h
    WHERE NOT EXISTS (SELECT FROM chosen AS c WHERE c.id = h.id)
    ORDER BY h.ord
    LIMIT 1
)
SELECT l.*, 0 AS flow_lap, NULL::text AS flow_queue, NULL::text AS flow_key,
       NULL::bigint AS flow_head, NULL::bigint AS flow_kept,
       NULL::int AS flow_resume_priority, NULL::bigint AS flow_resume_id
FROM leased AS l
UNION ALL
SELECT (NULL::pgqueue_job).*, NULL, NULL, NULL, (SELECT count(*) FROM head),
       (SELECT count(*) FROM kept_back), (SELECT priority FROM resume),
       (SELECT id FROM resume)
"""
)


# The start of a claim from the head of the line: the clock, the limits in force, the
# head (_FLOW_HEAD_LOCKED) and its limited keys held (_HEAD_KEYS_HELD).
_HEAD_START = (
    "\nWITH " + CLOCK + ", " + FLOW_LIMITS + ", " + _FLOW_HEAD_LOCKED + ", " + _HEAD_KEYS_HELD
)


# The head's jobs whose key has room for them, or to which no key limit applies (from
# the CTEs head, head_key and key_room): the FROM and WHERE of a SELECT of h.
_HEAD_KEY_FITS = """
    FROM head AS h
    JOIN head_key AS hk ON hk.key = h.key
    LEFT JOIN key_room AS k ON k.key = h.key
    WHERE NOT hk.limited OR h.key_rank <= k.room"""


# The head's jobs whose key had no room for them (part of the CTE kept_back).
_HEAD_KEPT_BY_KEY = """SELECT h.id
    FROM head AS h
    JOIN key_room AS k ON k.key = h.key
    WHERE h.key_rank > k.room"""


# A fresh look at what the budgets of a limited claim have used: the jobs running with
# each of %(keys)s and in each of %(queues)s, and the rate windows (pgqueue_rate rows) of
# the (name, subject) pairs given. A function, and VOLATILE, for one reason: PostgreSQL
# gives each query of a volatile function a snapshot of its own, taken when the query
# starts. JOB_CLAIM_LIMITED calls it once it holds its budgets' locks, so it sees every
# claim of those budgets committed before (the statement's own snapshot, taken at its
# start, may miss one that committed while it took the locks: the SKIP LOCKED trap),
# and none can commit before ours. PL/pgSQL, so its plan is kept for the session; one
# query, so the counts are of one instant.
#
# Its plan is made once per session, so it must not depend on the statistics of the
# moment: each key is counted by an index-only probe of pgqueue_job_running_key_idx,
# whose predicate, "(status = 'running') IS TRUE", is the one way the query can say
# "running" and still use an index (pgqueue_job_lease_idx, on status = 'running', is not
# proved to hold those rows). Counted with "status = 'running'", a session whose plan
# was made while the statistics saw no running job could price both indexes alike and
# take pgqueue_job_lease_idx: every running job of the fleet read for each key of every
# claim (seen: one of two workers of a drain at 2.8 ms a call instead of 0.26 ms, its
# claims twice as slow). The SET clauses hold for the function's own queries only: no
# sequential or bitmap scan for a plan made while the table is small, and no JIT.
# Installed by migrations 0018 and 0019 (copies, as migrations are frozen;
# tests/test_sql.py checks that the database's is this one).
FLOW_USAGE_FUNCTION = """
-- name: FLOW_USAGE_FUNCTION
-- What a limited claim's budgets use, counted in a snapshot of the function's own
-- (VOLATILE), taken after the claim holds the budgets' locks. Installed by migrations
-- 0018 and 0019.
CREATE OR REPLACE FUNCTION pgqueue_flow_usage(
    keys text[], queues text[], rate_names text[], rate_subjects text[])
RETURNS TABLE (budget_kind text, budget_name text, budget_subject text,
               running bigint, starts timestamptz[])
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $body$
BEGIN
    RETURN QUERY
    SELECT 'key', NULL::text, k.key,
           (SELECT count(*)
            FROM pgqueue_job AS r
            WHERE (r.status = 'running') IS TRUE AND r.concurrency_key > ''
              AND r.concurrency_key = k.key),
           NULL::timestamptz[]
    FROM unnest(keys) AS k(key)
    UNION ALL
    SELECT 'queue', NULL::text, r.queue::text, count(*), NULL::timestamptz[]
    FROM pgqueue_job AS r
    WHERE cardinality(queues) > 0
      AND r.status = 'running' AND r.queue = ANY (queues)
    GROUP BY r.queue
    UNION ALL
    SELECT 'rate', w.name::text, w.subject::text, NULL::bigint, w.starts
    FROM unnest(rate_names, rate_subjects) AS b(name, subject)
    JOIN pgqueue_rate AS w ON w.name = b.name AND w.subject = b.subject;
END
$body$
"""


# JOB_CLAIM for a worker while flow control is in force without limits (queues paused,
# fair queues): the candidates of _FLOW_CANDIDATES leased at once, one statement. The
# head of the line in claim order, then the groups of pgqueue_job_key_claim_idx from
# the worker's cursor; a paused queue is left out, never walked.
JOB_CLAIM_FLOW = (
    """
-- name: JOB_CLAIM_FLOW
-- JOB_CLAIM while flow control is in force without limits (paused or fair queues): the
-- head of the line, then each queue's keys by turns from the worker's cursor.
-- moves: pending -> running
WITH """
    + _FLOW_CANDIDATES
    + LEASE_CANDIDATES
)


# JOB_CLAIM for a worker under limits, one statement: lock (SKIP LOCKED) the candidates
# of _FLOW_CANDIDATES, each only once its budgets are held (_BUDGETS_HELD: a key whose
# lock another claim holds is passed over like a full one); then read what those
# budgets use in a snapshot taken after the locks (pgqueue_flow_usage: the rooms
# _FLOW_CANDIDATES pruned with are from the statement's older snapshot); lease, in
# candidate order, each candidate whose budgets the candidates before it do not fill;
# write each rate budget's window with its new starts (clock.now). The function's
# arguments are built from every candidate, so PostgreSQL must lock them all (and take
# their budgets' locks) before it runs. Returns the leased jobs (with the lap that took
# each), then, if the claim came back short, the group the walk reached per queue (id
# NULL: the cursor), and a row of NULLs if candidates were locked but none fitted.
JOB_CLAIM_LIMITED = (
    """
-- name: JOB_CLAIM_LIMITED
-- JOB_CLAIM under limits, one statement: lock the candidates whose budgets it holds,
-- count what those budgets use after the locks (pgqueue_flow_usage), lease what fits,
-- log the rate windows.
-- moves: pending -> running
WITH """
    + _FLOW_CANDIDATES
    + """, numbered AS MATERIALIZED (
    SELECT c.*, row_number() OVER () AS ord
    FROM candidate AS c
), """
    + _BUDGET_USAGE.format(
        keys="(SELECT DISTINCT key FROM numbered)", queues="(SELECT DISTINCT queue FROM numbered)"
    )
    + ", "
    + _HELD_ROOMS.format(keys="numbered", queues="numbered")
    + """, chosen AS MATERIALIZED (
    SELECT g.id, g.queue, g.key, g.lap
    FROM (SELECT n.*,
                 row_number() OVER (PARTITION BY n.key ORDER BY n.ord) AS key_rank,
                 row_number() OVER (PARTITION BY n.queue ORDER BY n.ord) AS queue_rank
          FROM numbered AS n) AS g
    LEFT JOIN key_room AS k ON k.key = g.key
    LEFT JOIN queue_room AS q ON q.queue = g.queue
    WHERE (k.room IS NULL OR g.key_rank <= k.room)
      AND (q.room IS NULL OR g.queue_rank <= q.room)
), """
    + _RATE_LOGGED
    + """, leased AS ("""
    + LEASE_CANDIDATES.replace("FROM candidate", "FROM chosen")
    + """)
SELECT l.*, c.lap AS flow_lap, NULL::text AS flow_queue, NULL::text AS flow_key
FROM leased AS l
JOIN chosen AS c ON c.id = l.id
UNION ALL
SELECT (NULL::pgqueue_job).*, NULL, r.queue, r.key
FROM (SELECT DISTINCT ON (w.queue) w.queue, w.key
      FROM walk AS w
      WHERE w.steps > 0
      ORDER BY w.queue, w.steps DESC) AS r
WHERE (SELECT count(*) FROM numbered) < %(limit)s
UNION ALL
SELECT (NULL::pgqueue_job).*, NULL, NULL, NULL
WHERE EXISTS (SELECT FROM numbered) AND NOT EXISTS (SELECT FROM chosen)
"""
)


# JOB_CLAIM for a worker under limits while no fair queue is in force, when the head of
# the line can fill the claim (most claims): one statement with a fraction of the plan
# of JOB_CLAIM_LIMITED, whose walk over keys it leaves out (a plan of 300 nodes costs
# about half a millisecond a claim just to set up). The head (_FLOW_HEAD); the locks of
# its limited keys (_HEAD_KEYS_HELD) and of its limited queues; what those budgets use,
# read after the locks (pgqueue_flow_usage); the rows that fit, in claim order, locked
# (_HEAD_CHOSEN) and leased (_HEAD_LEASED); each rate budget's window written with its
# new starts. If the claim is short and the head was full (flow_head), the caller
# claims the rest with JOB_CLAIM_LIMITED.
JOB_CLAIM_LIMITED_HEAD = (
    """
-- name: JOB_CLAIM_LIMITED_HEAD
-- JOB_CLAIM_LIMITED from the head of the line only (no fair queue in force): a fraction
-- of its plan, for the claims the head can fill; the caller walks the keys when it
-- cannot.
-- moves: pending -> running"""
    + _HEAD_START
    + """, held_queue AS MATERIALIZED (
    SELECT q.queue
    FROM (SELECT DISTINCT queue FROM head) AS q
    WHERE CASE WHEN q.queue = ANY (%(queue_names)s::text[])
               THEN pg_try_advisory_xact_lock(hashtext('django_pgqueue queue'), hashtext(q.queue))
               ELSE false END
), """
    + _BUDGET_USAGE.format(keys="held_key", queues="held_queue")
    + ", "
    + _HELD_ROOMS.format(keys="held_key", queues="held_queue")
    + """, key_fits AS (
    SELECT h.id, h.queue, h.key, h.ord,
           row_number() OVER (PARTITION BY h.queue ORDER BY h.ord) AS queue_rank"""
    + _HEAD_KEY_FITS
    + """
), fits AS (
    SELECT f.id, f.queue, f.key
    FROM key_fits AS f
    LEFT JOIN queue_room AS q ON q.queue = f.queue
    WHERE NOT f.queue = ANY (%(queue_names)s::text[]) OR f.queue_rank <= q.room
    ORDER BY f.ord
    LIMIT %(limit)s
), kept_back AS (
    """
    + _HEAD_KEPT_BY_KEY
    + """
    UNION
    SELECT f.id
    FROM key_fits AS f
    JOIN queue_room AS q ON q.queue = f.queue
    WHERE f.queue_rank > q.room
), """
    + _HEAD_CHOSEN
    + ", "
    + _RATE_LOGGED
    + ", "
    + _HEAD_LEASED
)


JOB_CLAIM_LIMITED_HEAD_KEYS = (
    """
-- name: JOB_CLAIM_LIMITED_HEAD_KEYS
-- JOB_CLAIM_LIMITED_HEAD while only keys' concurrency bounds apply: without the rate
-- and queue CTEs, a third smaller plan.
-- moves: pending -> running"""
    + _HEAD_START
    + """, usage AS MATERIALIZED (
    SELECT *
    FROM pgqueue_flow_usage(ARRAY(SELECT key FROM held_key), ARRAY[]::text[],
                            ARRAY[]::text[], ARRAY[]::text[])
), key_room AS MATERIALIZED (
    SELECT k.key, min(l.concurrency - coalesce(u.running, 0)) AS room
    FROM held_key AS k
    JOIN key_limit AS l ON """
    + KEY_MATCHES.format(key="k.key")
    + """
    LEFT JOIN usage AS u ON u.budget_kind = 'key' AND u.budget_subject = k.key
    GROUP BY k.key
), fits AS (
    SELECT h.id, h.queue, h.key"""
    + _HEAD_KEY_FITS
    + """
    ORDER BY h.ord
    LIMIT %(limit)s
), kept_back AS (
    """
    + _HEAD_KEPT_BY_KEY
    + """
), """
    + _HEAD_CHOSEN
    + ", "
    + _HEAD_LEASED
)


SESSION_FLOW_LOCAL = """
-- name: SESSION_FLOW_LOCAL
-- A flow claim on a connection not set up for claims: no JIT for this transaction.
SELECT set_config('jit', 'off', true)
"""
