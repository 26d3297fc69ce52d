from django.db import models


class Delivery(models.Model):
    """One row per job that sent a "notification": the demo's database side effect.

    ``job_id`` is unique, so running the same job twice (at-least-once delivery after a
    crash) still leaves one row: the effect is idempotent."""

    job_id = models.BigIntegerField(unique=True)
    recipient = models.CharField(max_length=200)
    executions = models.IntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"delivery of job {self.job_id} to {self.recipient}"


class Execution(models.Model):
    """One row per execution of a fault-test or chaos task: the oracle's ledger.

    Nothing here is unique on purpose: a job that ran twice leaves two rows, so the
    chaos suite can count duplicates instead of hiding them. Transactional tasks write
    their row in the same transaction as their completion (exactly one per done job);
    ordinary tasks write theirs in autocommit (at least one)."""

    job_id = models.BigIntegerField(db_index=True)
    attempt = models.IntegerField()
    kind = models.CharField(max_length=16)  # "plain" or "tx"
    worker_id = models.CharField(max_length=255)
    #: The PostgreSQL backend the task's connection used (leaking tasks): a leak whose
    #: session was terminated before the worker could check it left nothing behind.
    backend_pid = models.IntegerField(null=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"execution of job {self.job_id} (attempt {self.attempt}, {self.kind})"


class Span(models.Model):
    """When the body of one run of a flow control test task ran, by the database's clock
    (``tasks.span``): the tests read from these rows how many jobs of a key really ran
    at once and when each started."""

    job_id = models.BigIntegerField(db_index=True)
    attempt = models.IntegerField()
    worker_id = models.CharField(max_length=255)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True)

    def __str__(self) -> str:
        return f"span of job {self.job_id} (attempt {self.attempt})"
