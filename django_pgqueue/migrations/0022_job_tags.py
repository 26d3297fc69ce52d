"""A job's tags (``enqueue(..., tags=[...])``): a ``text[]`` column whose default is
the empty array. A constant default adds the column without rewriting the table
(PostgreSQL 11+), so this takes an instant at any size; its index is built
CONCURRENTLY by 0026."""

from django.db import migrations

import django_pgqueue.fields
import django_pgqueue.models
from django_pgqueue.migration_ops import BrieflyLocked


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0021_job_waited")]

    operations = [
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
