"""The function a limited claim reads its budgets' use with, in a snapshot of its own
(``sql.FLOW_USAGE_FUNCTION``, which explains why it is a function; this is a copy, as a
migration is frozen, and ``tests/test_sql.py`` checks that the two agree). Creating it
takes no lock on any table.
"""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION pgqueue_flow_usage(
    keys text[], queues text[], rate_names text[], rate_subjects text[])
RETURNS TABLE (budget_kind text, budget_name text, budget_subject text,
               running bigint, starts timestamptz[])
LANGUAGE plpgsql VOLATILE
AS $body$
BEGIN
    RETURN QUERY
    SELECT 'key', NULL::text, k.key,
           (SELECT count(*)
            FROM pgqueue_job AS r
            WHERE r.status = 'running' AND r.concurrency_key > ''
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

DROP = "DROP FUNCTION IF EXISTS pgqueue_flow_usage(text[], text[], text[], text[])"


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0017_job_key_idx")]

    operations = [migrations.RunSQL(CREATE, reverse_sql=DROP)]
