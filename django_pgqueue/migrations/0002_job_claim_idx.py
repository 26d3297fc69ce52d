"""The claim index, built CONCURRENTLY so adding it never locks the jobs table.

CREATE INDEX CONCURRENTLY cannot run inside a transaction, so this migration is
non-atomic and holds nothing else. If the build fails it leaves an INVALID index:
``DROP INDEX CONCURRENTLY pgqueue_job_claim_idx;`` then migrate again. On a big table you may build it out of band first; see
docs/howto/big-tables.md.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("django_pgqueue", "0001_initial")]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status", "pending")),
                fields=["-priority", "id"],
                name="pgqueue_job_claim_idx",
            ),
        ),
    ]
