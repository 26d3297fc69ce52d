"""A caller waiting for jobs to finish: flag them as waited, read them back. Run by
``django_pgqueue.hub`` only.

A job flagged ``waited`` is announced on the channel ``pgqueue_waited`` by the trigger
of :data:`WAITED_NOTIFY_FUNCTION` when it finishes or its progress changes; a job
nobody waits on costs its statements nothing but the trigger's WHEN test, so the drain
without waiters keeps its speed.
"""

from __future__ import annotations

#: The channel the trigger notifies on (fixed: the trigger is installed by a migration).
CHANNEL = "pgqueue_waited"


# Flag the jobs a caller is about to wait on, and say where each stands. The caller's
# connection LISTENs before it runs this: a job that finishes after this statement sees
# waited = true and notifies; one that finished before is returned finished. Row locks
# order the two: a completion in flight is waited for, then seen.
JOB_WAIT_FLAG = """
-- name: JOB_WAIT_FLAG
-- Flag jobs as waited on (their completion and progress then NOTIFY) and say where each
-- stands; run after LISTEN, so no completion falls between the check and the listen.
UPDATE pgqueue_job
SET waited = true
WHERE id = ANY (%(ids)s::bigint[])
RETURNING id, status, progress::text
"""


JOB_WAIT_READ = """
-- name: JOB_WAIT_READ
-- Where notified (or, after the listening connection was lost, all) waited jobs stand.
SELECT id, status, progress::text
FROM pgqueue_job
WHERE id = ANY (%(ids)s::bigint[])
"""


# The trigger's function: the job's id and new status on CHANNEL, sent at commit. The
# trigger (pgqueue_job_waited, AFTER UPDATE OF status, progress) fires only for rows
# flagged waited whose status became a finished one or whose progress changed: its WHEN
# is tested in the executor, no function call for the rows of a drain nobody waits on.
# Installed by migration 0021 (a copy, as migrations are frozen; tests/test_sql.py
# checks that the database's is this one).
WAITED_NOTIFY_FUNCTION = """
-- name: WAITED_NOTIFY_FUNCTION
-- Announce a waited job's end or progress on pgqueue_waited: "<id> <status>". Called by
-- the trigger pgqueue_job_waited only; installed by migration 0021.
CREATE OR REPLACE FUNCTION pgqueue_job_waited_notify()
RETURNS trigger
LANGUAGE plpgsql
AS $body$
BEGIN
    PERFORM pg_notify('pgqueue_waited', NEW.id::text || ' ' || NEW.status);
    RETURN NULL;
END
$body$
"""


WAITED_TRIGGER = """
-- name: WAITED_TRIGGER
-- Call WAITED_NOTIFY_FUNCTION for a waited job that finished or stored progress; other
-- rows pay the WHEN test only. Installed by migration 0021.
CREATE TRIGGER pgqueue_job_waited
AFTER UPDATE OF status, progress ON pgqueue_job
FOR EACH ROW
WHEN (NEW.waited AND (
    (NEW.status IN ('done', 'dead', 'cancelled') AND NEW.status IS DISTINCT FROM OLD.status)
    OR NEW.progress IS DISTINCT FROM OLD.progress))
EXECUTE FUNCTION pgqueue_job_waited_notify()
"""


WAIT_LISTEN = """
-- name: WAIT_LISTEN
-- Subscribe a waiting process's hub connection to the channel of waited jobs.
LISTEN pgqueue_waited
"""


WAIT_PING = """
-- name: WAIT_PING
-- Prove a hub's idle LISTEN connection is still alive (a socket can die silently).
SELECT 1
"""
