"""Cancellation: the ``cancelled`` status, ``cancel_requested_at`` and the cancel permission.

The status CHECK constraint is widened without locking a big jobs table for a scan: the
old constraint is swapped for the new one ``NOT VALID`` (instant, under a brief lock),
then validated in its own transaction, which reads the table under a lock that lets
workers go on claiming and completing. Hence ``atomic = False``; every other operation
here is instant (a nullable column, choices and options only).
"""

from django.db import migrations, models

from django_pgqueue.migration_ops import BrieflyLocked

STATUSES = "'pending', 'scheduled', 'running', 'done', 'dead', 'cancelled'"
OLD_STATUSES = "'pending', 'scheduled', 'running', 'done', 'dead'"


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_pgqueue", "0004_schedule"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="job",
            options={
                "ordering": ["-id"],
                "permissions": [
                    ("requeue_job", "Can requeue dead jobs"),
                    ("cancel_job", "Can cancel jobs"),
                ],
            },
        ),
        BrieflyLocked(
            migrations.AddField(
                model_name="job",
                name="cancel_requested_at",
                field=models.DateTimeField(blank=True, null=True),
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
                ],
                db_default="pending",
                default="pending",
                max_length=16,
            ),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveConstraint(
                    model_name="job",
                    name="pgqueue_job_status_valid",
                ),
                migrations.AddConstraint(
                    model_name="job",
                    constraint=models.CheckConstraint(
                        condition=models.Q(
                            (
                                "status__in",
                                ["pending", "scheduled", "running", "done", "dead", "cancelled"],
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
