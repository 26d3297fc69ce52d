"""Every SQL statement django-pgqueue runs at run time, one named constant per query.

Rules kept by every statement here:

* Values are psycopg named parameters (``%(name)s``); nothing is built with f-strings.
* Time is the database's: ``coalesce(%(now)s::timestamptz, clock_timestamp())`` so that
  tests may pin the clock and production never trusts a worker's clock.
  ``clock_timestamp()`` rather than ``now()`` because ``now()`` is frozen at transaction
  start and may be stale after waiting on a lock.
* Every state change is one statement, so it is atomic without an explicit transaction.
* Worker writes are *fenced* on ``(id, status = 'running', lease_owner, attempts,
  last_attempted_at)``: a worker whose lease was taken back updates zero rows instead of
  overwriting a newer attempt. The claim time is part of the fence because a requeue
  resets attempts, so the same worker may claim the job again at the same attempt. It
  is compared as the session's wall-clock ``timestamp``: with ``USE_TZ = False`` Django
  hands back naive local times, which would be ambiguous as ``timestamptz`` in the
  repeated hour of a DST change.
* Multi-row maintenance uses ``FOR UPDATE SKIP LOCKED`` with a ``LIMIT`` so it never
  waits on, or deadlocks with, workers, and never runs unbounded.

The table name is hard-coded; ``tests/test_sql.py`` checks it against ``Job._meta``.
Constants are in alphabetical order.
"""

# The columns a bulk call writes for each new job, in the order its rows hold them, with
# the type each value is sent as: binary COPY applies no casts (bulk.py builds the rows).
BULK_COLUMNS = (
    ("backend", "text"),
    ("queue", "text"),
    ("task", "text"),
    ("args", "jsonb"),
    ("kwargs", "jsonb"),
    ("priority", "int4"),
    ("status", "text"),
    ("max_attempts", "int4"),
    ("run_at", "timestamptz"),
    ("created_at", "timestamptz"),
    ("errors", "jsonb"),
    ("idempotency_key", "text"),
    ("concurrency_key", "text"),
)
_BULK_COLUMN_LIST = ", ".join(name for name, _ in BULK_COLUMNS)

# The columns a workflow (chain, group) writes for each of its jobs: the bulk columns
# with the id taken from the sequence first, and the job's place in the workflow.
WORKFLOW_COLUMNS = (
    ("id", "int8"),
    *BULK_COLUMNS,
    ("parents_left", "int4"),
    ("parent_results", "text"),
    ("on_parent_failure", "text"),
    ("workflow_id", "int8"),
    ("has_dependants", "bool"),
)

# The columns a workflow writes for each of its edges (the rest keep their defaults:
# not resolved, no result, not marked for repair: the parents are as new as it).
EDGE_COLUMNS = (("job_id", "int8"), ("position", "int4"), ("parent_id", "int8"))

# --- Fragments ----------------------------------------------------------------------
# Constant SQL text joined into the statements below when this module is imported
# (text only, never a value), so that each rule of the queue is written once.

# The database's clock as a CTE; %(now)s pins it in tests.
_CLOCK = "clock AS (SELECT coalesce(%(now)s::timestamptz, clock_timestamp()) AS now)"

# A lease: lease_seconds from the database's now (claims and heartbeats).
_LEASE = "clock.now + make_interval(secs => %(lease_seconds)s)"

# The fence of every worker write: the job is running, leased to this worker, at the
# attempt and claim time the worker holds (a NULL attempt, from extend_leases given
# plain ids, fences on the owner only). "(status = 'running') IS TRUE" keeps the
# planner on the primary key instead of reading pgqueue_job_lease_idx.
_FENCE = """j.id = owned.id
  AND (j.status = 'running') IS TRUE
  AND j.lease_owner = %(worker_id)s
  AND (owned.attempt IS NULL
       OR (j.attempts = owned.attempt
           AND j.last_attempted_at::timestamp = owned.claimed_at))"""

# The one job a single-row worker write is fenced on.
_OWNED_ONE = """(VALUES (%(id)s::bigint, %(attempt)s::int, %(claimed_at)s::timestamp))
     AS owned(id, attempt, claimed_at)"""

# One entry of a job's errors list (Django's TaskError fields, plus who and when).
_ENTRY = """jsonb_build_object(
        'exception_class_path', {path},
        'traceback', {traceback},
        'worker_id', {worker_id},
        'attempt', {attempt},
        'at', clock.now)"""


def _cancelled_entry(
    why: str, worker_id: str = "j.lease_owner", attempt: str = "j.attempts"
) -> str:
    """The error entry of a job that ends cancelled; ``why`` is SQL text."""
    return _ENTRY.format(
        path="'django_pgqueue.exceptions.JobCancelled'",
        traceback="'django_pgqueue.exceptions.JobCancelled: ' || " + why,
        worker_id=worker_id,
        attempt=attempt,
    )


def _given_back(why: str) -> str:
    """The SET items that give a claimed job back unrun (released at shutdown, snoozed):
    its attempt uncharged, its lease dropped; or, if its cancellation was requested, its
    end as 'cancelled' with an entry saying ``why`` (SQL text)."""
    return (
        """attempts = j.attempts - 1,
    lease_owner = NULL,
    lease_expires_at = NULL,
    finished_at = CASE WHEN j.cancel_requested_at IS NULL THEN NULL ELSE clock.now END,
    errors = CASE WHEN j.cancel_requested_at IS NULL THEN j.errors
                  ELSE j.errors || jsonb_build_array("""
        + _cancelled_entry(why, attempt="j.attempts - 1")
        + ") END"
    )


# The newest %(keep_errors)s entries of a jsonb array of error entries.
_KEEP_NEWEST = """(
        SELECT coalesce(jsonb_agg(e.value ORDER BY e.ordinality), '[]'::jsonb)
        FROM (SELECT {entries} AS entries) AS x,
             jsonb_array_elements(x.entries) WITH ORDINALITY AS e
        WHERE e.ordinality > jsonb_array_length(x.entries) - %(keep_errors)s)"""

# A keyed enqueue's job (JOB_ENQUEUE_DEBOUNCED, JOB_ENQUEUE_UNIQUE), inserted only if its
# key row ("held") was given this statement's new id; {key} is its idempotency_key.
_KEYED_INSERT = """INSERT INTO pgqueue_job AS j (
        id, backend, queue, task, args, kwargs, priority, status, attempts, max_attempts,
        run_at, idempotency_key, errors, created_at, trace_context, concurrency_key
    )
    SELECT held.job_id, %(backend)s, %(queue)s, %(task)s, %(args)s::jsonb,
           %(kwargs)s::jsonb, %(priority)s,
           CASE WHEN clock.run_at > clock.now THEN 'scheduled' ELSE 'pending' END,
           0, %(max_attempts)s, coalesce(clock.run_at, clock.now), {key},
           '[]'::jsonb, clock.now, %(trace_context)s::jsonb, %(concurrency_key)s
    FROM held, clock
    WHERE held.fresh"""

# A debounce key's job has not started yet (k is the key row).
_WAITING = """EXISTS (SELECT FROM pgqueue_job AS w
                WHERE w.id = k.job_id AND w.status IN ('pending', 'scheduled'))"""

# _WAITING in an enqueue, whose snapshot may predate the key's job (a concurrent
# enqueue made both): a job not seen before its run time is taken as waiting.
_DEBOUNCING = (
    "("
    + _WAITING
    + """
               OR (k.expires_at > excluded.created_at
                   AND NOT EXISTS (SELECT FROM pgqueue_job AS w WHERE w.id = k.job_id)))"""
)


# What every claim does with its candidates (the CTE "candidate", beside "clock"):
# lease them to this worker and charge the attempt. They are leased by primary key
# (= ANY of their array), never joined: on a claim connection the claims are prepared
# with one generic plan, which cannot know that the LIMIT is small, and would join by
# walking the primary key from its start.
_LEASE_CANDIDATES = f"""
UPDATE pgqueue_job AS j
SET status = 'running',
    lease_owner = %(worker_id)s,
    lease_expires_at = {_LEASE},
    attempts = j.attempts + 1,
    started_at = coalesce(j.started_at, clock.now),
    last_attempted_at = clock.now
FROM clock
WHERE j.id = ANY (ARRAY(SELECT id FROM candidate))
RETURNING j.*
"""

# _LEASE_CANDIDATES after a claim's candidate CTE, with the clock.
_CLAIM_LEASE = ", " + _CLOCK + _LEASE_CANDIDATES


# The three ranges a resumed claim walks, in claim order, each lazily, from its own
# start in the claim index: higher priority than the position's, the same priority
# after its id, lower. {p} and {i}: the position's priority and id.
_RESUME_RANGES = (
    ("above", "priority > {p}"),
    ("level", "priority = {p} AND id > {i}"),
    ("below", "priority < {p}"),
)


def _resume_ranges(template: str, priority: str, job_id: str) -> str:
    """The _RESUME_RANGES as CTEs of ``template``, for a position given as SQL."""
    return ", ".join(
        template.format(name=name, range=where.format(p=priority, i=job_id))
        for name, where in _RESUME_RANGES
    )


# --- Flow control (flow.py) ------------------------------------------------------------
# The limits in force, as the worker passes them (flow.FlowView.params: one jsonb text,
# cheaper to send than an array per field): key limits (an exact key, or a prefix whose
# every matching key is a budget of its own) and queue limits. NULL: no bound.
_FLOW_LIMITS = """key_limit AS (
    SELECT *
    FROM jsonb_to_recordset(%(limits)s::jsonb -> 'keys')
         AS l(name text, pattern text, prefix boolean, concurrency int, rate int, period float8)
), queue_limit AS (
    SELECT *
    FROM jsonb_to_recordset(%(limits)s::jsonb -> 'queues')
         AS l(queue text, concurrency int, rate int, period float8)
)"""

