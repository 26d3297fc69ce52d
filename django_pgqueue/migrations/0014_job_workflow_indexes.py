"""The workflows' indexes, built CONCURRENTLY (non-atomic and alone, like 0002).

``pgqueue_job_dep_parent_idx``: a job's dependants (the admin, a requeue's restore).
``pgqueue_job_dep_unresolved_idx``: the edges not yet resolved, which a finishing job's
are looked up in; a completion first asks whether it holds any at all (one probe per
statement when no workflow is in flight). ``pgqueue_job_dep_repair_idx``: the
sweeper's missed edges (partial, normally empty). ``pgqueue_job_waiting_idx``: waiting
jobs (status counts, the admin). ``pgqueue_job_workflow_idx``: a workflow's jobs (the
admin's progress). If a build fails it leaves an INVALID index: ``DROP INDEX
CONCURRENTLY <name>;`` then migrate again (docs/howto/big-tables.md).
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("django_pgqueue", "0013_job_workflows")]

    operations = [
        AddIndexConcurrently(
            model_name="jobdependency",
            index=models.Index(fields=["parent_id"], name="pgqueue_job_dep_parent_idx"),
        ),
        AddIndexConcurrently(
            model_name="jobdependency",
            index=models.Index(
                condition=models.Q(("state__isnull", True)),
                fields=["parent_id"],
                name="pgqueue_job_dep_unresolved_idx",
            ),
        ),
        AddIndexConcurrently(
            model_name="jobdependency",
            index=models.Index(
                condition=models.Q(("repair", True), ("state__isnull", True)),
                fields=["parent_id"],
                name="pgqueue_job_dep_repair_idx",
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status", "waiting")),
                fields=["id"],
                name="pgqueue_job_waiting_idx",
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("workflow_id__isnull", False)),
                fields=["workflow_id", "id"],
                name="pgqueue_job_workflow_idx",
            ),
        ),
    ]
