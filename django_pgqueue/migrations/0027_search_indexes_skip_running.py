"""The admin's search indexes (tags, args, kwargs, task path) without running jobs.

Every claim and every completion writes a new version of the job's row; an index that
holds every row gets an entry at both, and the four of 0026 cost the drain about a
fifth of PostgreSQL's time per job (measured with ``bench.compare``). Leaving running
jobs out (``WHERE NOT status = 'running'``) spares the claim those entries; the few
running jobs are searched through ``pgqueue_job_lease_idx`` instead. The new indexes
are built first, so search is served throughout, then the old ones dropped. Non-atomic
and CONCURRENTLY, like every index migration of this app: a failed build leaves an
INVALID index: ``DROP INDEX CONCURRENTLY <name>;`` then migrate again."""

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models

import django_pgqueue.models

SEARCHABLE = ~models.Q(status="running")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("django_pgqueue", "0026_job_search_indexes")]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=django_pgqueue.models.GinIndex(
                fields=["tags"], name="pgqueue_job_tags_search_idx", condition=SEARCHABLE
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=django_pgqueue.models.GinIndex(
                fields=["args"],
                name="pgqueue_job_args_search_idx",
                opclasses=["jsonb_path_ops"],
                condition=SEARCHABLE,
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=django_pgqueue.models.GinIndex(
                fields=["kwargs"],
                name="pgqueue_job_kwargs_search_idx",
                opclasses=["jsonb_path_ops"],
                condition=SEARCHABLE,
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                fields=["task", "id"],
                name="pgqueue_job_task_search_idx",
                opclasses=["text_pattern_ops", "int8_ops"],
                condition=SEARCHABLE,
            ),
        ),
        RemoveIndexConcurrently(model_name="job", name="pgqueue_job_tags_idx"),
        RemoveIndexConcurrently(model_name="job", name="pgqueue_job_args_idx"),
        RemoveIndexConcurrently(model_name="job", name="pgqueue_job_kwargs_idx"),
        RemoveIndexConcurrently(model_name="job", name="pgqueue_job_task_idx"),
    ]
