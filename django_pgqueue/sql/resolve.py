"""What a job that ends does to the jobs that wait on it: the fragment ``RESOLVE`` that
every statement ending a job carries (finish, operate, sweep, workflow), and its parts.
"""

from __future__ import annotations

from .common import cancelled_entry

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
ANY_UNRESOLVED = """(SELECT u.parent_id
         FROM pgqueue_job_dependency AS u
         WHERE u.state IS NULL
         ORDER BY u.parent_id
         LIMIT 1) IS NOT NULL"""


# In a completion's RETURNING: whether the job j has unresolved edges, so dependants the
# statement did not resolve (see JOB_COMPLETE). One probe of the partial index per row,
# none while no edge is unresolved anywhere.
HAS_DEPENDANTS = (
    "CASE WHEN "
    + ANY_UNRESOLVED
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
RESOLVE = (
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
    + ANY_UNRESOLVED
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
    + cancelled_entry(
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
