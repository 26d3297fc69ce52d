from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("demo", "0003_execution_backend_pid"),
    ]

    operations = [
        migrations.CreateModel(
            name="Span",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("job_id", models.BigIntegerField(db_index=True)),
                ("attempt", models.IntegerField()),
                ("worker_id", models.CharField(max_length=255)),
                ("started_at", models.DateTimeField()),
                ("finished_at", models.DateTimeField(null=True)),
            ],
        ),
    ]
