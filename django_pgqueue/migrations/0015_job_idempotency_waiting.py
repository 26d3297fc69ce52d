"""An idempotency key is held by a waiting job too: ``pgqueue_job_idempotency_uniq``
covers ``waiting`` as well as pending, scheduled and running.

The unique index is rebuilt without ever leaving enqueues without an arbiter: the new
one is built CONCURRENTLY under a temporary name beside the old, the old one dropped
CONCURRENTLY, the new one renamed (instant). Every ``ON CONFLICT`` of sql.py infers
either while both exist. Non-atomic, as CONCURRENTLY needs. If the build fails it
leaves an INVALID index: ``DROP INDEX CONCURRENTLY pgqueue_job_idempotency_next;``
then migrate again.
"""

from django.db import migrations, models

LIVE = "'pending', 'scheduled', 'running', 'waiting'"
OLD_LIVE = "'pending', 'scheduled', 'running'"


def build(statuses: str) -> tuple[str, ...]:
    """The statements that replace the unique index by one over ``statuses``."""
    return (
        "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS pgqueue_job_idempotency_next "
        "ON pgqueue_job (queue, idempotency_key) "
        f"WHERE idempotency_key IS NOT NULL AND status IN ({statuses})",
        "DROP INDEX CONCURRENTLY IF EXISTS pgqueue_job_idempotency_uniq",
        "ALTER INDEX pgqueue_job_idempotency_next RENAME TO pgqueue_job_idempotency_uniq",
    )


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("django_pgqueue", "0014_job_workflow_indexes")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveConstraint(model_name="job", name="pgqueue_job_idempotency_uniq"),
                migrations.AddConstraint(
                    model_name="job",
                    constraint=models.UniqueConstraint(
                        condition=models.Q(
                            ("idempotency_key__isnull", False),
                            ("status__in", ("pending", "scheduled", "running", "waiting")),
                        ),
                        fields=("queue", "idempotency_key"),
                        name="pgqueue_job_idempotency_uniq",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(sql=build(LIVE), reverse_sql=build(OLD_LIVE)),
            ],
        ),
    ]
