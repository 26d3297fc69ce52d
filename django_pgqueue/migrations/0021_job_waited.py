"""Waiting for results without polling, time limits, and the workers' memory:

* ``Job.waited`` flags a job someone waits on, and the trigger ``pgqueue_job_waited``
  announces its end (and its progress) on the channel ``pgqueue_waited``
  (``sql.WAITED_NOTIFY_FUNCTION`` and ``sql.WAITED_TRIGGER``; copies here, as a
  migration is frozen, and ``tests/test_waiting.py`` checks that the database's are
  those);
* ``Job.soft_time_limit`` and ``Job.time_limit``, given at enqueue;
* ``WorkerProcess.rss_bytes`` and ``WorkerProcess.restarts``.

Every column is nullable or has a constant default, so adding it rewrites nothing; the
trigger takes a brief lock of the table.
"""

from django.db import migrations, models

from django_pgqueue.migration_ops import BrieflyLocked

FUNCTION = """
CREATE OR REPLACE FUNCTION pgqueue_job_waited_notify()
RETURNS trigger
LANGUAGE plpgsql
AS $body$
BEGIN
    PERFORM pg_notify('pgqueue_waited', NEW.id::text || ' ' || NEW.status);
    RETURN NULL;
END
$body$
"""

TRIGGER = """
CREATE TRIGGER pgqueue_job_waited
AFTER UPDATE OF status, progress ON pgqueue_job
FOR EACH ROW
WHEN (NEW.waited AND (
    (NEW.status IN ('done', 'dead', 'cancelled') AND NEW.status IS DISTINCT FROM OLD.status)
    OR NEW.progress IS DISTINCT FROM OLD.progress))
EXECUTE FUNCTION pgqueue_job_waited_notify()
"""


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0020_job_steps")]

    operations = [
        migrations.AddField(
            model_name="workerprocess",
            name="rss_bytes",
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="workerprocess",
            name="restarts",
            field=models.IntegerField(db_default=0, default=0),
        ),
        migrations.RunSQL(FUNCTION, reverse_sql="DROP FUNCTION pgqueue_job_waited_notify()"),
        # The columns and the trigger lock the table: each waits briefly (0016).
        BrieflyLocked(
            migrations.AddField(
                model_name="job",
                name="waited",
                field=models.BooleanField(db_default=False, default=False),
            ),
            migrations.AddField(
                model_name="job",
                name="soft_time_limit",
                field=models.FloatField(blank=True, null=True),
            ),
            migrations.AddField(
                model_name="job",
                name="time_limit",
                field=models.FloatField(blank=True, null=True),
            ),
            migrations.RunSQL(
                TRIGGER, reverse_sql="DROP TRIGGER pgqueue_job_waited ON pgqueue_job"
            ),
        ),
    ]