# A key limit l applies to concurrency key {key} ("" is no key: no limit applies).
_KEY_MATCHES = """{key} > ''
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
    + _KEY_MATCHES
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
    + _KEY_MATCHES
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

# One range of _HEAD_EVERYONE_LOCKED (_RESUME_RANGES, the position inclusive).
_HEAD_RANGE = """(SELECT *
                 FROM (SELECT id, ctid, queue, priority, concurrency_key
                       FROM pgqueue_job
                       WHERE status = 'pending' AND %(queues)s::text[] IS NULL AND {range}
                       ORDER BY priority DESC, id
                       LIMIT %(window)s
                       FOR UPDATE SKIP LOCKED) AS {name})"""

# The same, locked, from the worker's position (%(after_priority)s, %(after_id)s: the
# first job the previous claim from the head did not lease; manager.QUEUE_HEAD: the
# head): the three _RESUME_RANGES of pgqueue_job_claim_idx, each lazily, so a claim
# does not step over the index entries of every job claimed since the last vacuum
# (dead, but read: as many pages a claim as the drain has claimed).
_HEAD_EVERYONE_LOCKED = "\n                UNION ALL\n                ".join(
    _HEAD_RANGE.format(
        name=name,
        range=where.replace("id > {i}", "id >= {i}").format(
            p="%(after_priority)s", i="%(after_id)s"
        ),
    )
    for name, where in _RESUME_RANGES
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
    + _CLOCK
    + """, """
    + _FLOW_LIMITS
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


# Each budget of the limits in force, for pgqueue_status, the dashboard and the metrics:
# a key limit's budgets are its exact key and every matching key that runs now (a scan
# of pgqueue_job_running_key_idx: as many as run) or started in its rate window (the
# %(subjects)s latest of pgqueue_rate); a queue limit's is its queue. For each, what runs, what its
# rate window holds, and what is pending: at most %(cap)s jobs per priority level of
# each queue (the levels found by a loose scan of pgqueue_job_queue_claim_idx), counted
# over a range of pgqueue_job_key_claim_idx. Bounded whatever the backlog.
FLOW_GET_BUDGETS = (
    """
