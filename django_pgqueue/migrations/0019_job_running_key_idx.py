"""What runs per concurrency key is counted through an index the planner cannot trade
for another: ``pgqueue_job_running_key_idx`` (predicate ``concurrency_key > '' AND
(status = 'running') IS TRUE``) replaces 0017's ``pgqueue_job_key_running_idx``
(``status = 'running'``), and ``pgqueue_flow_usage`` counts in the same words, with its
planner settings pinned (``sql.FLOW_USAGE_FUNCTION`` says why; this is a copy, as a
migration is frozen, and ``tests/test_sql.py`` checks that the two agree).

Non-atomic, like every index migration of this app: the new index is built
CONCURRENTLY before the function that uses it is replaced, and the old one dropped
CONCURRENTLY after, so a fleet at work is never locked out of the table and never runs
the new function without its index. If the build fails it leaves an INVALID index:
``DROP INDEX CONCURRENTLY pgqueue_job_running_key_idx;`` then migrate again.
"""

import importlib

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models

import django_pgqueue.models

# The function as 0018 created it: what unapplying this migration puts back.
PREVIOUS = importlib.import_module("django_pgqueue.migrations.0018_flow_usage_function").CREATE

CREATE = """
CREATE OR REPLACE FUNCTION pgqueue_flow_usage(
    keys text[], queues text[], rate_names text[], rate_subjects text[])
RETURNS TABLE (budget_kind text, budget_name text, budget_subject text,
               running bigint, starts timestamptz[])
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $body$
BEGIN
    RETURN QUERY
    SELECT 'key', NULL::text, k.key,
           (SELECT count(*)
            FROM pgqueue_job AS r
            WHERE (r.status = 'running') IS TRUE AND r.concurrency_key > ''
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


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("django_pgqueue", "0018_flow_usage_function")]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(
                    django_pgqueue.models.IsTrue(models.Q(("status", "running"))),
                    ("concurrency_key__gt", ""),
                ),
                fields=["concurrency_key"],
                name="pgqueue_job_running_key_idx",
            ),
        ),
        migrations.RunSQL(CREATE, reverse_sql=PREVIOUS),
        RemoveIndexConcurrently(model_name="job", name="pgqueue_job_key_running_idx"),
    ]
