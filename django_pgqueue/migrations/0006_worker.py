# The workers table (one row per running worker process, see WorkerProcess), the
# dashboard proxy that puts the queue dashboard on the admin index, and the jobs' trace
# context column (nullable, no default: adding it rewrites nothing, even on a big table).

import django.contrib.postgres.fields
from django.db import migrations, models

import django_pgqueue.models
from django_pgqueue.migration_ops import BrieflyLocked


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgqueue", "0005_job_cancel"),
    ]

    operations = [
        migrations.CreateModel(
            name="WorkerProcess",
            fields=[
                (
                    "id",
                    models.CharField(
                        help_text="The lease owner name",
                        max_length=255,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("hostname", models.CharField(max_length=255)),
                ("pid", models.IntegerField()),
                (
                    "queues",
                    django.contrib.postgres.fields.ArrayField(
                        base_field=models.CharField(max_length=64),
                        blank=True,
                        help_text="None: every queue",
                        null=True,
                    ),
                ),
                ("concurrency", models.IntegerField()),
                ("lease_seconds", models.FloatField()),
                ("version", models.CharField(max_length=64)),
                (
                    "started_at",
                    models.DateTimeField(db_default=django_pgqueue.models.ClockTimestamp()),
                ),
                (
                    "last_seen_at",
                    models.DateTimeField(db_default=django_pgqueue.models.ClockTimestamp()),
                ),
                ("jobs_held", models.IntegerField(db_default=0, default=0)),
                ("jobs_done", models.BigIntegerField(db_default=0, default=0)),
                ("jobs_failed", models.BigIntegerField(db_default=0, default=0)),
            ],
            options={
                "verbose_name": "worker",
                "verbose_name_plural": "workers",
                "db_table": "pgqueue_worker",
                "ordering": ["hostname", "id"],
            },
        ),
        migrations.CreateModel(
            name="Dashboard",
            fields=[],
            options={
                "verbose_name": "dashboard",
                "verbose_name_plural": "dashboard",
                "proxy": True,
                "default_permissions": (),
                "indexes": [],
                "constraints": [],
            },
            bases=("django_pgqueue.job",),
        ),
        BrieflyLocked(
            migrations.AddField(
                model_name="job",
                name="trace_context",
                field=models.JSONField(blank=True, null=True),
            ),
        ),
    ]
