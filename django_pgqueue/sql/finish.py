"""A worker's fenced writes to the jobs it holds: extend their leases, complete them,
record a failure, give them back unrun. Run by ``django_pgqueue.finish`` only.
"""

from __future__ import annotations

from .common import CLOCK, ENTRY, FENCE, KEEP_NEWEST, LEASE, OWNED_ONE, cancelled_entry, given_back
from .resolve import HAS_DEPENDANTS, RESOLVE


def _done_set(result: str) -> str:
    """The SET of a successful completion (alias j, with clock): done, or cancelled with
    its error entry if a cancel was asked while it ran. ``result``: the result's SQL."""
    return (
        "SET status = CASE WHEN j.cancel_requested_at IS NULL THEN 'done' ELSE 'cancelled' END,"
        f"\n    result = {result},\n    finished_at = clock.now,\n    lease_expires_at = NULL,"
        "\n    errors = CASE WHEN j.cancel_requested_at IS NULL THEN j.errors"
        "\n                  ELSE j.errors || jsonb_build_array("
        + cancelled_entry("'cancellation requested while running; the task returned'")
        + ") END"
    )


# The batch of a batched completion, one row per job in the caller's (id) order: what
# FENCE checks (id, attempt, claimed_at), its result, and its 1-based position.
_OWNED_BATCH = """unnest(%(ids)s::bigint[], %(attempts)s::int[], %(claimed_at)s::timestamp[],
       %(results)s::jsonb[]) WITH ORDINALITY AS owned(id, attempt, claimed_at, result, ord)"""


# Mark a job done with its result, only while this worker still owns this attempt (or
# 'cancelled' if its cancellation was requested). Primary-key lookup; the fence makes a
# late (zombie) completion update zero rows. For a job created without dependants
# (has_dependants false): "dependants" says whether some were enqueued since, which the
# caller then resolves (JOB_RESOLVE_PARENTS); JOB_COMPLETE_RELEASING is for the others.
JOB_COMPLETE = (
    """
-- name: JOB_COMPLETE
-- Mark a job done with its result, fenced: a late (zombie) completion changes nothing;
-- cancelled instead if a cancel was asked. Says whether it has dependants to resolve.
-- moves: running -> done | cancelled
WITH """
    + CLOCK
    + """
UPDATE pgqueue_job AS j
"""
    + _done_set("%(result)s::jsonb")
    + """
FROM clock, """
    + OWNED_ONE
    + """
WHERE """
    + FENCE
    + """
RETURNING j.id, j.status, """
    + HAS_DEPENDANTS
    + """ AS dependants
"""
)


# Mark many jobs done in one statement (the batched completion), each fenced. The caller
# sorts by id, JOB_EXTEND_LEASES's lock order; the 1-based position and new status (done
# or cancelled) of every row changed come back (a missing one is a lost lease), and as
# for JOB_COMPLETE whether it has dependants to resolve. For jobs created without any.
JOB_COMPLETE_MANY = (
    """
-- name: JOB_COMPLETE_MANY
-- Mark many jobs done in one statement, each fenced (the batched completion); ids in
-- ascending order, JOB_EXTEND_LEASES's lock order.
-- moves: running -> done | cancelled
WITH """
    + CLOCK
    + """
UPDATE pgqueue_job AS j
"""
    + _done_set("owned.result")
    + """
FROM clock, """
    + _OWNED_BATCH
    + """
WHERE """
    + FENCE
    + """
RETURNING owned.ord, j.status, """
    + HAS_DEPENDANTS
    + """ AS dependants
"""
)


# JOB_COMPLETE_MANY for a batch holding a job created with dependants (a workflow's):
# what waits on them is resolved in the same statement (RESOLVE), so a dependant is
# released in its last parent's completion's transaction, and a zombie, which changes no
# row, releases nothing twice. Only these batches pay for the fragment's bigger plan.
JOB_COMPLETE_MANY_RELEASING = (
    """
-- name: JOB_COMPLETE_MANY_RELEASING
-- JOB_COMPLETE_MANY for a batch holding a workflow's parent: what waits on them is
-- resolved in the same statement (RESOLVE).
-- moves: running -> done | cancelled
-- moves: waiting -> pending | scheduled | cancelled
WITH RECURSIVE """
    + CLOCK
    + """, ended AS (
    UPDATE pgqueue_job AS j
    """
    + _done_set("owned.result")
    + """
    FROM clock, """
    + _OWNED_BATCH
    + """
    WHERE """
    + FENCE
    + """
    RETURNING j.id, j.status, j.result, owned.ord
), """
    + RESOLVE
    + """
SELECT ord, status FROM ended
"""
)


