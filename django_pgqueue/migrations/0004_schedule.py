"""The periodic schedules table: the last tick enqueued per PGQUEUE_PERIODIC entry."""

from django.db import migrations, models

import django_pgqueue.models


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgqueue", "0003_job_dead_idx"),
    ]

    operations = [
        migrations.CreateModel(
            name="Schedule",
            fields=[
                ("name", models.CharField(max_length=200, primary_key=True, serialize=False)),
                ("task", models.CharField(max_length=255)),
                ("cron", models.CharField(max_length=255)),
                ("timezone", models.CharField(max_length=64)),
                ("enabled", models.BooleanField(default=True)),
                (
                    "last_tick",
                    models.DateTimeField(
                        help_text="The latest tick enqueued (or skipped: a new, changed or disabled entry)"
                    ),
                ),
                ("last_job_id", models.BigIntegerField(blank=True, null=True)),
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
                "verbose_name": "periodic schedule",
                "db_table": "pgqueue_schedule",
                "ordering": ["name"],
            },
        ),
    ]
