"""A job's tags (``enqueue(..., tags=[...])``): a ``text[]`` column whose default is
the empty array. A constant default adds the column without rewriting the table
(PostgreSQL 11+), so this takes an instant at any size; its index is built
CONCURRENTLY by 0026. And the schedules kept in the database
(``django_pgqueue.schedules``): a new, small table."""

from django.db import migrations, models

import django_pgqueue.fields
import django_pgqueue.models
from django_pgqueue.migration_ops import BrieflyLocked


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0021_job_waited")]

    operations = [
        migrations.CreateModel(
            name="ScheduleDefinition",
            fields=[
                ("name", models.CharField(max_length=200, primary_key=True, serialize=False)),
                (
                    "task",
                    models.CharField(
                        help_text="Dotted path of a django.tasks.Task", max_length=255
                    ),
                ),
                (
                    "cron",
                    models.CharField(
                        help_text="5-field cron, or @daily, @hourly...", max_length=255
                    ),
                ),
                ("timezone", models.CharField(default="UTC", max_length=64)),
                ("args", models.JSONField(blank=True, default=list)),
                ("kwargs", models.JSONField(blank=True, default=dict)),
                ("queue", models.CharField(blank=True, max_length=64, null=True)),
                ("priority", models.IntegerField(blank=True, null=True)),
                ("enabled", models.BooleanField(default=True)),
                ("unique_for", models.FloatField(blank=True, help_text="Seconds", null=True)),
                (
                    "created_at",
                    models.DateTimeField(db_default=django_pgqueue.models.ClockTimestamp()),
                ),
                (
                    "updated_at",
                    models.DateTimeField(db_default=django_pgqueue.models.ClockTimestamp()),
                ),
            ],
            options={
                "verbose_name": "database schedule",
                "db_table": "pgqueue_schedule_definition",
                "ordering": ["name"],
                "permissions": [("run_scheduledefinition", "Can run a database schedule now")],
            },
        ),
        # A column of the jobs table: its lock waited for briefly (0016).
        BrieflyLocked(
            migrations.AddField(
                model_name="job",
                name="tags",
                field=django_pgqueue.fields.CharArrayField(
                    blank=True,
                    db_default=django_pgqueue.models.EmptyTextArray(),
                    default=list,
                    item_length=None,
                ),
            ),
        ),
    ]
