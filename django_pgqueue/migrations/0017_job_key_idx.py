"""The flow claim's two indexes of the jobs table, built CONCURRENTLY so adding them
never locks it (non-atomic and alone, like 0002).

``pgqueue_job_key_claim_idx`` (pending jobs by queue, priority, concurrency key, id) lets
the flow claim step from one key to the next with a seek, however long a key's backlog;
``pgqueue_job_key_running_idx`` (running jobs with a key) lets it count what runs per
key. If a build fails it leaves an INVALID index: ``DROP INDEX CONCURRENTLY <name>;``
then migrate again; on a big table you may build them out of band first
(docs/howto/big-tables.md).
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("django_pgqueue", "0016_flow_control")]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status", "pending")),
                fields=["queue", "-priority", "concurrency_key", "id"],
                name="pgqueue_job_key_claim_idx",
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("concurrency_key__gt", ""), ("status", "running")),
                fields=["concurrency_key"],
                name="pgqueue_job_key_running_idx",
            ),
        ),
    ]