JOB_COMPLETE_RELEASING = (
    """
-- name: JOB_COMPLETE_RELEASING
-- JOB_COMPLETE for a job created with dependants: resolves them in the same statement
-- (RESOLVE), fenced.
-- moves: running -> done | cancelled
-- moves: waiting -> pending | scheduled | cancelled
WITH RECURSIVE """
    + CLOCK
    + """, ended AS (
    UPDATE pgqueue_job AS j
    """
    + _done_set("%(result)s::jsonb")
    + """
    FROM clock, """
    + OWNED_ONE
    + """
    WHERE """
    + FENCE
    + """
    RETURNING j.id, j.status, j.result
), """
    + RESOLVE
    + """
SELECT id, status FROM ended
"""
)


JOB_EXTEND_LEASES = (
    """
-- name: JOB_EXTEND_LEASES
-- Push the leases this worker still owns further into the future, fenced; says which
-- are still owned and which were asked to cancel.
WITH """
    + CLOCK
    + """
UPDATE pgqueue_job AS j
SET lease_expires_at = """
    + LEASE
    + """
FROM clock,
     unnest(%(ids)s::bigint[], %(attempts)s::int[], %(claimed_at)s::timestamp[])
     AS owned(id, attempt, claimed_at)
WHERE """
    + FENCE
    + """
RETURNING j.id, j.cancel_requested_at IS NOT NULL AS cancel_requested
"""
)


# Record a failed attempt, fenced: retry after %(retry_delay)s s (NULL: exponential
# backoff and jitter) while attempts remain (and %(retry)s), else dead-letter; a job whose
# cancellation was requested ends 'cancelled' with a JobCancelled entry after the task's
# own error. Keeps the newest %(keep_errors)s error entries. A job that ends dead or
# cancelled cancels what waits on it, or releases what runs anyway (RESOLVE).
JOB_FAIL = (
    """
-- name: JOB_FAIL
-- Record a failed attempt, fenced: retry later while attempts remain, else dead-letter
-- (cancelled if a cancel was asked); what waits on a job that ends is resolved
-- (RESOLVE).
-- moves: running -> scheduled | dead | cancelled
-- moves: waiting -> pending | scheduled | cancelled
WITH RECURSIVE """
    + CLOCK
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
    + KEEP_NEWEST.format(
        entries="j.errors || jsonb_build_array("
        + ENTRY.format(
            path="%(error_path)s::text",
            traceback="%(error_traceback)s::text",
            worker_id="j.lease_owner",
            attempt="j.attempts",
        )
        + ") || CASE WHEN j.cancel_requested_at IS NOT NULL"
        " AND %(error_path)s::text <> 'django_pgqueue.exceptions.JobCancelled'"
        " THEN jsonb_build_array("
        + cancelled_entry("'cancellation requested while running'")
        + ") ELSE '[]'::jsonb END"
    )
    + """
FROM clock, """
    + OWNED_ONE
    + """
WHERE """
    + FENCE
    + """
RETURNING j.id, j.status
), ended AS (
    SELECT id, status, NULL::jsonb AS result FROM failed WHERE status IN ('dead', 'cancelled')
), """
    + RESOLVE
    + """
SELECT status FROM failed
"""
)


JOB_RELEASE = (
    """
-- name: JOB_RELEASE
-- Give a claimed job back unrun without charging the attempt (shutdown before it
-- started), fenced; cancelled instead if a cancel was asked, and what waits on it with
-- it.
-- moves: running -> pending | cancelled
-- moves: waiting -> pending | scheduled | cancelled
WITH RECURSIVE """
    + CLOCK
    + """, given AS (
UPDATE pgqueue_job AS j
SET status = CASE WHEN j.cancel_requested_at IS NULL THEN 'pending' ELSE 'cancelled' END,
    """
    + given_back("'cancelled before it ran (released at shutdown)'")
    + """
FROM clock, """
    + OWNED_ONE
    + """
WHERE """
    + FENCE
    + """
RETURNING j.id, j.status
), ended AS (
    SELECT id, status, NULL::jsonb AS result FROM given WHERE status = 'cancelled'
), """
    + RESOLVE
    + """
SELECT id FROM given
"""
)
