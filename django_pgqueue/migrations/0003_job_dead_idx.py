"""The dead-letter index, built CONCURRENTLY so adding it never locks the jobs table.

Without it, a few dead letters among millions of jobs cost the dead-letter admin page a
scan of the whole table (``bench.admin_page``, bench/README.md). Non-atomic and alone,
like 0002.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("django_pgqueue", "0002_job_claim_idx")]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status", "dead")),
                fields=["id"],
                name="pgqueue_job_dead_idx",
            ),
        ),
    ]
