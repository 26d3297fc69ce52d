"""The keys table's pruning index, built CONCURRENTLY (non-atomic and alone, like 0002).

The sweeper deletes expired keys (``sql.KEY_DELETE_EXPIRED``) by a range of it, oldest
first, in bounded batches. If the build fails it leaves an INVALID index:
``DROP INDEX CONCURRENTLY pgqueue_job_key_expires_idx;`` then migrate again.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("django_pgqueue", "0011_job_lifecycle")]

    operations = [
        AddIndexConcurrently(
            model_name="jobkey",
            index=models.Index(fields=["expires_at"], name="pgqueue_job_key_expires_idx"),
        ),
    ]
