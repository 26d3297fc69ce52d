"""The workers' ``queues`` column through django-pgqueue's own array field.

``ArrayField`` made ``django.contrib.postgres`` a required app (check postgres.E005); the
new field makes the same ``varchar(64)[]`` column, so this migration changes nothing in
the database (``sqlmigrate`` prints no statement) and needs no lock.
"""

from django.db import migrations

import django_pgqueue.fields


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0008_job_autovacuum")]

    operations = [
        migrations.AlterField(
            model_name="workerprocess",
            name="queues",
            field=django_pgqueue.fields.CharArrayField(
                blank=True, help_text="None: every queue", item_length=64, null=True
            ),
        ),
    ]
