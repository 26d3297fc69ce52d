"""Autovacuum settings for the jobs table: vacuum it early and often.

Every job is inserted once and updated at least twice (claimed, finished), so the
table collects dead row versions and dead index entries at the rate of the queue's
throughput. With PostgreSQL's defaults (vacuum once 20% of the table is dead) a table
of ten million rows would wait for two million dead ones; here the threshold is 1% plus
1,000 rows, inserts count too (they set visibility and clean index pages after a bulk
enqueue), and the vacuum runs unthrottled (it reads mostly recently touched pages).
The values and their trade-offs: docs/howto/big-tables.md. ``ALTER TABLE ... SET``
of storage parameters takes a SHARE UPDATE EXCLUSIVE lock: jobs keep flowing while it
runs. Change them later with your own ``ALTER TABLE pgqueue_job SET (...)``; this
migration does not run again.
"""

from django.db import migrations

SETTINGS = {
    "autovacuum_vacuum_scale_factor": "0.01",
    "autovacuum_vacuum_threshold": "1000",
    "autovacuum_vacuum_insert_scale_factor": "0.01",
    "autovacuum_vacuum_insert_threshold": "10000",
    "autovacuum_analyze_scale_factor": "0.02",
    "autovacuum_vacuum_cost_delay": "0",
}


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0007_job_queue_claim_idx")]

    operations = [
        migrations.RunSQL(
            sql="ALTER TABLE pgqueue_job SET ("
            + ", ".join(f"{name} = {value}" for name, value in SETTINGS.items())
            + ")",
            reverse_sql="ALTER TABLE pgqueue_job RESET (" + ", ".join(SETTINGS) + ")",
        ),
    ]
