"""The cancelled jobs' index, built CONCURRENTLY so adding it never locks the jobs table.

Monitoring counts the jobs cancelled in the last minutes (``sql.JOB_SAMPLE_FINISHED``)
by a backward range scan of it, as it counts done jobs by ``pgqueue_job_done_idx``;
without it that count would read the whole table. Partial: only cancelled rows are in
it. Non-atomic and alone, like 0002. If the build fails it leaves an INVALID index:
``DROP INDEX CONCURRENTLY pgqueue_job_cancelled_idx;`` then migrate again; on a big
table you may build it out of band first (docs/howto/big-tables.md).
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("django_pgqueue", "0009_worker_queues_field")]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status", "cancelled")),
                fields=["finished_at"],
                name="pgqueue_job_cancelled_idx",
            ),
        ),
    ]
