"""The chaos suite's own SQL: fault injection helpers and the end-of-run oracle.

The oracle checks, over the jobs table and the ``demo_execution`` ledger (one row per
execution of a chaos task), the invariants of ``docs/reliability.md``:

* lost: a job enqueued but missing, or ``done`` without any ledger row;
* stuck (I1 after the drain): a job neither ``done`` nor ``dead``;
* I1: a running job whose lease reaches further than one lease from now;
* I2: ``attempts > max_attempts``;
* I3 / dup_tx: a transactional job with more than one ledger row;
* I4: a running job without owner or lease, or a lease on a job not running;
* I5: a transactional job is ``done`` if and only if it has exactly one ledger row;
* dup_plain: extra executions of ordinary jobs (at-least-once; reported, not a fault);
* dead_unexpected / poison_wrong: only poison pills may die, after all their attempts.
"""

from __future__ import annotations

from typing import Any

import psycopg

# Jobs per status, for progress lines and the drain check. Sequential scan; small table.
STATUS_COUNTS = """
SELECT status, count(*) FROM pgqueue_job GROUP BY status
"""

# Backends the killer may terminate: every client of the chaos database but ourselves.
CLIENT_BACKENDS = """
SELECT pid FROM pg_stat_activity
WHERE datname = current_database()
  AND backend_type = 'client backend'
  AND pid <> pg_backend_pid()
"""

# Terminate one backend, as an administrator (or a failover) would.
TERMINATE_BACKEND = """
SELECT pg_terminate_backend(%(pid)s)
"""

# Every invariant in one pass over jobs joined to their ledger rows.
CHECK = """
WITH ledger AS (
    SELECT job_id,
           count(*) FILTER (WHERE kind = 'tx') AS tx_rows,
           count(*) FILTER (WHERE kind = 'plain') AS plain_rows
    FROM demo_execution
    GROUP BY job_id
), j AS (
    SELECT job.*,
           coalesce(ledger.tx_rows, 0) AS tx_rows,
           coalesce(ledger.plain_rows, 0) AS plain_rows,
           job.task LIKE '%%.ledger_tx' AS is_tx,
           job.task LIKE '%%.ledger_plain' AS is_plain,
           job.task LIKE '%%.poison' AS is_poison
    FROM pgqueue_job AS job
    LEFT JOIN ledger ON ledger.job_id = job.id
)
SELECT
    count(*) AS total,
    count(*) FILTER (WHERE status = 'done') AS done,
    count(*) FILTER (WHERE status = 'dead') AS dead,
    count(*) FILTER (WHERE status NOT IN ('done', 'dead')) AS stuck,
    count(*) FILTER (WHERE status = 'done'
                       AND ((is_tx AND tx_rows = 0) OR (is_plain AND plain_rows = 0)))
        AS lost_effects,
    count(*) FILTER (WHERE is_tx AND tx_rows > 1) AS dup_tx,
    coalesce(sum(plain_rows - 1) FILTER (WHERE is_plain AND plain_rows > 1), 0) AS dup_plain,
    count(*) FILTER (WHERE status = 'running'
                       AND lease_expires_at > clock_timestamp()
                                              + make_interval(secs => %(lease_seconds)s))
        AS i1,
    count(*) FILTER (WHERE attempts > max_attempts) AS i2,
    count(*) FILTER (WHERE (status = 'running'
                            AND (lease_owner IS NULL OR lease_expires_at IS NULL))
                        OR (status <> 'running' AND lease_expires_at IS NOT NULL)) AS i4,
    count(*) FILTER (WHERE is_tx AND (status = 'done') <> (tx_rows = 1)) AS i5,
    count(*) FILTER (WHERE status = 'dead' AND NOT is_poison) AS dead_unexpected,
    count(*) FILTER (WHERE is_poison AND NOT (status = 'dead' AND attempts = max_attempts))
        AS poison_wrong
FROM j
"""


def check(url: str, *, jobs: int, lease_seconds: float) -> dict[str, Any]:
    """Run the oracle; ``lost`` counts missing jobs plus done jobs without an effect."""
    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(CHECK, {"lease_seconds": lease_seconds})
        names = [column.name for column in cursor.description or []]
        row = dict(zip(names, cursor.fetchone() or (), strict=True))
    row = {name: int(value or 0) for name, value in row.items()}
    row["lost"] = max(0, jobs - row["total"]) + row["lost_effects"]
    row["dead_unexpected"] += row["poison_wrong"]
    return row
