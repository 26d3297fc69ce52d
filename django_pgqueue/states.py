"""The states of a job, named once.

``Job.Status`` is :class:`Status`; code that needs the states without the models (the
manager, the sweeper, monitoring) imports them from here. Django's ``TaskResultStatus``
is mapped from them in ``framework.py`` only. The SQL of ``sql.py`` spells them as
literals, which the table's CHECK constraint keeps in step with this list.
"""

from __future__ import annotations

from django.db import models


class Status(models.TextChoices):
    """A job's state (see the state machine in docs/discussions/how-it-works.md)."""

    PENDING = "pending", "Pending"
    SCHEDULED = "scheduled", "Scheduled"
    RUNNING = "running", "Running"
    DONE = "done", "Done"
    DEAD = "dead", "Dead"
    CANCELLED = "cancelled", "Cancelled"
    #: Waits for the jobs it depends on (``depends_on``, chains, groups) to finish;
    #: released to pending (or scheduled) by the statement that finishes the last one.
    WAITING = "waiting", "Waiting"


#: States in which a job is still "live": an idempotency key is unique among these.
LIVE_STATUSES = (Status.PENDING, Status.SCHEDULED, Status.RUNNING, Status.WAITING)
#: States a job ends in (done is pruned after retention; dead waits for an operator).
FINISHED_STATUSES = (Status.DONE, Status.DEAD, Status.CANCELLED)