WITH RECURSIVE """
    + _CLOCK
    + ", "
    + _FLOW_LIMITS
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
    + _KEY_MATCHES.format(key="r.key")
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

# What flow control a worker must know beyond the settings (flow.load): the limits set at
# run time and the paused queues. Both tables hold a row per limit or queue touched by
# hand: a sequential scan of each, read about once a second per worker.
FLOW_GET_STATE = """
SELECT 'limit' AS kind, key, concurrency, rate
FROM pgqueue_limit
UNION ALL
SELECT 'paused', name, NULL, NULL
FROM pgqueue_queue
WHERE paused_at IS NOT NULL
"""

# Tell workers at once that limits or paused queues changed (payload: flow.NOTIFY_PREFIX,
# no queue name); delivered when the surrounding transaction commits. No table.
FLOW_NOTIFY = """
SELECT pg_notify(%(channel)s, %(payload)s)
"""

#: The payload prefix of the NOTIFY a released dependant sends (then its queue name): no
#: queue name holds a colon. The listener makes the next claim start at the head.
RELEASE_NOTIFY_PREFIX = "release:"

#: How far down the graph one statement follows a failure (a dependant cancelled, its
#: own dependants cancelled, ...). The edges out of the last level are marked for
#: repair, and the sweeper's JOB_RESOLVE_MISSED goes on from there.
CASCADE_DEPTH = 100

# Whether any edge at all is unresolved (a workflow in flight): the head of
# pgqueue_job_dep_unresolved_idx, an ordered LIMIT 1, which no statistics turn into a
# scan of the table. Evaluated once per statement (an InitPlan).
_ANY_UNRESOLVED = """(SELECT u.parent_id
         FROM pgqueue_job_dependency AS u
         WHERE u.state IS NULL
         ORDER BY u.parent_id
         LIMIT 1) IS NOT NULL"""

# In a completion's RETURNING: whether the job j has unresolved edges, so dependants the
# statement did not resolve (see JOB_COMPLETE). One probe of the partial index per row,
# none while no edge is unresolved anywhere.
_HAS_DEPENDANTS = (
    "CASE WHEN "
    + _ANY_UNRESOLVED
    + """
            THEN EXISTS (SELECT FROM pgqueue_job_dependency AS e
                         WHERE e.parent_id = j.id AND e.state IS NULL)
            ELSE false END"""
)

# What a dependant that a resolution cancels, or one it releases, is (d: the dependant,
# c: its edges resolved by this statement, counted).
_CANCELS = "d.status = 'waiting' AND c.failed_parent IS NOT NULL AND d.on_parent_failure IS NULL"
_RELEASES = (
    "d.status = 'waiting' AND d.parents_left = c.n"
    " AND (c.failed_parent IS NULL OR d.on_parent_failure IS NOT NULL)"
)

# What the dependant d being released is given: a chain's step ("value"), its one
# parent's result, from the edge this very statement resolved (the last one); a group's
# callback ("list"), every parent's result in depends_on order: the edges this
# statement resolved (RETURNING; its own edge updates are invisible to its reads), the
# edges resolved before its snapshot, and those resolved since (by statements that
# committed while it waited for d's lock): a plain read would see those unresolved, but
# a row lock reads the newest version, and waits for none (they committed). Run once
# per released dependant, never per completion.
_PARENT_RESULTS = """CASE d.parent_results
        WHEN 'value' THEN (SELECT r.result FROM resolved AS r WHERE r.job_id = d.id LIMIT 1)
        ELSE (
            SELECT coalesce(jsonb_agg(g.result ORDER BY g.position), '[]'::jsonb)
            FROM (
                SELECT r.position, r.result FROM resolved AS r WHERE r.job_id = d.id
                UNION ALL
                SELECT x.position, x.result
                FROM pgqueue_job_dependency AS x
                WHERE x.job_id = d.id AND x.state IS NOT NULL
                UNION ALL
                SELECT y.position, y.result
                FROM (SELECT z.position, z.result
                      FROM pgqueue_job_dependency AS z
                      WHERE (z.job_id, z.position) IN (
                          SELECT w.job_id, w.position
                          FROM pgqueue_job_dependency AS w
                          WHERE w.job_id = d.id AND w.state IS NULL)
                      FOR SHARE) AS y
            ) AS g)
        END"""

# The resolution of the edges out of the jobs a statement just finished, joined into
# every statement that ends a job: the statement names them "ended" (id, status, result)
# and has a clock. Each edge is resolved once: its state takes the parent's outcome
# (and result) under "state IS NULL", which a late (zombie) write or a second resolver
# fails. Each dependant's parents_left goes down by its edges resolved here, under its
# row lock (taken in id order: no deadlock between completers), so the statement that
# resolves its last edge sees 0 and releases it: pending (or scheduled), its parents'
# results prepended to its args if it takes them; a dependant that waits (without
# on_parent_failure "run") and lost a parent to dead or cancelled is cancelled instead,
# with an entry naming that parent, and so are its own waiting dependants, down to
# CASCADE_DEPTH levels (the "doomed"). A released job wakes workers at commit. While no
# edge is unresolved anywhere (no workflow in flight), the statement's jobs are not
# looked up at all: the head of pgqueue_job_dep_unresolved_idx, empty, decides it (an
# ordered LIMIT 1, which no statistics make a scan of the table).
_RESOLVE = (
    """doomed AS (
    SELECT e.job_id AS id, 1 AS depth
    FROM ended
    JOIN pgqueue_job_dependency AS e ON e.parent_id = ended.id
    JOIN pgqueue_job AS d ON d.id = e.job_id
    WHERE ended.status <> 'done'
      AND e.state IS NULL
      AND (d.status = 'waiting') IS TRUE
      AND d.on_parent_failure IS NULL
    UNION
    SELECT e.job_id, doomed.depth + 1
    FROM doomed
    JOIN pgqueue_job_dependency AS e ON e.parent_id = doomed.id
    JOIN pgqueue_job AS d ON d.id = e.job_id
    WHERE doomed.depth < """
    + str(CASCADE_DEPTH)
    + """
      AND e.state IS NULL
      AND (d.status = 'waiting') IS TRUE
      AND d.on_parent_failure IS NULL
), doomed_once AS (
    SELECT id, min(depth) AS depth
    FROM doomed
    WHERE id NOT IN (SELECT id FROM ended)
    GROUP BY id
), finished AS (
    SELECT id, status, result FROM ended
    UNION ALL
    SELECT id, 'cancelled', NULL::jsonb FROM doomed_once WHERE depth < """
    + str(CASCADE_DEPTH)
    + """
), resolved AS (
    UPDATE pgqueue_job_dependency AS e
    SET state = f.status,
        result = CASE WHEN f.status = 'done' THEN f.result END
    FROM finished AS f
    WHERE e.parent_id = ANY (ARRAY(SELECT id FROM finished WHERE """
    + _ANY_UNRESOLVED
    + """))
      AND e.parent_id = f.id
      AND e.state IS NULL
    RETURNING e.job_id, e.position, e.parent_id, e.state, e.result
), deferred AS (
    UPDATE pgqueue_job_dependency AS e
    SET repair = true
    FROM doomed_once AS x
    WHERE x.depth = """
    + str(CASCADE_DEPTH)
    + """
      AND e.parent_id = x.id
      AND e.state IS NULL
    RETURNING e.job_id
), counted AS (
    SELECT job_id, count(*)::int AS n,
           min(parent_id) FILTER (WHERE state <> 'done') AS failed_parent,
           (array_agg(state ORDER BY parent_id) FILTER (WHERE state <> 'done'))[1]
               AS failed_state
    FROM resolved
    GROUP BY job_id
), lock_order AS MATERIALIZED (
    SELECT d.id
    FROM pgqueue_job AS d
    WHERE d.id IN (SELECT job_id FROM counted)
    ORDER BY d.id
    FOR NO KEY UPDATE
), dependant AS (
    UPDATE pgqueue_job AS d
    SET parents_left = d.parents_left - c.n,
        status = CASE WHEN """
    + _CANCELS
    + """ THEN 'cancelled'
                      WHEN """
    + _RELEASES
    + """
                      THEN CASE WHEN d.run_at > clock.now THEN 'scheduled' ELSE 'pending' END
                      ELSE d.status END,
        finished_at = CASE WHEN """
    + _CANCELS
    + """ THEN clock.now ELSE d.finished_at END,
        errors = CASE WHEN """
    + _CANCELS
    + """
                      THEN d.errors || jsonb_build_array("""
    + _cancelled_entry(
        "'parent job ' || c.failed_parent || ' ended ' || c.failed_state",
        worker_id="''",
        attempt="d.attempts",
    )
    + """)
                      ELSE d.errors END,
        args = CASE WHEN d.parent_results IS NOT NULL AND """
    + _RELEASES
    + """
                    THEN jsonb_build_array("""
    + _PARENT_RESULTS
    + """) || d.args
                    ELSE d.args END
    FROM counted AS c, lock_order, clock
    WHERE d.id = c.job_id
      AND lock_order.id = d.id
    RETURNING d.id, d.status,
              CASE WHEN d.status = 'pending'
                   THEN pg_notify(%(channel)s, '"""
    + RELEASE_NOTIFY_PREFIX
    + """' || d.queue)
              END
)"""
)


# The clock a bulk call stamps on its jobs (created_at, the default run_at, pending or
# scheduled), read once: COPY cannot evaluate an expression per row. No index.
JOB_BULK_CLOCK = """
SELECT coalesce(%(now)s::timestamptz, clock_timestamp())
"""

# Stream one bounded batch of jobs without idempotency keys into the table, in binary
# (no text parsing on the server). COPY has no ON CONFLICT: keyed batches take
# JOB_BULK_INSERT_DEDUPE.
JOB_BULK_COPY = "\nCOPY pgqueue_job (" + _BULK_COLUMN_LIST + ") FROM STDIN (FORMAT BINARY)\n"

# Stream one bounded batch of a workflow's edges (EDGE_COLUMNS), in binary, in the
# transaction that COPYs its jobs (JOB_BULK_COPY_WORKFLOW): they commit together.
JOB_BULK_COPY_EDGES = (
    "\nCOPY pgqueue_job_dependency ("
    + ", ".join(name for name, _ in EDGE_COLUMNS)
    + ") FROM STDIN (FORMAT BINARY)\n"
)

# COPY one bounded batch whose ids were taken from the sequence first (JOB_BULK_IDS):
# what bulk enqueue does when task_enqueued has receivers, so each job can be announced
# with its real id (COPY returns nothing). Otherwise as JOB_BULK_COPY.
JOB_BULK_COPY_WITH_IDS = (
    "\nCOPY pgqueue_job (id, " + _BULK_COLUMN_LIST + ") FROM STDIN (FORMAT BINARY)\n"
)

# Stream one bounded batch of a workflow's jobs (WORKFLOW_COLUMNS: ids taken from the
# sequence first, so its edges can name them), in binary. Otherwise as JOB_BULK_COPY.
JOB_BULK_COPY_WORKFLOW = (
    "\nCOPY pgqueue_job ("
    + ", ".join(name for name, _ in WORKFLOW_COLUMNS)
    + ") FROM STDIN (FORMAT BINARY)\n"
)

# Take %(count)s ids from the jobs' id sequence in one round trip, for a batch that is
# then written with explicit ids (JOB_BULK_COPY_WITH_IDS, JOB_BULK_INSERT_DEDUPE_WITH_IDS,
# a workflow's JOB_BULK_COPY_WORKFLOW). No table is read; nextval never blocks and never
# hands an id out twice. The sequence is looked up once (an InitPlan), not per id.
JOB_BULK_IDS = """
SELECT nextval((SELECT pg_get_serial_sequence('pgqueue_job', 'id')::regclass))
FROM generate_series(1, %(count)s)
"""

# Insert one bounded batch holding idempotency keys, skipping jobs whose key a live job
# of the queue holds (pgqueue_job_idempotency_uniq is the arbiter). One array per column
# keeps the text fixed at any batch size; ORDER BY ord makes the first duplicate win.
JOB_BULK_INSERT_DEDUPE = """
INSERT INTO pgqueue_job AS j (
    backend, queue, task, args, kwargs, priority, status, max_attempts,
    run_at, created_at, errors, idempotency_key, concurrency_key
)
SELECT r.backend, r.queue, r.task, r.args::jsonb, r.kwargs::jsonb, r.priority, r.status,
       r.max_attempts, r.run_at, %(created_at)s::timestamptz, '[]'::jsonb, r.idempotency_key,
       r.concurrency_key
FROM unnest(
    %(backend)s::text[], %(queue)s::text[], %(task)s::text[], %(args)s::text[],
    %(kwargs)s::text[], %(priority)s::int[], %(status)s::text[], %(max_attempts)s::int[],
    %(run_at)s::timestamptz[], %(idempotency_key)s::text[], %(concurrency_key)s::text[]
) WITH ORDINALITY AS r(
    backend, queue, task, args, kwargs, priority, status, max_attempts,
    run_at, idempotency_key, concurrency_key, ord
)
ORDER BY r.ord
ON CONFLICT (queue, idempotency_key)
    WHERE idempotency_key IS NOT NULL
      AND status IN ('pending', 'scheduled', 'running')
    DO NOTHING
"""

# JOB_BULK_INSERT_DEDUPE with ids taken from the sequence first (JOB_BULK_IDS), for
# announcing each job with its real id; RETURNING names the ids actually inserted (a
# skipped job's id is simply never used). Same arbiter and order as JOB_BULK_INSERT_DEDUPE.
JOB_BULK_INSERT_DEDUPE_WITH_IDS = """
INSERT INTO pgqueue_job AS j (
    id, backend, queue, task, args, kwargs, priority, status, max_attempts,
    run_at, created_at, errors, idempotency_key, concurrency_key
)
SELECT r.id, r.backend, r.queue, r.task, r.args::jsonb, r.kwargs::jsonb, r.priority,
       r.status, r.max_attempts, r.run_at, %(created_at)s::timestamptz, '[]'::jsonb,
       r.idempotency_key, r.concurrency_key
FROM unnest(
    %(id)s::bigint[], %(backend)s::text[], %(queue)s::text[], %(task)s::text[],
    %(args)s::text[], %(kwargs)s::text[], %(priority)s::int[], %(status)s::text[],
    %(max_attempts)s::int[], %(run_at)s::timestamptz[], %(idempotency_key)s::text[],
    %(concurrency_key)s::text[]
) WITH ORDINALITY AS r(
    id, backend, queue, task, args, kwargs, priority, status, max_attempts,
    run_at, idempotency_key, concurrency_key, ord
)
ORDER BY r.ord
ON CONFLICT (queue, idempotency_key)
    WHERE idempotency_key IS NOT NULL
      AND status IN ('pending', 'scheduled', 'running')
    DO NOTHING
RETURNING j.id
"""

# Cancel jobs by id: waiting, pending and scheduled ones end 'cancelled' now, and what
# waits on them with them (_RESOLVE); running ones get cancel_requested_at, which makes
# whatever write ends them end them 'cancelled'. Rows are locked in id order with SKIP
# LOCKED; a locked one comes back 'busy', to retry.
JOB_CANCEL = (
    """
WITH RECURSIVE """
    + _CLOCK
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
    + _cancelled_entry("'cancelled before it ran (' || j.status || ')'", worker_id="''")
    + """) END
    FROM target, clock
    WHERE j.id = target.id
      AND j.status IN ('pending', 'scheduled', 'running', 'waiting')
    RETURNING j.id, j.status, j.result
), ended AS (
    SELECT id, status, result FROM changed WHERE status = 'cancelled'
), """
    + _RESOLVE
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

# Lease up to %(limit)s pending jobs, highest priority first, from the head of
# pgqueue_job_claim_idx (WHERE and ORDER BY match it exactly). SKIP LOCKED: competing
# workers take disjoint rows; one statement, so no commit releases a lock unowned.
JOB_CLAIM = (
    """
WITH candidate AS (
    SELECT id
    FROM pgqueue_job
    WHERE status = 'pending'
    ORDER BY priority DESC, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)"""
    + _CLAIM_LEASE
)

# One range of a resumed claim of all queues (pgqueue_job_claim_idx).
_RESUME_RANGE = """{name} AS (
    SELECT id
    FROM pgqueue_job
    WHERE status = 'pending' AND {range}
    ORDER BY priority DESC, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)"""

# JOB_CLAIM resumed after the worker's previous claim: the three _RESUME_RANGES of
# pgqueue_job_claim_idx, so a claim never walks the dead entries of jobs already
# claimed while xmin is pinned.
JOB_CLAIM_AFTER = (
    "\nWITH "
    + _resume_ranges(_RESUME_RANGE, "%(after_priority)s", "%(after_id)s")
    + """, candidate AS (
    SELECT id
    FROM (SELECT id FROM above UNION ALL SELECT id FROM level
          UNION ALL SELECT id FROM below) AS branches
    LIMIT %(limit)s
)"""
    + _CLAIM_LEASE
)

# JOB_CLAIM for a worker while flow control is in force without limits (queues paused,
# fair queues): the candidates of _FLOW_CANDIDATES leased at once, one statement. The
# head of the line in claim order, then the groups of pgqueue_job_key_claim_idx from
# the worker's cursor; a paused queue is left out, never walked.
JOB_CLAIM_FLOW = "\nWITH " + _FLOW_CANDIDATES + _LEASE_CANDIDATES

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
    + _KEY_MATCHES.format(key="k.key")
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
    + _KEY_MATCHES.format(key="k.key")
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
    + _KEY_MATCHES.format(key="k.key")
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
    + _KEY_MATCHES.format(key="c.key")
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
    "\nWITH "
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
    + _LEASE_CANDIDATES.replace("FROM candidate", "FROM chosen")
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


# The limited keys of a head of the line (_FLOW_HEAD), as the CTEs head_key (key,
# limited: whether a key limit applies) and held_key: each limited key whose budget
# lock this claim took (if free: never waited for; one another claim holds is passed
# over like a full key).
_HEAD_KEYS_HELD = (
    """head_key AS MATERIALIZED (
    SELECT k.key, EXISTS (SELECT FROM key_limit AS l WHERE """
    + _KEY_MATCHES.format(key="k.key")
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
    + _LEASE_CANDIDATES.replace("FROM candidate", "FROM chosen")
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
    "\nWITH " + _CLOCK + ", " + _FLOW_LIMITS + ", " + _FLOW_HEAD_LOCKED + ", " + _HEAD_KEYS_HELD
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
    _HEAD_START
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

# JOB_CLAIM_LIMITED_HEAD while the only limits in force are concurrency bounds of keys
# (no rate, no limit of the worker's queues): the same claim without the CTEs that
# would find nothing to do, a plan a third smaller to set up at every claim.
JOB_CLAIM_LIMITED_HEAD_KEYS = (
    _HEAD_START
    + """, usage AS MATERIALIZED (
    SELECT *
    FROM pgqueue_flow_usage(ARRAY(SELECT key FROM held_key), ARRAY[]::text[],
                            ARRAY[]::text[], ARRAY[]::text[])
), key_room AS MATERIALIZED (
    SELECT k.key, min(l.concurrency - coalesce(u.running, 0)) AS room
    FROM held_key AS k
    JOIN key_limit AS l ON """
    + _KEY_MATCHES.format(key="k.key")
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


# JOB_CLAIM for a worker of some queues: the head of each queue's own range of
# pgqueue_job_queue_claim_idx, so a small queue behind a huge one is reached at once;
# then the best %(limit)s of those.
JOB_CLAIM_QUEUES = (
    """
WITH candidate AS (
    SELECT c.id
    FROM unnest(%(queues)s::text[]) AS q(name)
    CROSS JOIN LATERAL (
        SELECT id, priority
        FROM pgqueue_job
        WHERE status = 'pending' AND queue = q.name
        ORDER BY priority DESC, id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS c
    ORDER BY c.priority DESC, c.id
    LIMIT %(limit)s
)"""
    + _CLAIM_LEASE
)


# One range of a resumed claim of some queues, walked for each queue's position
# (pgqueue_job_queue_claim_idx, from that queue's own start in it).
_RESUME_QUEUE_RANGE = """{name} AS (
    SELECT c.id, c.priority
    FROM queue_position AS q
    CROSS JOIN LATERAL (
        SELECT id, priority
        FROM pgqueue_job
        WHERE status = 'pending' AND queue = q.name AND {range}
        ORDER BY priority DESC, id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS c
)"""

# JOB_CLAIM_QUEUES resumed after the worker's previous claim, per queue: the three
# _RESUME_RANGES of each queue's part of pgqueue_job_queue_claim_idx (as
# JOB_CLAIM_AFTER), so the claim never walks the dead entries of jobs claimed while xmin
# is pinned. A queue with no position yet starts above every priority and id
# (manager.QUEUE_HEAD), where its third range is its whole line from the head.
JOB_CLAIM_QUEUES_AFTER = (
    """
WITH queue_position AS (
    SELECT *
    FROM unnest(%(queues)s::text[], %(after_priorities)s::int[], %(after_ids)s::bigint[])
         AS q(name, after_priority, after_id)
), """
    + _resume_ranges(_RESUME_QUEUE_RANGE, "q.after_priority", "q.after_id")
    + """, candidate AS (
    SELECT id
    FROM (SELECT id, priority FROM above UNION ALL SELECT id, priority FROM level
          UNION ALL SELECT id, priority FROM below) AS branches
    ORDER BY priority DESC, id
    LIMIT %(limit)s
)"""
    + _CLAIM_LEASE
)


def _done_set(result: str) -> str:
    """The SET of a successful completion (alias j, with clock): done, or cancelled with
    its error entry if a cancel was asked while it ran. ``result``: the result's SQL."""
    return (
        "SET status = CASE WHEN j.cancel_requested_at IS NULL THEN 'done' ELSE 'cancelled' END,"
        f"\n    result = {result},\n    finished_at = clock.now,\n    lease_expires_at = NULL,"
        "\n    errors = CASE WHEN j.cancel_requested_at IS NULL THEN j.errors"
        "\n                  ELSE j.errors || jsonb_build_array("
        + _cancelled_entry("'cancellation requested while running; the task returned'")
        + ") END"
    )


# The batch of a batched completion, one row per job in the caller's (id) order: what
# _FENCE checks (id, attempt, claimed_at), its result, and its 1-based position.
_OWNED_BATCH = """unnest(%(ids)s::bigint[], %(attempts)s::int[], %(claimed_at)s::timestamp[],
       %(results)s::jsonb[]) WITH ORDINALITY AS owned(id, attempt, claimed_at, result, ord)"""


# Mark a job done with its result, only while this worker still owns this attempt (or
# 'cancelled' if its cancellation was requested). Primary-key lookup; the fence makes a
# late (zombie) completion update zero rows. For a job created without dependants
# (has_dependants false): "dependants" says whether some were enqueued since, which the
# caller then resolves (JOB_RESOLVE_PARENTS); JOB_COMPLETE_RELEASING is for the others.
JOB_COMPLETE = (
    """
WITH """
    + _CLOCK
    + """
UPDATE pgqueue_job AS j
"""
    + _done_set("%(result)s::jsonb")
    + """
FROM clock, """
    + _OWNED_ONE
    + """
WHERE """
    + _FENCE
    + """
RETURNING j.id, j.status, """
    + _HAS_DEPENDANTS
    + """ AS dependants
"""
)

# Mark many jobs done in one statement (the batched completion), each fenced. The caller
# sorts by id, JOB_EXTEND_LEASES's lock order; the 1-based position and new status (done
# or cancelled) of every row changed come back (a missing one is a lost lease), and as
# for JOB_COMPLETE whether it has dependants to resolve. For jobs created without any.
JOB_COMPLETE_MANY = (
    """
WITH """
    + _CLOCK
    + """
UPDATE pgqueue_job AS j
"""
    + _done_set("owned.result")
    + """
FROM clock, """
    + _OWNED_BATCH
    + """
WHERE """
    + _FENCE
    + """
RETURNING owned.ord, j.status, """
    + _HAS_DEPENDANTS
    + """ AS dependants
"""
)

# JOB_COMPLETE_MANY for a batch holding a job created with dependants (a workflow's):
# what waits on them is resolved in the same statement (_RESOLVE), so a dependant is
# released in its last parent's completion's transaction, and a zombie, which changes no
# row, releases nothing twice. Only these batches pay for the fragment's bigger plan.
JOB_COMPLETE_MANY_RELEASING = (
    """
WITH RECURSIVE """
    + _CLOCK
    + """, ended AS (
    UPDATE pgqueue_job AS j
    """
    + _done_set("owned.result")
    + """
    FROM clock, """
    + _OWNED_BATCH
    + """
    WHERE """
    + _FENCE
    + """
    RETURNING j.id, j.status, j.result, owned.ord
), """
    + _RESOLVE
    + """
SELECT ord, status FROM ended
"""
)

# JOB_COMPLETE for a job created with dependants: resolves them in the same statement
# (_RESOLVE), as JOB_COMPLETE_MANY_RELEASING does. Primary-key lookup, fenced.
JOB_COMPLETE_RELEASING = (
    """
WITH RECURSIVE """
    + _CLOCK
    + """, ended AS (
    UPDATE pgqueue_job AS j
    """
    + _done_set("%(result)s::jsonb")
    + """
    FROM clock, """
    + _OWNED_ONE
    + """
    WHERE """
    + _FENCE
    + """
    RETURNING j.id, j.status, j.result
), """
    + _RESOLVE
    + """
SELECT id, status FROM ended
"""
)

# Admin: live jobs per status and queue, at most %(cap)s rows of each status, each
# branch on its own partial index and stopped by its LIMIT (no ORDER BY), so the cost is
# bounded whatever the backlog; a capped status is shown as "at least".
JOB_COUNT_LIVE_BY_QUEUE = """
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

# Status figures per queue: at most %(cap)s rows of each status from its own partial
# index (no ORDER BY), with the oldest pending run_at; monitoring.py scales a capped
# status to the planner's estimate.
JOB_COUNT_SAMPLE_BY_QUEUE = """
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

# Discard dead letters by id (admin), guarded by status = 'dead' and locked in id order
# like JOB_REQUEUE_DEAD, so overlapping discards and requeues wait, never deadlock. Their
# own edges go with them; an edge out of one still unresolved (a dependant enqueued as
# it died) is resolved first (_RESOLVE), so nothing waits on a job that is gone.
JOB_DELETE_DEAD = (
    """
WITH RECURSIVE """
    + _CLOCK
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
    + _RESOLVE
    + """
SELECT id FROM ended
"""
)

# Delete keys whose window closed (unique_for), or whose job started (debounce), one
# bounded batch of pgqueue_job_key_expires_idx; a debounce key of a job still waiting is
# kept, since it alone stops a second job. SKIP LOCKED: enqueues hold the rows they use.
JOB_DELETE_EXPIRED_KEYS = (
    """
WITH closed AS (
    SELECT k.kind, k.queue, k.key
    FROM pgqueue_job_key AS k
    WHERE k.expires_at < coalesce(%(now)s::timestamptz, clock_timestamp())
      AND (k.kind = 'unique' OR NOT """
    + _WAITING
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

# Delete jobs of one final state (%(status)s: done, cancelled or dead) that finished
# before that state's retention horizon, one bounded batch, with their own edges. The
# state is a literal when Django binds it, so each uses its own partial index; SKIP
# LOCKED splits the work. A parent with an edge the sweeper has yet to resolve is kept
# (pgqueue_job_dep_repair_idx): only then does a dependant need the parent's row.
JOB_DELETE_FINISHED_BEFORE = """
WITH old AS (
    SELECT id
    FROM pgqueue_job AS j
    WHERE status = %(status)s
      AND finished_at < coalesce(%(now)s::timestamptz, clock_timestamp())
                        - make_interval(secs => %(retention_seconds)s)
      AND NOT EXISTS (SELECT FROM pgqueue_job_dependency AS e
                      WHERE e.parent_id = j.id AND e.repair AND e.state IS NULL)
    ORDER BY finished_at
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED
), pruned AS (
    DELETE FROM pgqueue_job AS j
    USING old
    WHERE j.id = old.id
    RETURNING j.id, j.parents_left
), own_edges AS (
    DELETE FROM pgqueue_job_dependency AS e
    WHERE e.job_id IN (SELECT id FROM pruned WHERE parents_left IS NOT NULL)
)
SELECT count(*) FROM pruned
"""

# Insert one job, or find the live one holding its idempotency key (the arbiter is
# pgqueue_job_idempotency_uniq), and NOTIFY at commit. Prepared: it returns only what the
# database decided, so a new column never changes a prepared statement's result.
JOB_ENQUEUE = """
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, clock_timestamp()) AS now,
           %(run_at)s::timestamptz AS run_at
)
INSERT INTO pgqueue_job AS j (
    backend, queue, task, args, kwargs, priority, status, attempts, max_attempts,
    run_at, idempotency_key, errors, created_at, trace_context, concurrency_key
)
SELECT %(backend)s, %(queue)s, %(task)s, %(args)s::jsonb, %(kwargs)s::jsonb,
       %(priority)s,
       CASE WHEN clock.run_at > clock.now THEN 'scheduled' ELSE 'pending' END,
       0, %(max_attempts)s, coalesce(clock.run_at, clock.now), %(idempotency_key)s,
       '[]'::jsonb, clock.now, %(trace_context)s::jsonb, %(concurrency_key)s
FROM clock
ON CONFLICT (queue, idempotency_key)
    WHERE idempotency_key IS NOT NULL
      AND status IN ('pending', 'scheduled', 'running')
    DO NOTHING
RETURNING j.id, j.status, j.run_at, j.created_at, pg_notify(%(channel)s, j.queue)::text
"""

# Debounced enqueue: the key's row (locked by the upsert, so concurrent enqueues take
# turns) names the job that has not started; it gets these args and run time. Else a new
# job (no idempotency_key: a running one must not block it). Rows: none means retry.
JOB_ENQUEUE_DEBOUNCED = (
    """
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

# Insert one job that depends on existing jobs (%(parents)s, in order) with its edges,
# or find the live one holding its idempotency key. The parents are locked FOR KEY
# SHARE (no worker's UPDATE waits on it; only their deletion does) and read: a parent
# already finished gives its edge its outcome (and the job its result); a live one
# counts in parents_left, and its edge is marked for repair, since its completion may
# run on a snapshot older than this insert (JOB_RESOLVE_LATE, JOB_RESOLVE_MISSED). So
# the job starts waiting, released (pending or scheduled), or cancelled (a parent dead
# or cancelled, unless %(on_parent_failure)s is 'run'). Nothing is inserted unless
# every parent was found; the found ids come back to say which were not. Primary-key
# lookups; pgqueue_job_idempotency_uniq is the arbiter; NOTIFY at commit if pending.
JOB_ENQUEUE_DEPENDANT = (
    """
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, clock_timestamp()) AS now,
           %(run_at)s::timestamptz AS run_at
), parent AS (
    SELECT p.id, p.status, p.result, p.workflow_id, want.ord - 1 AS position,
           p.status IN ('done', 'dead', 'cancelled') AS finished
    FROM unnest(%(parents)s::bigint[]) WITH ORDINALITY AS want(id, ord)
    JOIN pgqueue_job AS p ON p.id = want.id
    ORDER BY p.id
    FOR KEY SHARE OF p
), summary AS (
    SELECT array_agg(id) AS found,
           count(*) FILTER (WHERE NOT finished)::int AS left_,
           (array_agg(id ORDER BY position) FILTER (WHERE status IN ('dead', 'cancelled')))[1]
               AS failed_parent,
           (array_agg(status ORDER BY position)
               FILTER (WHERE status IN ('dead', 'cancelled')))[1] AS failed_state,
           (array_agg(workflow_id ORDER BY position))[1] AS workflow_id,
           CASE %(parent_results)s::text
               WHEN 'value' THEN (jsonb_agg(CASE WHEN status = 'done' THEN result END
                                            ORDER BY position)) -> 0
               ELSE jsonb_agg(CASE WHEN status = 'done' THEN result END ORDER BY position)
           END AS results
    FROM parent
), decided AS (
    SELECT s.*, clock.now, clock.run_at,
           CASE WHEN s.failed_parent IS NOT NULL AND %(on_parent_failure)s::text IS NULL
                THEN 'cancelled'
                WHEN s.left_ > 0 THEN 'waiting'
                WHEN clock.run_at > clock.now THEN 'scheduled'
                ELSE 'pending' END AS status
    FROM summary AS s, clock
), job AS (
    INSERT INTO pgqueue_job AS j (
        backend, queue, task, args, kwargs, priority, status, attempts, max_attempts,
        run_at, idempotency_key, errors, created_at, finished_at, trace_context,
        parents_left, parent_results, on_parent_failure, workflow_id, concurrency_key
    )
    SELECT %(backend)s, %(queue)s, %(task)s,
           CASE WHEN x.status IN ('pending', 'scheduled') AND %(parent_results)s::text IS NOT NULL
                THEN jsonb_build_array(x.results) || %(args)s::jsonb
                ELSE %(args)s::jsonb END,
           %(kwargs)s::jsonb, %(priority)s, x.status, 0, %(max_attempts)s,
           coalesce(x.run_at, x.now), %(idempotency_key)s,
           CASE WHEN x.status = 'cancelled' THEN jsonb_build_array("""
    + _cancelled_entry(
        "'parent job ' || x.failed_parent || ' ended ' || x.failed_state"
        " || ' before this job was enqueued'",
        worker_id="''",
        attempt="0",
    ).replace("clock.now", "x.now")
    + """)
                ELSE '[]'::jsonb END,
           x.now, CASE WHEN x.status = 'cancelled' THEN x.now END, %(trace_context)s::jsonb,
           x.left_, %(parent_results)s::text, %(on_parent_failure)s::text,
           coalesce(%(workflow_id)s::bigint, x.workflow_id), %(concurrency_key)s
    FROM decided AS x
    WHERE cardinality(x.found) = cardinality(%(parents)s::bigint[])
    ON CONFLICT (queue, idempotency_key)
        WHERE idempotency_key IS NOT NULL
          AND status IN ('pending', 'scheduled', 'running', 'waiting')
        DO NOTHING
    RETURNING j.id, j.status, j.run_at, j.created_at, j.args, j.errors, j.finished_at,
              j.parents_left, j.workflow_id,
              CASE WHEN j.status = 'pending' THEN pg_notify(%(channel)s, j.queue) END
), edges AS (
    INSERT INTO pgqueue_job_dependency (job_id, position, parent_id, state, result, repair)
    SELECT job.id, p.position, p.id,
           CASE WHEN p.finished THEN p.status END,
           CASE WHEN p.status = 'done' THEN p.result END,
           NOT p.finished
    FROM job, parent AS p
)
SELECT job.id, job.status, job.run_at, job.created_at, job.args, job.errors,
       job.finished_at, job.parents_left, job.workflow_id, summary.found
FROM summary
LEFT JOIN job ON true
"""
)

# The upsert of a unique_for window's row (kind 'unique', alias k): a window that closed
# takes the new job and a new window from its creation; an open one keeps its job,
# which RETURNING then names. Concurrent upserts of one key take turns on the row.
_UNIQUE_WINDOW = """    ON CONFLICT (kind, queue, key) DO UPDATE
    SET job_id = CASE WHEN k.expires_at <= excluded.created_at
                      THEN excluded.job_id ELSE k.job_id END,
        created_at = CASE WHEN k.expires_at <= excluded.created_at
                          THEN excluded.created_at ELSE k.created_at END,
        expires_at = CASE WHEN k.expires_at <= excluded.created_at
                          THEN excluded.expires_at ELSE k.expires_at END"""

# Enqueue unique for a period: the key's row (an upsert: concurrent enqueues take turns)
# names the job created in its window, or, once the window closed, this new one. The job
# is inserted only then; a live job holding the key wins (inserted false: roll back).
JOB_ENQUEUE_UNIQUE = (
    """
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
    + _UNIQUE_WINDOW
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

# Insert a small workflow (chain, group) in one statement: its jobs from one array per
# column (ids drawn here, in node order; the first is the workflow's id) and its edges,
# which name nodes by their 1-based position. A bounded multi-row insert: a workflow
# larger than a COPY batch goes through JOB_BULK_COPY_WORKFLOW instead. NOTIFY at
# commit once per queue of a job that can start now. No index read.
JOB_ENQUEUE_WORKFLOW = """
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, clock_timestamp()) AS now
), node AS MATERIALIZED (
    SELECT n.*,
           nextval((SELECT pg_get_serial_sequence('pgqueue_job', 'id')::regclass)) AS id
    FROM unnest(
        %(backend)s::text[], %(queue)s::text[], %(task)s::text[], %(args)s::text[],
        %(kwargs)s::text[], %(priority)s::int[], %(max_attempts)s::int[],
        %(run_at)s::timestamptz[], %(parents_left)s::int[], %(parent_results)s::text[],
        %(on_parent_failure)s::text[], %(has_dependants)s::boolean[],
        %(concurrency_key)s::text[]
    ) WITH ORDINALITY AS n(
        backend, queue, task, args, kwargs, priority, max_attempts, run_at, parents_left,
        parent_results, on_parent_failure, has_dependants, concurrency_key, ord
    )
    ORDER BY n.ord
), job AS (
    INSERT INTO pgqueue_job AS j (
        id, backend, queue, task, args, kwargs, priority, status, attempts, max_attempts,
        run_at, errors, created_at, parents_left, parent_results, on_parent_failure,
        workflow_id, has_dependants, concurrency_key
    )
    SELECT n.id, n.backend, n.queue, n.task, n.args::jsonb, n.kwargs::jsonb, n.priority,
           CASE WHEN n.parents_left IS NOT NULL THEN 'waiting'
                WHEN n.run_at > clock.now THEN 'scheduled'
                ELSE 'pending' END,
           0, n.max_attempts, coalesce(n.run_at, clock.now), '[]'::jsonb, clock.now,
           n.parents_left, n.parent_results, n.on_parent_failure,
           (SELECT min(id) FROM node), n.has_dependants, n.concurrency_key
    FROM node AS n, clock
    RETURNING j.status, j.queue
), edge AS (
    INSERT INTO pgqueue_job_dependency (job_id, position, parent_id)
    SELECT child.id, e.position, parent.id
    FROM unnest(%(edge_job)s::int[], %(edge_position)s::int[], %(edge_parent)s::int[])
         AS e(job, position, parent)
    JOIN node AS child ON child.ord = e.job
    JOIN node AS parent ON parent.ord = e.parent
)
SELECT n.id, clock.now,
       (SELECT count(pg_notify(%(channel)s, w.queue))
        FROM (SELECT DISTINCT queue FROM job WHERE status = 'pending') AS w) AS woken
FROM node AS n, clock
ORDER BY n.ord
"""

# Push the lease of jobs this worker still owns further into the future, fenced. Returns
# the ids still owned (a lost lease is visible) and whether each one's cancellation was
# requested, so the heartbeat learns of cancels at no extra query.
JOB_EXTEND_LEASES = (
    """
WITH """
    + _CLOCK
    + """
UPDATE pgqueue_job AS j
SET lease_expires_at = """
    + _LEASE
    + """
FROM clock,
     unnest(%(ids)s::bigint[], %(attempts)s::int[], %(claimed_at)s::timestamp[])
     AS owned(id, attempt, claimed_at)
WHERE """
    + _FENCE
    + """
RETURNING j.id, j.cancel_requested_at IS NOT NULL AS cancel_requested
"""
)

# Record a failed attempt, fenced: retry after %(retry_delay)s s (NULL: exponential
# backoff and jitter) while attempts remain (and %(retry)s), else dead-letter; a job whose
# cancellation was requested ends 'cancelled' with a JobCancelled entry after the task's
# own error. Keeps the newest %(keep_errors)s error entries. A job that ends dead or
# cancelled cancels what waits on it, or releases what runs anyway (_RESOLVE).
JOB_FAIL = (
    """
WITH RECURSIVE """
    + _CLOCK
    + """, failed AS (
UPDATE pgqueue_job AS j
SET status = CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'
                  WHEN %(retry)s AND j.attempts < j.max_attempts
                  THEN 'scheduled' ELSE 'dead' END,
    run_at = CASE WHEN j.cancel_requested_at IS NULL AND %(retry)s
                       AND j.attempts < j.max_attempts
                  THEN clock.now + coalesce(
                      make_interval(secs => %(retry_delay)s::float8),
                      make_interval(secs => least(
                      %(backoff_max)s::float8,
                      %(backoff_base)s::float8 * power(2, least(j.attempts - 1, 40))
                          * (0.75 + random() * 0.5))))
                  ELSE j.run_at END,
    finished_at = CASE WHEN j.cancel_requested_at IS NULL AND %(retry)s
                            AND j.attempts < j.max_attempts
                       THEN NULL ELSE clock.now END,
    lease_expires_at = NULL,
    errors = """
    + _KEEP_NEWEST.format(
        entries="j.errors || jsonb_build_array("
        + _ENTRY.format(
            path="%(error_path)s::text",
            traceback="%(error_traceback)s::text",
            worker_id="j.lease_owner",
            attempt="j.attempts",
        )
        + ") || CASE WHEN j.cancel_requested_at IS NOT NULL"
        " AND %(error_path)s::text <> 'django_pgqueue.exceptions.JobCancelled'"
        " THEN jsonb_build_array("
        + _cancelled_entry("'cancellation requested while running'")
        + ") ELSE '[]'::jsonb END"
    )
    + """
FROM clock, """
    + _OWNED_ONE
    + """
WHERE """
    + _FENCE
    + """
RETURNING j.id, j.status
), ended AS (
    SELECT id, status, NULL::jsonb AS result FROM failed WHERE status IN ('dead', 'cancelled')
), """
    + _RESOLVE
    + """
SELECT status FROM failed
"""
)

# Admin: the planner's statistics of one column (row estimate, most common values and
# their shares) and the table's size, read from the catalogs: no table scan.
JOB_GET_COLUMN_STATS = """
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

# Admin: the longest wait of a pending job and the count of expired leases (no sweeper
# running?). A LIMITed scan plus a loose index scan of pgqueue_job_claim_idx (a seek per
# priority), and a LIMITed range of pgqueue_job_lease_idx: bounded whatever the size.
JOB_GET_HEALTH = """
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

# The dashboard's per-minute history: up to %(cap)s done jobs a minute (a range of
# pgqueue_job_done_idx) with their finish times and waits, and the newest dead letters
# (pgqueue_job_dead_idx); the caller scales a capped minute by its rate.
JOB_GET_HISTORY = """
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

# The parents of a job in depends_on order, each with its outcome as its edge keeps it
# (state, result: set when the parent finished) and its last error entry if its row is
# still there (pruned: NULL). Primary key of the edges, then of each parent.
JOB_GET_PARENTS = """
SELECT e.parent_id, coalesce(e.state, p.status) AS status, e.result,
       p.errors -> -1 AS error
FROM pgqueue_job_dependency AS e
LEFT JOIN pgqueue_job AS p ON p.id = e.parent_id
WHERE e.job_id = %(id)s
ORDER BY e.position
"""

# The head of each priority's line of pending jobs: a loose index scan of
# pgqueue_job_claim_idx, one seek per distinct priority (at most 201).
JOB_GET_PENDING_HEADS = """
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

# The running jobs with their progress (pgqueue_status --json), soonest lease expiry
# first: a LIMITed range of pgqueue_job_lease_idx, bounded whatever the backlog.
JOB_GET_RUNNING = """
SELECT id, queue, task, lease_owner, attempts, last_attempted_at, progress
FROM pgqueue_job
WHERE status = 'running'
ORDER BY lease_expires_at
LIMIT %(limit)s
"""

# Wake idle workers listening on the channel (payload: the queue name). Used after
# promotions and requeues; delivered when the surrounding transaction commits.
JOB_NOTIFY = """
SELECT pg_notify(%(channel)s, %(queue)s)
"""

# Tell workers at once that running jobs were cancelled: one notification per
# %(per_payload)s ids (NOTIFY payloads stay under 8000 bytes), "<prefix>id,id,...", where
# the prefix is no valid queue name. No index. Delivered when the transaction commits.
JOB_NOTIFY_CANCEL = """
SELECT pg_notify(%(channel)s, %(prefix)s || string_agg(t.id::text, ',' ORDER BY t.n))
FROM unnest(%(ids)s::bigint[]) WITH ORDINALITY AS t(id, n)
GROUP BY (t.n - 1) / %(per_payload)s
"""

# Wake idle workers once for each of several queues (payload: the queue name), in one
# statement: a bulk enqueue sends one notification per distinct queue per call, never
# one per row. No index. Delivered when the surrounding transaction commits.
JOB_NOTIFY_MANY = """
SELECT pg_notify(%(channel)s, queue)
FROM unnest(%(queues)s::text[]) AS queue
"""

# Move due scheduled jobs (delayed, or backing off after a failure) to pending, one
# bounded batch. Uses pgqueue_job_scheduled_idx, so future jobs never sit in the claim
# index's scan. SKIP LOCKED: several sweepers and idle workers may promote at once.
JOB_PROMOTE_DUE = """
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

# Give a claimed job back without charging the attempt (graceful shutdown before the
# task started), fenced; a job whose cancellation was requested meanwhile ends
# 'cancelled', and what waits on it with it (_RESOLVE).
JOB_RELEASE = (
    """
WITH RECURSIVE """
    + _CLOCK
    + """, given AS (
UPDATE pgqueue_job AS j
SET status = CASE WHEN j.cancel_requested_at IS NULL THEN 'pending' ELSE 'cancelled' END,
    """
    + _given_back("'cancelled before it ran (released at shutdown)'")
    + """
FROM clock, """
    + _OWNED_ONE
    + """
WHERE """
    + _FENCE
    + """
RETURNING j.id, j.status
), ended AS (
    SELECT id, status, NULL::jsonb AS result FROM given WHERE status = 'cancelled'
), """
    + _RESOLVE
    + """
SELECT id FROM given
"""
)

# Requeue dead letters by id (admin): pending, attempts reset, errors kept, guarded by
# status = 'dead' and locked in id order. Jobs whose key a live job holds are skipped
# (and all but the newest of selected jobs sharing one); NOTIFY at commit.
JOB_REQUEUE_DEAD = """
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

# Take back expired leases: to pending, to dead on the last attempt, or to cancelled,
# with an error entry saying whose lease expired; a job that ends dead or cancelled
# resolves what waits on it (_RESOLVE). One bounded batch of pgqueue_job_lease_idx;
# SKIP LOCKED never waits on a worker completing a row.
JOB_RESCUE_EXPIRED = (
    """
WITH RECURSIVE """
    + _CLOCK
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
    + _KEEP_NEWEST.format(
        entries="j.errors || jsonb_build_array(CASE WHEN j.cancel_requested_at IS NULL THEN "
        + _ENTRY.format(
            path="'django_pgqueue.exceptions.LeaseExpired'",
            traceback="'LeaseExpired: lease of worker ' || j.lease_owner"
            " || ' expired after attempt ' || j.attempts || ' of ' || j.max_attempts",
            worker_id="j.lease_owner",
            attempt="j.attempts",
        )
        + " ELSE "
        + _cancelled_entry(
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
    + _RESOLVE
    + """
SELECT id, status FROM rescued
"""
)

# Resolve the edges marked for repair of the given dependants whose parent has finished,
# right after the transaction that enqueued them committed: a parent that completed
# meanwhile, on a snapshot older than that commit, did not see them. The parents are
# read FOR SHARE, unfiltered: a completion that already wrote its row is waited for and
# its row read. (One whose row write comes after this read is the sweeper's:
# JOB_RESOLVE_MISSED.) Then as every finishing statement (_RESOLVE). Primary keys.
JOB_RESOLVE_LATE = (
    """
WITH RECURSIVE """
    + _CLOCK
    + """, parent AS (
    SELECT p.id, p.status, p.result
    FROM pgqueue_job AS p
    WHERE p.id IN (SELECT e.parent_id
                   FROM pgqueue_job_dependency AS e
                   WHERE e.job_id = ANY(%(ids)s::bigint[])
                     AND e.repair
                     AND e.state IS NULL)
    ORDER BY p.id
    FOR SHARE
), ended AS (
    SELECT id, status, result FROM parent WHERE status IN ('done', 'dead', 'cancelled')
), """
    + _RESOLVE
    + """
SELECT count(*) FROM resolved
"""
)

# The sweeper's repair: resolve edges marked for repair whose parent finished without
# resolving them (its dependant was enqueued while it ran, and the enqueuer died before
# JOB_RESOLVE_LATE; or a cascade stopped at CASCADE_DEPTH), one bounded batch of parents
# from pgqueue_job_dep_repair_idx, then as every other finishing statement (_RESOLVE).
# A parent whose row is gone counts as cancelled. SKIP LOCKED: several sweepers split it.
JOB_RESOLVE_MISSED = (
    """
WITH RECURSIVE """
    + _CLOCK
    + """, missed AS (
    SELECT DISTINCT e.parent_id AS id
    FROM pgqueue_job_dependency AS e
    WHERE e.repair
      AND e.state IS NULL
), finished_parent AS (
    SELECT p.id, p.status, p.result
    FROM pgqueue_job AS p
    WHERE p.id IN (SELECT id FROM missed)
      AND p.status IN ('done', 'dead', 'cancelled')
    ORDER BY p.id
    LIMIT %(batch_size)s
    FOR NO KEY UPDATE SKIP LOCKED
), ended AS (
    SELECT id, status, result FROM finished_parent
    UNION ALL
    (SELECT m.id, 'cancelled', NULL::jsonb
     FROM missed AS m
     WHERE NOT EXISTS (SELECT FROM pgqueue_job AS p WHERE p.id = m.id)
     LIMIT %(batch_size)s)
), """
    + _RESOLVE
    + """
SELECT (SELECT count(*) FROM ended), (SELECT count(*) FROM resolved)
"""
)

# Resolve the dependants of jobs %(ids)s just finished by a completion that found they
# had some it did not resolve (JOB_COMPLETE's "dependants": enqueued after the job was
# created). Their edges are marked for repair, so if this never runs (the worker died
# in between) the sweeper resolves them. Primary keys, then as _RESOLVE.
JOB_RESOLVE_PARENTS = (
    """
WITH RECURSIVE """
    + _CLOCK
    + """, ended AS (
    SELECT id, status, result
    FROM pgqueue_job
    WHERE id = ANY(%(ids)s::bigint[])
      AND status IN ('done', 'dead', 'cancelled')
), """
    + _RESOLVE
    + """
SELECT count(*) FROM resolved
"""
)

# Put back what a requeued (or just restored) job's failure had settled, one level of
# dependants: their edges from %(ids)s that it resolved dead or cancelled become
# unresolved again (parents_left + 1 each), and a dependant it had cancelled (status
# cancelled, no cancel_requested_at: no one asked) waits again, unless another parent of
# it is still dead or cancelled (read FOR SHARE: a failure committing meanwhile is
# seen). Returns the dependants that wait now, for the next level. Dependants locked in
# id order; pgqueue_job_dep_parent_idx.
JOB_RESTORE_DEPENDANTS = """
WITH src AS (
    SELECT unnest(%(ids)s::bigint[]) AS id
), candidate AS MATERIALIZED (
    SELECT d.id
    FROM pgqueue_job AS d
    WHERE d.id IN (SELECT e.job_id
                   FROM pgqueue_job_dependency AS e
                   WHERE e.parent_id IN (SELECT id FROM src)
                     AND e.state IN ('dead', 'cancelled'))
      AND (d.status = 'waiting'
           OR (d.status = 'cancelled' AND d.cancel_requested_at IS NULL))
    ORDER BY d.id
    FOR NO KEY UPDATE
), reset AS (
    UPDATE pgqueue_job_dependency AS e
    SET state = NULL,
        result = NULL
    FROM candidate AS c
    WHERE e.job_id = c.id
      AND e.parent_id IN (SELECT id FROM src)
      AND e.state IN ('dead', 'cancelled')
    RETURNING e.job_id
), counted AS (
    SELECT job_id, count(*)::int AS n FROM reset GROUP BY job_id
), restored AS (
    UPDATE pgqueue_job AS d
    SET parents_left = d.parents_left + c.n,
        status = CASE WHEN d.status = 'cancelled' AND NOT EXISTS (
                          SELECT FROM (SELECT x.state
                                       FROM pgqueue_job_dependency AS x
                                       WHERE x.job_id = d.id
                                         AND x.parent_id NOT IN (SELECT id FROM src)
                                       FOR SHARE) AS other
                          WHERE other.state IN ('dead', 'cancelled'))
                      THEN 'waiting' ELSE d.status END,
        finished_at = CASE WHEN d.status = 'cancelled' AND NOT EXISTS (
                          SELECT FROM (SELECT x.state
                                       FROM pgqueue_job_dependency AS x
                                       WHERE x.job_id = d.id
                                         AND x.parent_id NOT IN (SELECT id FROM src)
                                       FOR SHARE) AS other
                          WHERE other.state IN ('dead', 'cancelled'))
                      THEN NULL ELSE d.finished_at END
    FROM counted AS c
    WHERE d.id = c.job_id
    RETURNING d.id, d.status
)
SELECT id FROM restored WHERE status = 'waiting'
"""

# Jobs finished in the last %(window_seconds)s s per outcome and queue, at most %(cap)s
# of each (pgqueue_job_done_idx, _cancelled_idx, _dead_idx). The window's start is a
# scalar subquery, so it bounds each index's range instead of filtering a walk of it.
JOB_SAMPLE_FINISHED = """
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

# Store a running job's progress, fenced (only the owner of this attempt writes it).
# Primary-key update of one row; nothing else of the job changes.
JOB_SET_PROGRESS = (
    """
UPDATE pgqueue_job AS j
SET progress = %(progress)s::jsonb
FROM """
    + _OWNED_ONE
    + """
WHERE """
    + _FENCE
    + """
RETURNING j.id
"""
)

# A task snoozed: back to scheduled at the database's now + %(seconds)s (pending if 0),
# its attempt given back and the snooze counted, fenced; a job whose cancellation was
# requested ends 'cancelled', and what waits on it with it (_RESOLVE). Primary-key lookup.
JOB_SNOOZE = (
    """
WITH RECURSIVE """
    + _CLOCK
    + """, snoozed AS (
UPDATE pgqueue_job AS j
SET status = CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'
                  WHEN %(seconds)s::float8 > 0 THEN 'scheduled' ELSE 'pending' END,
    snoozes = j.snoozes + 1,
    run_at = CASE WHEN j.cancel_requested_at IS NULL
                  THEN clock.now + make_interval(secs => %(seconds)s::float8)
                  ELSE j.run_at END,
    """
    + _given_back("'cancellation requested while running; the task snoozed'")
    + """
FROM clock, """
    + _OWNED_ONE
    + """
WHERE """
    + _FENCE
    + """
RETURNING j.id, j.status
), ended AS (
    SELECT id, status, NULL::jsonb AS result FROM snoozed WHERE status = 'cancelled'
), """
    + _RESOLVE
    + """
SELECT status FROM snoozed
"""
)

# Lift a limit set at run time (the settings' entry of its key, if any, is in force
# again). Primary-key delete.
LIMIT_DELETE = """
DELETE FROM pgqueue_limit
WHERE key = %(key)s
RETURNING key
"""

# Set a limit at run time (concurrency and rate NULL: no limit on this key, whatever the
# settings declare). Primary-key upsert.
LIMIT_SET = """
INSERT INTO pgqueue_limit AS l (key, concurrency, rate, updated_at)
VALUES (%(key)s, %(concurrency)s, %(rate)s, coalesce(%(now)s::timestamptz, clock_timestamp()))
ON CONFLICT (key) DO UPDATE
SET concurrency = excluded.concurrency,
    rate = excluded.rate,
    updated_at = excluded.updated_at
"""

# Pause a queue: its row says since when (kept if it was paused already). Primary-key
# upsert; workers hear of it by FLOW_NOTIFY in the same transaction.
QUEUE_PAUSE = """
INSERT INTO pgqueue_queue AS q (name, paused_at, updated_at)
VALUES (%(name)s, coalesce(%(now)s::timestamptz, clock_timestamp()),
        coalesce(%(now)s::timestamptz, clock_timestamp()))
ON CONFLICT (name) DO UPDATE
SET paused_at = coalesce(q.paused_at, excluded.paused_at),
    updated_at = excluded.updated_at
RETURNING q.paused_at
"""

# Resume a queue (its row stays, not paused). Primary-key update; returns the row if it
# was paused.
QUEUE_RESUME = """
UPDATE pgqueue_queue AS q
SET paused_at = NULL,
    updated_at = coalesce(%(now)s::timestamptz, clock_timestamp())
WHERE q.name = %(name)s
  AND q.paused_at IS NOT NULL
RETURNING q.name
"""

# Delete the rate windows with no start left in them (flow claims write them again when
# their budget next starts a job), one bounded batch of pgqueue_rate_expires_idx. SKIP
# LOCKED: a claim may be writing one.
RATE_DELETE_CLOSED = """
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
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, clock_timestamp()) AS now
), entry AS (
    SELECT *
    FROM unnest(
        %(names)s::text[], %(crons)s::text[], %(timezones)s::text[],
        %(ticks)s::timestamptz[], %(keys)s::text[], %(backends)s::text[],
        %(queues)s::text[], %(tasks)s::text[], %(args)s::text[], %(kwargs)s::text[],
        %(priorities)s::int[], %(max_attempts)s::int[], %(concurrency_keys)s::text[],
        %(unique_fors)s::float8[]
    ) AS e(name, cron, timezone, tick, key, backend, queue, task, args, kwargs,
           priority, max_attempts, concurrency_key, unique_for)
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
    + _UNIQUE_WINDOW
    + """
    RETURNING k.queue, k.key, k.job_id
), inserted AS (
    INSERT INTO pgqueue_job AS j (
        id, backend, queue, task, args, kwargs, priority, status, attempts, max_attempts,
        run_at, idempotency_key, errors, created_at, concurrency_key
    )
    SELECT a.last_job_id, e.backend, e.queue, e.task, e.args::jsonb, e.kwargs::jsonb,
           e.priority, 'pending', 0, e.max_attempts, e.tick, e.key, '[]'::jsonb, clock.now,
           e.concurrency_key
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
DELETE FROM pgqueue_job_key AS k
USING unnest(%(queues)s::text[], %(keys)s::text[], %(job_ids)s::bigint[]) AS g(queue, key, job_id)
WHERE (k.kind, k.queue, k.key) = ('unique', g.queue, g.key)
  AND k.job_id = g.job_id
"""

# Make the entries' rows agree with the settings, locking only rows that differ (name
# order): a changed definition moves the last tick up only past %(grace)s s, a clock gone
# back rewinds it (the periodic how-to's table says why). New rows: ON CONFLICT DO NOTHING.
SCHEDULE_SYNC = """
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

# SESSION_CONFIGURE's statement_timeout for the current transaction only: behind a
# transaction pooler a session setting would stay on a server connection that another
# client gets next. No table.
SESSION_BOUND_TRANSACTION = """
SELECT set_config('statement_timeout', %(statement_timeout)s, true)
"""

# Label a worker's connection (application_name: which worker and role a backend
# serves) and bound its statements (NULL keeps the current bound). Behind a pooler only
# the label is set here; bounds then use SESSION_BOUND_TRANSACTION.
SESSION_CONFIGURE = """
SELECT set_config('application_name', %(application_name)s, false),
       set_config('statement_timeout',
                  coalesce(%(statement_timeout)s, current_setting('statement_timeout')),
                  false)
"""

# Set up a worker's claim connection (claims and promotions only): no bitmap or
# sequential scans and always the generic plan keep the prepared claims on their ordered
# index scans whatever the statistics say; asynchronous commit is safe since a lost
# claim leaves the job pending, and the job's durable completion flushes the claim first.
# No JIT: a flow claim's generic plan is costed high (its LIMITs are parameters) and
# would be compiled at every execution, for a statement that reads a few pages.
SESSION_CONFIGURE_CLAIM = """
SELECT set_config('enable_bitmapscan', 'off', false),
       set_config('enable_seqscan', 'off', false),
       set_config('plan_cache_mode', 'force_generic_plan', false),
       set_config('synchronous_commit', 'off', false),
       set_config('jit', 'off', false)
"""

# SESSION_CONFIGURE_CLAIM and a statement bound for the current transaction only
# (is_local = true), in one statement: the claim's set-up on a database behind a
# transaction pooler, where the session form would stay on a server connection that
# the pooler then hands to another client (whose commits would then not wait for the
# disk either). No table.
SESSION_CONFIGURE_CLAIM_LOCAL = """
SELECT set_config('statement_timeout', %(statement_timeout)s, true),
       set_config('enable_bitmapscan', 'off', true),
       set_config('enable_seqscan', 'off', true),
       set_config('plan_cache_mode', 'force_generic_plan', true),
       set_config('synchronous_commit', 'off', true),
       set_config('jit', 'off', true)
"""

# A flow claim on a connection not set up for claims (SESSION_CONFIGURE_CLAIM): no JIT
# for this transaction (see there why). No table.
SESSION_FLOW_LOCAL = """
SELECT set_config('jit', 'off', true)
"""

# A runner connection's own session settings (the worker's label, Django's TimeZone),
# read once before its first job: what SESSION_RESTORE_SETTINGS puts back. No table.
SESSION_GET_SETTINGS = """
SELECT coalesce(array_agg(name ORDER BY name), '{}') AS names,
       coalesce(array_agg(setting ORDER BY name), '{}') AS "values"
FROM pg_settings
WHERE source = 'session'
"""

# What a task can leave on a runner connection beyond its transaction (roles, settings
# that change what SQL means, advisory locks, cursors, SQL PREPAREs, LISTEN, temp
# tables), read before the first job and after each job that ran SQL (reliability.md).
SESSION_GET_STATE = """
SELECT current_user AS "role",
       session_user AS "session authorization",
       current_setting('search_path') AS "search_path",
       current_setting('statement_timeout') AS "statement_timeout",
       current_setting('lock_timeout') AS "lock_timeout",
       current_setting('idle_in_transaction_session_timeout')
           AS "idle_in_transaction_session_timeout",
       current_setting('default_transaction_isolation') AS "default_transaction_isolation",
       current_setting('default_transaction_read_only') AS "default_transaction_read_only",
       current_setting('session_replication_role') AS "session_replication_role",
       current_setting('synchronous_commit') AS "synchronous_commit",
       current_setting('row_security') AS "row_security",
       current_setting('TimeZone') AS "TimeZone",
       current_setting('DateStyle') AS "DateStyle",
       EXISTS (SELECT FROM pg_locks
               WHERE locktype = 'advisory' AND pid = pg_backend_pid()) AS "advisory locks",
       EXISTS (SELECT FROM pg_cursors WHERE name <> '') AS "open cursors",
       EXISTS (SELECT FROM pg_prepared_statements WHERE from_sql) AS "prepared statements",
       EXISTS (SELECT FROM pg_listening_channels()) AS "LISTEN",
       CASE WHEN pg_my_temp_schema() = 0 THEN false
            ELSE EXISTS (SELECT FROM pg_class WHERE relnamespace = pg_my_temp_schema())
       END AS "temporary tables"
"""

# Subscribe the listener's connection to the wake-up channel. A template, not a query
# with parameters: LISTEN takes an identifier, so the caller fills {channel} in with
# psycopg.sql.Identifier(settings.NOTIFY_CHANNEL). No table.
SESSION_LISTEN = """
LISTEN {channel}
"""

# Prove an idle LISTEN connection is still alive: a socket can die silently while the
# listener only waits for notifications, and a cheap query raises if it did. No table.
SESSION_PING = """
SELECT 1
"""

# Reset a pooled server session before its client connection is dropped (closing resets
# nothing behind a pooler): DISCARD ALL's parts and a reseed, one string so one implicit
# transaction, hence one server connection. No table.
SESSION_RESET = """
SET SESSION AUTHORIZATION DEFAULT;
RESET ALL;
CLOSE ALL;
UNLISTEN *;
SELECT pg_advisory_unlock_all();
DISCARD PLANS;
DISCARD SEQUENCES;
DISCARD TEMP;
DEALLOCATE ALL;
SELECT setseed(('x' || left(gen_random_uuid()::text, 8))::bit(32)::int / 2147483648.0)
"""

# After a job that ran SQL: every setting back to its value at connection start (the
# role is compared, not reset); SESSION_RESTORE_SETTINGS then puts the connection's own
# back. One statement instead of reading pg_settings per job. No table.
SESSION_RESET_SETTINGS = """
RESET ALL
"""

# Put the connection's own settings (SESSION_GET_SETTINGS) back after the reset, and
# reseed random() (a task's setseed() cannot be read back). Pipelined with the check and
# the reset: one round trip. No table.
SESSION_RESTORE_SETTINGS = """
SELECT (SELECT count(set_config(b.name, b.value, false))
        FROM unnest(%(names)s::text[], %(values)s::text[]) AS b(name, value)) AS restored,
       setseed(('x' || left(gen_random_uuid()::text, 8))::bit(32)::int / 2147483648.0)
"""

# Forget a worker that exits cleanly (the last thing it does). Primary-key lookup.
WORKER_DELETE = """
DELETE FROM pgqueue_worker
WHERE id = %(id)s
"""

# Delete the rows of workers lost for longer than %(keep_seconds)s past their lease, one
# bounded batch (LIMIT, SKIP LOCKED: several sweepers may run).
WORKER_DELETE_LOST = """
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

# Every registered worker, with whether it is lost (not seen for longer than its own
# lease) judged by the database clock. The table holds one row per worker process, so
# a plain ordered scan; %(limit)s bounds it anyway.
WORKER_GET_ALL = """
SELECT id, hostname, pid, queues, concurrency, lease_seconds, version, started_at,
       last_seen_at, jobs_held, jobs_done, jobs_failed,
       last_seen_at + make_interval(secs => lease_seconds)
           < coalesce(%(now)s::timestamptz, clock_timestamp()) AS lost,
       coalesce(%(now)s::timestamptz, clock_timestamp()) - last_seen_at AS unseen_for
FROM pgqueue_worker
ORDER BY hostname, id
LIMIT %(limit)s
"""

# Register a worker process at start (or again, after the sweeper deleted a worker that
# was cut off and came back). A restarted worker reusing its id takes the row over with
# a fresh start time. Primary-key upsert.
WORKER_REGISTER = """
INSERT INTO pgqueue_worker AS w (
    id, hostname, pid, queues, concurrency, lease_seconds, version,
    started_at, last_seen_at, jobs_held, jobs_done, jobs_failed
)
VALUES (
    %(id)s, %(hostname)s, %(pid)s, %(queues)s::text[], %(concurrency)s, %(lease_seconds)s,
    %(version)s, coalesce(%(now)s::timestamptz, clock_timestamp()),
    coalesce(%(now)s::timestamptz, clock_timestamp()), %(jobs_held)s, %(jobs_done)s,
    %(jobs_failed)s
)
ON CONFLICT (id) DO UPDATE
SET hostname = excluded.hostname,
    pid = excluded.pid,
    queues = excluded.queues,
    concurrency = excluded.concurrency,
    lease_seconds = excluded.lease_seconds,
    version = excluded.version,
    started_at = CASE WHEN %(restart)s THEN excluded.started_at ELSE w.started_at END,
    last_seen_at = excluded.last_seen_at,
    jobs_held = excluded.jobs_held,
    jobs_done = excluded.jobs_done,
    jobs_failed = excluded.jobs_failed
"""

# The heartbeat's "still alive": last seen now, with how many jobs the worker holds and
# its running totals. Primary-key update, one per beat; zero rows means the row is gone
# (pruned while the worker was cut off), and the worker registers again.
WORKER_TOUCH = """
UPDATE pgqueue_worker
SET last_seen_at = coalesce(%(now)s::timestamptz, clock_timestamp()),
    jobs_held = %(jobs_held)s,
    jobs_done = %(jobs_done)s,
    jobs_failed = %(jobs_failed)s
WHERE id = %(id)s
"""
