"""Jobs that depend on jobs: a workflow's graph stored, a dependant enqueued, and the
repairs of edges a finishing statement could not see. Run by
``django_pgqueue.workflows`` only.
"""

from __future__ import annotations

from .bulk import BULK_COLUMNS
from .common import CLOCK, cancelled_entry
from .resolve import RESOLVE

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


JOB_BULK_COPY_EDGES = (
    """
-- name: JOB_BULK_COPY_EDGES
-- Stream one bounded batch of a workflow's edges, in binary, in the transaction that
-- COPYs its jobs: they commit together.
COPY pgqueue_job_dependency ("""
    + ", ".join(name for name, _ in EDGE_COLUMNS)
    + ") FROM STDIN (FORMAT BINARY)\n"
)


JOB_BULK_COPY_WORKFLOW = (
    """
-- name: JOB_BULK_COPY_WORKFLOW
-- Stream one bounded batch of a workflow's jobs, ids taken from the sequence first so
-- its edges can name them, in binary.
-- moves: new -> waiting | pending | scheduled
COPY pgqueue_job ("""
    + ", ".join(name for name, _ in WORKFLOW_COLUMNS)
    + ") FROM STDIN (FORMAT BINARY)\n"
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
-- name: JOB_ENQUEUE_DEPENDANT
-- Insert one job that depends on existing jobs, with its edges: it waits, starts at
-- once, or is cancelled, by what its parents (locked FOR KEY SHARE) are.
-- moves: new -> waiting | pending | scheduled | cancelled
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
        parents_left, parent_results, on_parent_failure, workflow_id, concurrency_key, tags
    )
    SELECT %(backend)s, %(queue)s, %(task)s,
           CASE WHEN x.status IN ('pending', 'scheduled') AND %(parent_results)s::text IS NOT NULL
                THEN jsonb_build_array(x.results) || %(args)s::jsonb
                ELSE %(args)s::jsonb END,
           %(kwargs)s::jsonb, %(priority)s, x.status, 0, %(max_attempts)s,
           coalesce(x.run_at, x.now), %(idempotency_key)s,
           CASE WHEN x.status = 'cancelled' THEN jsonb_build_array("""
    + cancelled_entry(
        "'parent job ' || x.failed_parent || ' ended ' || x.failed_state"
        " || ' before this job was enqueued'",
        worker_id="''",
        attempt="0",
    ).replace("clock.now", "x.now")
    + """)
                ELSE '[]'::jsonb END,
           x.now, CASE WHEN x.status = 'cancelled' THEN x.now END, %(trace_context)s::jsonb,
           x.left_, %(parent_results)s::text, %(on_parent_failure)s::text,
           coalesce(%(workflow_id)s::bigint, x.workflow_id), %(concurrency_key)s,
           %(tags)s::text[]
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


# Insert a small workflow (chain, group) in one statement: its jobs from one array per
# column (ids drawn here, in node order; the first is the workflow's id) and its edges,
# which name nodes by their 1-based position. A bounded multi-row insert: a workflow
# larger than a COPY batch goes through JOB_BULK_COPY_WORKFLOW instead. NOTIFY at
# commit once per queue of a job that can start now. No index read.
JOB_ENQUEUE_WORKFLOW = """
-- name: JOB_ENQUEUE_WORKFLOW
-- Insert a small workflow (chain, group) in one statement: its jobs from one array per
-- column and its edges; a larger one goes through COPY.
-- moves: new -> waiting | pending | scheduled
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
        %(concurrency_key)s::text[], %(tags)s::text[]
    ) WITH ORDINALITY AS n(
        backend, queue, task, args, kwargs, priority, max_attempts, run_at, parents_left,
        parent_results, on_parent_failure, has_dependants, concurrency_key, tags, ord
    )
    ORDER BY n.ord
), job AS (
    INSERT INTO pgqueue_job AS j (
        id, backend, queue, task, args, kwargs, priority, status, attempts, max_attempts,
        run_at, errors, created_at, parents_left, parent_results, on_parent_failure,
        workflow_id, has_dependants, concurrency_key, tags
    )
    SELECT n.id, n.backend, n.queue, n.task, n.args::jsonb, n.kwargs::jsonb, n.priority,
           CASE WHEN n.parents_left IS NOT NULL THEN 'waiting'
                WHEN n.run_at > clock.now THEN 'scheduled'
                ELSE 'pending' END,
           0, n.max_attempts, coalesce(n.run_at, clock.now), '[]'::jsonb, clock.now,
           n.parents_left, n.parent_results, n.on_parent_failure,
           (SELECT min(id) FROM node), n.has_dependants, n.concurrency_key,
           n.tags::text[]
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


# Resolve the edges marked for repair of the given dependants whose parent has finished,
# right after the transaction that enqueued them committed: a parent that completed
# meanwhile, on a snapshot older than that commit, did not see them. The parents are
# read FOR SHARE, unfiltered: a completion that already wrote its row is waited for and
# its row read. (One whose row write comes after this read is the sweeper's:
# JOB_RESOLVE_MISSED.) Then as every finishing statement (RESOLVE). Primary keys.
JOB_RESOLVE_LATE = (
    """
