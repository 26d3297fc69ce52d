"""What the migrations' ``BrieflyLocked`` operation asks the database: its lock timeout,
and who holds the jobs table when it gives up. Run by ``django_pgqueue.migration_ops``
only.
"""

from __future__ import annotations

# The sessions holding a lock on the jobs table granted, for the error of a migration
# that gave up waiting: pid, state, transaction start and the start of the query.
MIGRATION_LOCK_HOLDERS = """
-- name: MIGRATION_LOCK_HOLDERS
-- Who holds a lock on the jobs table (but this session): named in the error of a
-- migration that could not get its own.
SELECT string_agg(DISTINCT concat('pid ', a.pid, ' (', a.state, ', since ', a.xact_start,
                                  ': ', left(a.query, 60), ')'), '; ')
FROM pg_locks AS l
JOIN pg_stat_activity AS a ON a.pid = l.pid
WHERE l.relation = 'pgqueue_job'::regclass
  AND l.granted
  AND a.pid <> pg_backend_pid()
"""


# Set lock_timeout for the current transaction only (is_local), and return the value it
# had, read first (a materialized CTE), to be put back afterwards.
MIGRATION_LOCK_TIMEOUT = """
-- name: MIGRATION_LOCK_TIMEOUT
-- Set the transaction's lock_timeout for one attempt of a migration's operation;
-- return the value it had.
WITH previous AS MATERIALIZED (
    SELECT current_setting('lock_timeout') AS value
)
SELECT previous.value, set_config('lock_timeout', %(lock_timeout)s, true)
FROM previous
"""
