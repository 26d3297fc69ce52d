"""Each worker process's row says which process instance wrote it (``instance``, a
random token), so that a worker refreshes and deletes only its own row: a second
process started with the same ``--worker-id`` is refused while the first is alive, and
one that took over a lost row keeps it when the first exits (issue 28). The table is
small (one row per worker process); the column has a constant default, so adding it
rewrites nothing."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgqueue", "0024_job_pending_age_idx"),
    ]

    operations = [
        migrations.AddField(
            model_name="workerprocess",
            name="instance",
            field=models.CharField(blank=True, db_default="", default="", max_length=32),
        ),
    ]
