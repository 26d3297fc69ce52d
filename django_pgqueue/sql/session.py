"""A worker's connections: their labels, bounds and claim set-up, the listener's LISTEN,
and what a task may leave on a connection, checked and reset. Run by
``django_pgqueue.worker.connections`` only.
"""

from __future__ import annotations

SESSION_CONFIGURE = """
-- name: SESSION_CONFIGURE
-- Label a worker's connection (application_name) and bound its statements (NULL keeps
-- the current bound).
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
-- name: SESSION_CONFIGURE_CLAIM
-- Set up a worker's claim connection: index scans and generic plans whatever the
-- statistics say, asynchronous commit (a lost claim leaves the job pending), no JIT.
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
-- name: SESSION_CONFIGURE_CLAIM_LOCAL
-- SESSION_CONFIGURE_CLAIM and a statement bound for the current transaction only, for a
-- database behind a transaction pooler.
SELECT set_config('statement_timeout', %(statement_timeout)s, true),
       set_config('enable_bitmapscan', 'off', true),
       set_config('enable_seqscan', 'off', true),
       set_config('plan_cache_mode', 'force_generic_plan', true),
       set_config('synchronous_commit', 'off', true),
       set_config('jit', 'off', true)
"""


SESSION_GET_SETTINGS = """
-- name: SESSION_GET_SETTINGS
-- A runner connection's own session settings, read once before its first job: what
-- SESSION_RESTORE_SETTINGS puts back.
SELECT coalesce(array_agg(name ORDER BY name), '{}') AS names,
       coalesce(array_agg(setting ORDER BY name), '{}') AS "values"
FROM pg_settings
WHERE source = 'session'
"""


SESSION_GET_STATE = """
-- name: SESSION_GET_STATE
-- What a task can leave on a runner connection beyond its transaction (roles, settings,
-- locks, cursors, prepared statements, LISTEN, temp tables).
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


SESSION_LISTEN = """
-- name: SESSION_LISTEN
-- Subscribe the listener's connection to the wake-up channel (a template: LISTEN takes
-- an identifier, filled in with psycopg.sql.Identifier).
LISTEN {channel}
"""


SESSION_PING = """
-- name: SESSION_PING
-- Prove an idle LISTEN connection is still alive (a socket can die silently).
SELECT 1
"""


SESSION_RESET = """
-- name: SESSION_RESET
-- Reset a pooled server session before its client connection is dropped: DISCARD ALL's
-- parts and a reseed, one implicit transaction.
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


SESSION_RESET_SETTINGS = """
-- name: SESSION_RESET_SETTINGS
-- After a job that ran SQL: every setting back to its value at connection start.
RESET ALL
"""


SESSION_RESTORE_SETTINGS = """
-- name: SESSION_RESTORE_SETTINGS
-- Put the connection's own settings back after the reset, and reseed random().
SELECT (SELECT count(set_config(b.name, b.value, false))
        FROM unnest(%(names)s::text[], %(values)s::text[]) AS b(name, value)) AS restored,
       setseed(('x' || left(gen_random_uuid()::text, 8))::bit(32)::int / 2147483648.0)
"""


SESSION_TERMINATE = """
-- name: SESSION_TERMINATE
-- End a runner's session of this very worker whose job passed its hard time limit: its
-- open transaction (a lock on the job's row among them) is rolled back, so the failure
-- can be recorded; the process is replaced right after.
SELECT pg_terminate_backend(%(pid)s)
"""
