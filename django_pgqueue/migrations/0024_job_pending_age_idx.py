"""Each queue's oldest pending job and its backlog read through an index of their own
(``pgqueue_job_pending_age_idx``: ``(queue, run_at) WHERE status = 'pending'``), so a
status probe sees a small queue beside a big one and reads its oldest job exactly.

Non-atomic, like every index migration of this app: built CONCURRENTLY, so a fleet at
work is never locked out of the table. If the build fails it leaves an INVALID index:
``DROP INDEX CONCURRENTLY pgqueue_job_pending_age_idx;`` then migrate again.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("django_pgqueue", "0022_tags_and_schedules")]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status", "pending")),
                fields=["queue", "run_at"],
                name="pgqueue_job_pending_age_idx",
            ),
        ),
    ]
