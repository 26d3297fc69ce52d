"""Durable steps (``pgqueue_step``): a job's recorded steps, cursors and sleeps.

The foreign key to the job is the database's, ``ON DELETE CASCADE``, so that every
delete of a job (retention's, the admin's, a user's SQL) removes its steps in the same
statement; the model says ``DO_NOTHING`` without a constraint so that Django neither
makes its own (``NO ACTION``) nor collects steps before deleting jobs. A new, empty
table: no lock on ``pgqueue_job`` beyond the brief one of adding the constraint.
"""

import django.db.models.deletion
from django.db import migrations, models

from django_pgqueue.migration_ops import BrieflyLocked


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgqueue", "0019_job_running_key_idx"),
    ]

    operations = [
        migrations.CreateModel(
            name="JobStep",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                (
                    "kind",
                    models.CharField(
                        choices=[("step", "step"), ("cursor", "cursor"), ("sleep", "sleep")],
                        max_length=8,
                    ),
                ),
                ("name", models.CharField(max_length=200)),
                ("attempt", models.IntegerField()),
                ("value", models.JSONField(blank=True, null=True)),
                ("size", models.IntegerField()),
                ("finished_at", models.DateTimeField()),
                (
                    "job",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="steps",
                        to="django_pgqueue.job",
                    ),
                ),
            ],
            options={
                "db_table": "pgqueue_step",
                "ordering": ["id"],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("job", "kind", "name"), name="pgqueue_step_job_name_uniq"
                    )
                ],
            },
        ),
        # The foreign key takes a SHARE ROW EXCLUSIVE lock of pgqueue_job (writes wait
        # behind it): it waits briefly for it, as 0016's columns do.
        BrieflyLocked(
            migrations.RunSQL(
                "ALTER TABLE pgqueue_step ADD CONSTRAINT pgqueue_step_job_fk "
                "FOREIGN KEY (job_id) REFERENCES pgqueue_job (id) ON DELETE CASCADE",
                "ALTER TABLE pgqueue_step DROP CONSTRAINT pgqueue_step_job_fk",
            ),
        ),
    ]
