"""What a task can say about itself: ``Job.snoozes`` and ``Job.progress``, and the
table of keys that outlive their jobs (``enqueue(unique_for=..., debounce=...)``).

Both new columns are added without a table rewrite (a constant default and a NULL
column are catalog-only changes), under a brief ACCESS EXCLUSIVE lock of the jobs table,
waited for at most 2 s at a time (``BrieflyLocked``). The keys table
is new and empty; its pruning index is built CONCURRENTLY in 0012, on its own.
"""

from django.db import migrations, models

from django_pgqueue.migration_ops import BrieflyLocked


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0010_job_cancelled_idx")]

    operations = [
        BrieflyLocked(
            migrations.AddField(
                model_name="job",
                name="progress",
                field=models.JSONField(blank=True, null=True),
            ),
            migrations.AddField(
                model_name="job",
                name="snoozes",
                field=models.IntegerField(db_default=0, default=0),
            ),
        ),
        migrations.CreateModel(
            name="JobKey",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "kind",
                        "queue",
                        "key",
                        blank=True,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("kind", models.CharField(max_length=16)),
                ("queue", models.CharField(max_length=64)),
                ("key", models.CharField(max_length=255)),
                ("job_id", models.BigIntegerField()),
                ("created_at", models.DateTimeField()),
                ("expires_at", models.DateTimeField()),
            ],
            options={"db_table": "pgqueue_job_key"},
        ),
    ]
