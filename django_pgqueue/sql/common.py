"""Fragments of SQL text that statements of several families share, each written once:
the clock, the lease, the fence of a worker's write, an error entry, the lease of claimed
candidates, the ranges a resumed claim walks, and the key rows of keyed enqueues.
"""

from __future__ import annotations

# The database's clock as a CTE; %(now)s pins it in tests.
CLOCK = "clock AS (SELECT coalesce(%(now)s::timestamptz, clock_timestamp()) AS now)"


# A lease: lease_seconds from the database's now (claims and heartbeats).
LEASE = "clock.now + make_interval(secs => %(lease_seconds)s)"


# The fence of every worker write: the job is running, leased to this worker, at the
# attempt and claim time the worker holds (a NULL attempt, from extend_leases given
# plain ids, fences on the owner only). "(status = 'running') IS TRUE" keeps the
# planner on the primary key instead of reading pgqueue_job_lease_idx.
FENCE = """j.id = owned.id
  AND (j.status = 'running') IS TRUE
  AND j.lease_owner = %(worker_id)s
  AND (owned.attempt IS NULL
       OR (j.attempts = owned.attempt
           AND j.last_attempted_at::timestamp = owned.claimed_at))"""


# The one job a single-row worker write is fenced on.
OWNED_ONE = """(VALUES (%(id)s::bigint, %(attempt)s::int, %(claimed_at)s::timestamp))
     AS owned(id, attempt, claimed_at)"""


# One entry of a job's errors list (Django's TaskError fields, plus who and when).
ENTRY = """jsonb_build_object(
        'exception_class_path', {path},
        'traceback', {traceback},
        'worker_id', {worker_id},
        'attempt', {attempt},
        'at', clock.now)"""


def cancelled_entry(
    why: str, worker_id: str = "j.lease_owner", attempt: str = "j.attempts"
) -> str:
    """The error entry of a job that ends cancelled; ``why`` is SQL text."""
    return ENTRY.format(
        path="'django_pgqueue.exceptions.JobCancelled'",
        traceback="'django_pgqueue.exceptions.JobCancelled: ' || " + why,
        worker_id=worker_id,
        attempt=attempt,
    )


# The newest %(keep_errors)s entries of a jsonb array of error entries.
KEEP_NEWEST = """(
        SELECT coalesce(jsonb_agg(e.value ORDER BY e.ordinality), '[]'::jsonb)
        FROM (SELECT {entries} AS entries) AS x,
             jsonb_array_elements(x.entries) WITH ORDINALITY AS e
        WHERE e.ordinality > jsonb_array_length(x.entries) - %(keep_errors)s)"""


# A debounce key's job has not started yet (k is the key row).
WAITING = """EXISTS (SELECT FROM pgqueue_job AS w
                WHERE w.id = k.job_id AND w.status IN ('pending', 'scheduled'))"""


# What every claim does with its candidates (the CTE "candidate", beside "clock"):
# lease them to this worker and charge the attempt. They are leased by primary key
# (= ANY of their array), never joined: on a claim connection the claims are prepared
# with one generic plan, which cannot know that the LIMIT is small, and would join by
# walking the primary key from its start.
LEASE_CANDIDATES = f"""
UPDATE pgqueue_job AS j
SET status = 'running',
    lease_owner = %(worker_id)s,
    lease_expires_at = {LEASE},
    attempts = j.attempts + 1,
    started_at = coalesce(j.started_at, clock.now),
    last_attempted_at = clock.now
FROM clock
WHERE j.id = ANY (ARRAY(SELECT id FROM candidate))
RETURNING j.*
"""


# The three ranges a resumed claim walks, in claim order, each lazily, from its own
# start in the claim index: higher priority than the position's, the same priority
# after its id, lower. {p} and {i}: the position's priority and id.
RESUME_RANGES = (
    ("above", "priority > {p}"),
    ("level", "priority = {p} AND id > {i}"),
    ("below", "priority < {p}"),
)


def resume_ranges(template: str, priority: str, job_id: str) -> str:
    """The RESUME_RANGES as CTEs of ``template``, for a position given as SQL."""
    return ", ".join(
        template.format(name=name, range=where.format(p=priority, i=job_id))
        for name, where in RESUME_RANGES
    )


# The upsert of a unique_for window's row (kind 'unique', alias k): a window that closed
# takes the new job and a new window from its creation; an open one keeps its job,
# which RETURNING then names. Concurrent upserts of one key take turns on the row.
UNIQUE_WINDOW = """    ON CONFLICT (kind, queue, key) DO UPDATE
    SET job_id = CASE WHEN k.expires_at <= excluded.created_at
                      THEN excluded.job_id ELSE k.job_id END,
        created_at = CASE WHEN k.expires_at <= excluded.created_at
                          THEN excluded.created_at ELSE k.created_at END,
        expires_at = CASE WHEN k.expires_at <= excluded.created_at
                          THEN excluded.expires_at ELSE k.expires_at END"""


def given_back(why: str) -> str:
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
        + cancelled_entry(why, attempt="j.attempts - 1")
        + ") END"
    )
