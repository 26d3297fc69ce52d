"""Enqueueing many jobs through COPY and bounded multi-row inserts. Run by
``django_pgqueue.bulk`` only.
"""

from __future__ import annotations

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
    ("tags", "text[]"),
)


_BULK_COLUMN_LIST = ", ".join(name for name, _ in BULK_COLUMNS)


JOB_BULK_COPY = (
    """
-- name: JOB_BULK_COPY
-- Stream one bounded batch of jobs without idempotency keys, in binary. COPY has no ON
-- CONFLICT: keyed batches take JOB_BULK_INSERT_DEDUPE.
-- moves: new -> pending | scheduled
COPY pgqueue_job ("""
    + _BULK_COLUMN_LIST
    + ") FROM STDIN (FORMAT BINARY)\n"
)


JOB_BULK_COPY_WITH_IDS = (
    """
-- name: JOB_BULK_COPY_WITH_IDS
-- JOB_BULK_COPY with ids taken from the sequence first (JOB_BULK_IDS), so each job can
-- be announced with its real id.
-- moves: new -> pending | scheduled
COPY pgqueue_job (id, """
    + _BULK_COLUMN_LIST
    + ") FROM STDIN (FORMAT BINARY)\n"
)


# Take %(count)s ids from the jobs' id sequence in one round trip, for a batch that is
# then written with explicit ids (JOB_BULK_COPY_WITH_IDS, JOB_BULK_INSERT_DEDUPE_WITH_IDS,
# a workflow's JOB_BULK_COPY_WORKFLOW). No table is read; nextval never blocks and never
# hands an id out twice. The sequence is looked up once (an InitPlan), not per id.
JOB_BULK_IDS = """
-- name: JOB_BULK_IDS
-- Take count ids from the jobs' id sequence in one round trip; no table is read,
-- nextval never blocks and never hands an id out twice.
SELECT nextval((SELECT pg_get_serial_sequence('pgqueue_job', 'id')::regclass))
FROM generate_series(1, %(count)s)
"""


JOB_BULK_INSERT_DEDUPE = """
-- name: JOB_BULK_INSERT_DEDUPE
-- Insert one bounded batch holding idempotency keys, skipping those a live job of the
-- queue holds (pgqueue_job_idempotency_uniq); one array per column (a job's tags as
-- array text), the first duplicate wins.
-- moves: new -> pending | scheduled
INSERT INTO pgqueue_job AS j (
    backend, queue, task, args, kwargs, priority, status, max_attempts,
    run_at, created_at, errors, idempotency_key, concurrency_key, tags
)
SELECT r.backend, r.queue, r.task, r.args::jsonb, r.kwargs::jsonb, r.priority, r.status,
       r.max_attempts, r.run_at, %(created_at)s::timestamptz, '[]'::jsonb, r.idempotency_key,
       r.concurrency_key, r.tags::text[]
FROM unnest(
    %(backend)s::text[], %(queue)s::text[], %(task)s::text[], %(args)s::text[],
    %(kwargs)s::text[], %(priority)s::int[], %(status)s::text[], %(max_attempts)s::int[],
    %(run_at)s::timestamptz[], %(idempotency_key)s::text[], %(concurrency_key)s::text[],
    %(tags)s::text[]
) WITH ORDINALITY AS r(
    backend, queue, task, args, kwargs, priority, status, max_attempts,
    run_at, idempotency_key, concurrency_key, tags, ord
)
ORDER BY r.ord
ON CONFLICT (queue, idempotency_key)
    WHERE idempotency_key IS NOT NULL
      AND status IN ('pending', 'scheduled', 'running')
    DO NOTHING
"""


JOB_BULK_INSERT_DEDUPE_WITH_IDS = """
-- name: JOB_BULK_INSERT_DEDUPE_WITH_IDS
-- JOB_BULK_INSERT_DEDUPE with ids taken from the sequence first; RETURNING names the
-- ids actually inserted.
-- moves: new -> pending | scheduled
INSERT INTO pgqueue_job AS j (
    id, backend, queue, task, args, kwargs, priority, status, max_attempts,
    run_at, created_at, errors, idempotency_key, concurrency_key, tags
)
SELECT r.id, r.backend, r.queue, r.task, r.args::jsonb, r.kwargs::jsonb, r.priority,
       r.status, r.max_attempts, r.run_at, %(created_at)s::timestamptz, '[]'::jsonb,
       r.idempotency_key, r.concurrency_key, r.tags::text[]
FROM unnest(
    %(id)s::bigint[], %(backend)s::text[], %(queue)s::text[], %(task)s::text[],
    %(args)s::text[], %(kwargs)s::text[], %(priority)s::int[], %(status)s::text[],
    %(max_attempts)s::int[], %(run_at)s::timestamptz[], %(idempotency_key)s::text[],
    %(concurrency_key)s::text[], %(tags)s::text[]
) WITH ORDINALITY AS r(
    id, backend, queue, task, args, kwargs, priority, status, max_attempts,
    run_at, idempotency_key, concurrency_key, tags, ord
)
ORDER BY r.ord
ON CONFLICT (queue, idempotency_key)
    WHERE idempotency_key IS NOT NULL
      AND status IN ('pending', 'scheduled', 'running')
    DO NOTHING
RETURNING j.id
"""
