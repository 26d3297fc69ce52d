"""The indexes of the admin's tag filter and search: tags and arguments by containment
(GIN), task path and idempotency key (btree). Non-atomic, like every index migration
of this app: each is built CONCURRENTLY, so a fleet at work is never locked out of the
table. A failed build leaves an INVALID index: ``DROP INDEX CONCURRENTLY <name>;`` then
migrate again."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models

import django_pgqueue.models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("django_pgqueue", "0022_tags_and_schedules")]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=django_pgqueue.models.GinIndex(fields=["tags"], name="pgqueue_job_tags_idx"),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=django_pgqueue.models.GinIndex(
                fields=["args"], name="pgqueue_job_args_idx", opclasses=["jsonb_path_ops"]
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=django_pgqueue.models.GinIndex(
                fields=["kwargs"], name="pgqueue_job_kwargs_idx", opclasses=["jsonb_path_ops"]
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                fields=["task", "id"],
                name="pgqueue_job_task_idx",
                opclasses=["text_pattern_ops", "int8_ops"],
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("idempotency_key__isnull", False)),
                fields=["idempotency_key"],
                name="pgqueue_job_key_search_idx",
            ),
        ),
    ]
