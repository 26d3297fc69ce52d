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