-- name: JOB_RESOLVE_LATE
-- Resolve the repair edges of dependants right after their enqueue committed: a parent
-- that finished meanwhile, on an older snapshot, did not see them.
-- moves: waiting -> pending | scheduled | cancelled
WITH RECURSIVE """
    + CLOCK
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
    + RESOLVE
    + """
SELECT count(*) FROM resolved
"""
)


# The sweeper's repair: resolve edges marked for repair whose parent finished without
# resolving them (its dependant was enqueued while it ran, and the enqueuer died before
# JOB_RESOLVE_LATE; or a cascade stopped at CASCADE_DEPTH), one bounded batch of parents
# from pgqueue_job_dep_repair_idx, then as every other finishing statement (RESOLVE).
# A parent whose row is gone counts as cancelled: retention never deletes a parent
# with such an edge (JOB_DELETE_FINISHED_LOCKED re-checks under its lock), so it was
# deleted by hand, its outcome unknown. SKIP LOCKED: several sweepers split it.
JOB_RESOLVE_MISSED = (
    """
-- name: JOB_RESOLVE_MISSED
-- The sweeper's repair: resolve repair edges whose parent finished without resolving
-- them, one bounded batch of parents, SKIP LOCKED.
-- moves: waiting -> pending | scheduled | cancelled
WITH RECURSIVE """
    + CLOCK
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
    + RESOLVE
    + """
SELECT (SELECT count(*) FROM ended), (SELECT count(*) FROM resolved)
"""
)


# Resolve the dependants of jobs %(ids)s just finished by a completion that found they
# had some it did not resolve (JOB_COMPLETE's "dependants": enqueued after the job was
# created). Their edges are marked for repair, so if this never runs (the worker died
# in between) the sweeper resolves them. Primary keys, then as RESOLVE.
JOB_RESOLVE_PARENTS = (
    """
-- name: JOB_RESOLVE_PARENTS
-- Resolve the dependants of jobs a completion just finished, which got them after they
-- were created (JOB_COMPLETE's dependants).
-- moves: waiting -> pending | scheduled | cancelled
WITH RECURSIVE """
    + CLOCK
    + """, ended AS (
    SELECT id, status, result
    FROM pgqueue_job
    WHERE id = ANY(%(ids)s::bigint[])
      AND status IN ('done', 'dead', 'cancelled')
), """
    + RESOLVE
    + """
SELECT count(*) FROM resolved
"""
)


# The sweeper's repair of edges that no finishing statement resolved although their
# parent finished: a worker of an older release (a rolling upgrade) finished it without
# knowing of dependants, and its edges are not marked for repair. One bounded batch of
# finished parents with an unresolved edge: the parents of unresolved edges first
# (pgqueue_job_dep_unresolved_idx, materialized: no plan walks the jobs table), then
# each by primary key; a cost in unresolved edges, so the sweeper runs it seldom.
# Then as every finishing statement (RESOLVE), which resolves each edge once whoever
# else is at it. SKIP LOCKED: several sweepers split it.
JOB_RESOLVE_STRANDED = (
    """
-- name: JOB_RESOLVE_STRANDED
-- The sweeper's repair of unresolved edges whose parent finished all the same (a worker
-- of an older release finished it), one bounded batch of parents, SKIP LOCKED.
-- moves: waiting -> pending | scheduled | cancelled
WITH RECURSIVE """
    + CLOCK
    + """, stranded_parent AS MATERIALIZED (
    SELECT DISTINCT e.parent_id AS id
    FROM pgqueue_job_dependency AS e
    WHERE e.state IS NULL
    ORDER BY e.parent_id
), stranded AS (
    SELECT p.id, p.status, p.result
    FROM stranded_parent AS c
    JOIN pgqueue_job AS p ON p.id = c.id
    WHERE p.status IN ('done', 'dead', 'cancelled')
    LIMIT %(batch_size)s
    FOR NO KEY UPDATE OF p SKIP LOCKED
), ended AS (
    SELECT id, status, result FROM stranded
), """
    + RESOLVE
    + """
SELECT (SELECT count(*) FROM ended), (SELECT count(*) FROM resolved)
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
-- name: JOB_RESTORE_DEPENDANTS
-- Put back what a requeued job's failure had settled, one level of dependants: their
-- edges unresolved again, and a dependant it had cancelled waits again.
-- moves: cancelled -> waiting
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
