"""Flow control: the jobs' ``concurrency_key``, the limits set at run time, the queues'
run-time state (paused) and the rate windows (see flow.py).

The new column has a constant default, so adding it is a catalog-only change (no table
rewrite) under a brief ACCESS EXCLUSIVE lock of the jobs table, waited for at most 2 s
at a time (``BrieflyLocked``). The three tables are new and empty; the
jobs table's two new indexes are built CONCURRENTLY in 0017, on their own.
"""

from django.db import migrations, models

import django_pgqueue.fields
import django_pgqueue.models
from django_pgqueue.migration_ops import BrieflyLocked


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0015_job_idempotency_waiting")]

    operations = [
        BrieflyLocked(
            migrations.AddField(
                model_name="job",
                name="concurrency_key",
                field=models.CharField(blank=True, db_default="", default="", max_length=255),
            ),
        ),
        migrations.CreateModel(
            name="Limit",
            fields=[
                (
                    "key",
                    models.CharField(
                        help_text='"stripe" (one budget), "tenant:*" (one per matching '
                        'key), "queue:NAME"',
                        max_length=255,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                (
                    "concurrency",
                    models.IntegerField(
                        blank=True,
                        help_text="Most jobs running at once (empty: no bound)",
                        null=True,
                    ),
                ),
                (
                    "rate",
                    models.CharField(
                        blank=True,
                        default="",
                        help_text='Most starts in any sliding window: "R/s", "R/m" or '
                        '"R/h" (empty: none)',
                        max_length=32,
                    ),
                ),
                (
                    "updated_at",
                    models.DateTimeField(db_default=django_pgqueue.models.ClockTimestamp()),
                ),
            ],
            options={"verbose_name": "limit", "db_table": "pgqueue_limit", "ordering": ["key"]},
        ),
        migrations.CreateModel(
            name="Queue",
            fields=[
                ("name", models.CharField(max_length=64, primary_key=True, serialize=False)),
                ("paused_at", models.DateTimeField(blank=True, null=True)),
                (
                    "updated_at",
                    models.DateTimeField(db_default=django_pgqueue.models.ClockTimestamp()),
                ),
            ],
            options={"verbose_name": "queue", "db_table": "pgqueue_queue", "ordering": ["name"]},
        ),
        migrations.CreateModel(
            name="RateWindow",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "name",
                        "subject",
                        blank=True,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("name", models.CharField(max_length=255)),
                ("subject", models.CharField(max_length=255)),
                ("starts", django_pgqueue.fields.TimestampArrayField()),
                ("expires_at", models.DateTimeField()),
            ],
            options={
                "db_table": "pgqueue_rate",
                # A new, empty table: a plain index build locks nothing that is in use.
                "indexes": [models.Index(fields=["expires_at"], name="pgqueue_rate_expires_idx")],
            },
        ),
    ]
