"""Workflows: the ``waiting`` status, the jobs' dependency columns, the edges table.

A job that depends on others (``depends_on``, chains, groups) waits in the new status
``waiting`` with a count of its unfinished parents (``parents_left``); its edges are
rows of ``pgqueue_job_dependency``. Every new column is NULL or has a constant default
(a catalog-only change, no table rewrite); the edges table is new and empty, and its indexes, like the jobs
table's new ones, are built CONCURRENTLY in 0014. The status CHECK constraint is
widened as in 0005: swapped for the new one ``NOT VALID`` (instant, under a brief
lock), then validated in its own transaction, under a lock that lets workers go on
claiming and completing. Hence ``atomic = False``.
"""

from django.db import migrations, models

from django_pgqueue.migration_ops import BrieflyLocked

STATUSES = "'pending', 'scheduled', 'running', 'done', 'dead', 'cancelled', 'waiting'"
OLD_STATUSES = "'pending', 'scheduled', 'running', 'done', 'dead', 'cancelled'"


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("django_pgqueue", "0012_job_key_expires_idx")]

    operations = [
        migrations.CreateModel(
            name="JobDependency",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "job_id",
                        "position",
                        blank=True,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("job_id", models.BigIntegerField()),
                ("position", models.IntegerField()),
                ("parent_id", models.BigIntegerField()),
                ("state", models.CharField(blank=True, max_length=16, null=True)),
                ("result", models.JSONField(blank=True, null=True)),
                ("repair", models.BooleanField(db_default=False, default=False)),
            ],
            options={"db_table": "pgqueue_job_dependency"},
        ),
        BrieflyLocked(
            migrations.AddField(
                model_name="job",
                name="on_parent_failure",
                field=models.CharField(blank=True, max_length=8, null=True),
            ),
        ),
        BrieflyLocked(
            migrations.AddField(
                model_name="job",
                name="parent_results",
                field=models.CharField(blank=True, max_length=8, null=True),
            ),
        ),
        BrieflyLocked(
            migrations.AddField(
                model_name="job",
                name="parents_left",
                field=models.IntegerField(blank=True, null=True),
            ),
        ),
        BrieflyLocked(
            migrations.AddField(
                model_name="job",
                name="workflow_id",
                field=models.BigIntegerField(blank=True, null=True),
            ),
        ),
        BrieflyLocked(
            migrations.AddField(
                model_name="job",
                name="has_dependants",
                field=models.BooleanField(db_default=False, default=False),
            ),
        ),
        migrations.AlterField(
            model_name="job",
            name="status",
            field=models.CharField(
                choices=[
                    ("pending", "Pending"),
                    ("scheduled", "Scheduled"),
                    ("running", "Running"),
                    ("done", "Done"),
                    ("dead", "Dead"),
                    ("cancelled", "Cancelled"),
                    ("waiting", "Waiting"),
                ],
                db_default="pending",
                default="pending",
                max_length=16,
            ),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveConstraint(model_name="job", name="pgqueue_job_status_valid"),
                migrations.AddConstraint(
                    model_name="job",
                    constraint=models.CheckConstraint(
                        condition=models.Q(
                            (
                                "status__in",
                                [
                                    "pending",
                                    "scheduled",
                                    "running",
                                    "done",
                                    "dead",
                                    "cancelled",
                                    "waiting",
                                ],
                            )
                        ),
                        name="pgqueue_job_status_valid",
                    ),
                ),
            ],
            database_operations=[
                BrieflyLocked(
                    migrations.RunSQL(
                        sql="ALTER TABLE pgqueue_job DROP CONSTRAINT pgqueue_job_status_valid, "
                        f"ADD CONSTRAINT pgqueue_job_status_valid CHECK (status IN ({STATUSES})) "
                        "NOT VALID",
                        reverse_sql="ALTER TABLE pgqueue_job DROP CONSTRAINT "
                        "pgqueue_job_status_valid, ADD CONSTRAINT pgqueue_job_status_valid "
                        f"CHECK (status IN ({OLD_STATUSES}))",
                    ),
                ),
                migrations.RunSQL(
                    sql="ALTER TABLE pgqueue_job VALIDATE CONSTRAINT pgqueue_job_status_valid",
                    reverse_sql=migrations.RunSQL.noop,
                ),
            ],
        ),
    ]
