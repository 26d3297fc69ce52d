"""The per-queue claim index, built CONCURRENTLY so adding it never locks the jobs table.

A worker started with ``--queue`` claims through it (``sql.JOB_CLAIM_QUEUES``): with
1,000,000 pending jobs in one queue and 10 in another, the small queue's claim read
those 10 entries instead of walking the shared claim index past the big queue's.
Non-atomic and alone, like 0002. If the build fails it leaves an INVALID index:
``DROP INDEX CONCURRENTLY pgqueue_job_queue_claim_idx;`` then migrate again; on a big
table you may build it out of band first (docs/howto/big-tables.md).
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("django_pgqueue", "0006_worker")]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status", "pending")),
                fields=["queue", "-priority", "id"],
                name="pgqueue_job_queue_claim_idx",
            ),
        ),
    ]
