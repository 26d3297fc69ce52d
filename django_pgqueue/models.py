"""The jobs table.

One row per job. Every state change at run time is one SQL statement from ``sql/``,
issued by ``JobManager`` or, for its passes, the sweeper; the ORM is used for reading
(admin, ``get_result``) only.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import models
from django.db.models import ExpressionWrapper, F, Q, Value
from django.db.models.lookups import LessThan

from .fields import CharArrayField, TimestampArrayField
from .manager import JobManager
from .states import FINISHED_STATUSES, LIVE_STATUSES, Status

__all__ = ["FINISHED_STATUSES", "LIVE_STATUSES", "SEARCHABLE", "Job"]

#: The rows the search indexes hold: every job but a running one (see Job.Meta.indexes).
#: A query served by them says it too (``admin.search.searched``).
SEARCHABLE = ~Q(status="running")


class ClockTimestamp(models.Func):
    """``clock_timestamp()``: the database's wall clock, even inside a transaction."""

    template = "clock_timestamp()"
    output_field = models.DateTimeField()


class IsTrue(models.Func):
    """``(condition) IS TRUE``: the same rows as the condition, in a form PostgreSQL
    does not prove implied by the condition itself. An index whose predicate says
    ``(status = 'running') IS TRUE`` serves only queries that say it that way, and a
    query that says it cannot be served by an index on ``status = 'running'``: the
    planner has no choice to get wrong (see pgqueue_job_running_key_idx)."""

    template = "(%(expressions)s) IS TRUE"
    output_field = models.BooleanField()


class GinIndex(models.Index):
    """An index ``USING gin``: ``django.contrib.postgres``'s ``GinIndex`` would make that
    app required (system check postgres.E005), and the quickstart installs only this
    one."""

    def create_sql(self, model: Any, schema_editor: Any, using: str = "", **kwargs: Any) -> Any:
        return super().create_sql(model, schema_editor, using=" USING gin", **kwargs)


class EmptyTextArray(models.Func):
    """``'{}'::text[]``: the database default of a job's tags, so every statement that
    inserts a job without naming them (periodic entries, workflows) stores none."""

    template = "'{}'::text[]"
    output_field = CharArrayField(item_length=None)


class Job(models.Model):
    """A unit of work: which ``django.tasks.Task`` to call, with what, and where it is."""

    Status = Status  # the queue's own states (states.py)

    id = models.BigAutoField(primary_key=True)
    backend = models.CharField(max_length=64, default="default")
    queue = models.CharField(max_length=64, default="default", db_default="default")
    task = models.CharField(max_length=255, help_text="Dotted path of a django.tasks.Task")
    args = models.JSONField(default=list)
    kwargs = models.JSONField(default=dict)
    priority = models.IntegerField(default=0, db_default=0)
    status = models.CharField(
        max_length=16,
        choices=Status.choices,
        default=Status.PENDING,
        db_default="pending",
    )
    attempts = models.IntegerField(default=0, db_default=0)
    max_attempts = models.IntegerField()
    run_at = models.DateTimeField(db_default=ClockTimestamp())
    lease_owner = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    errors = models.JSONField(default=list)
    result = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=ClockTimestamp())
    started_at = models.DateTimeField(null=True, blank=True)
    last_attempted_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Set by Job.objects.cancel() on a running job: its worker stops it (see cancellation).
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    #: The enqueuer's trace context (W3C headers) when OpenTelemetry is installed and a
    #: trace was active; the worker links each run's span to it (see tracing.py).
    trace_context = models.JSONField(null=True, blank=True)
    #: How often the task snoozed (``raise Snooze(seconds)``); bounded by PGQUEUE_MAX_SNOOZES.
    snoozes = models.IntegerField(default=0, db_default=0)
    #: What the running task last said of its progress (``current_job().set_progress``).
    progress = models.JSONField(null=True, blank=True)
    #: The budget the job is counted in by ``PGQUEUE_LIMITS`` and fair turns (see
    #: flow.py); "" (the default): none. Not NULL, so that jobs without a key are one
    #: more group of the key claim index, reached by a seek like any key.
    concurrency_key = models.CharField(max_length=255, default="", db_default="", blank=True)
    #: How many of the jobs it depends on have not finished (``JobDependency`` rows of
    #: it without a ``state``); None for a job without parents. Kept exact by every
    #: statement that finishes a parent: at 0 a waiting job is released (see workflows.py).
    parents_left = models.IntegerField(null=True, blank=True)
    #: How its parents' results reach the task when it is released, prepended to its
    #: args: ``"value"``, its one parent's result (a chain's step); ``"list"``, the list of
    #: them in ``depends_on`` order (a group's callback); None, not at all.
    parent_results = models.CharField(max_length=8, null=True, blank=True)  # noqa: DJ001
    #: ``"run"``: released once every parent finished, whatever their outcome. None: the
    #: default, cancelled as soon as a parent ends dead or cancelled.
    on_parent_failure = models.CharField(max_length=8, null=True, blank=True)  # noqa: DJ001
    #: The chain or group the job belongs to: the id of the workflow's first job (a job
    #: enqueued with ``depends_on`` joins its first parent's). None: no workflow.
    workflow_id = models.BigIntegerField(null=True, blank=True)
    #: Created with dependants (a workflow's parent): its completion resolves them in
    #: the same statement (``sql.JOB_COMPLETE_RELEASING``). A job that gets dependants
    #: later keeps False: its completion finds them (``sql.JOB_COMPLETE``'s
    #: ``dependants``) and resolves them right after.
    has_dependants = models.BooleanField(default=False, db_default=False)
    #: Someone waits on it (``django_pgqueue.wait_for``, ``watch``): its end and its
    #: progress are announced on the channel ``pgqueue_waited`` (``sql/wait.py``'s
    #: trigger). False for every job nobody waits on, which the trigger skips.
    waited = models.BooleanField(default=False, db_default=False)
    #: Seconds it may run before ``SoftTimeLimitExceeded`` is raised inside its task,
    #: given at enqueue; None: the task's ``soft_time_limit``, else the setting's.
    soft_time_limit = models.FloatField(null=True, blank=True)
    #: Seconds after which, still running, it is failed with ``TimeLimitExceeded`` and
    #: its worker process replaced; None: the task's ``time_limit``, else the setting's.
    time_limit = models.FloatField(null=True, blank=True)
    #: Labels to find the job by (``enqueue(..., tags=["customer:42"])``), checked by
    #: ``validation.tags``; served by the GIN index ``pgqueue_job_tags_search_idx``.
    tags = CharArrayField(item_length=None, default=list, db_default=EmptyTextArray(), blank=True)

    objects = JobManager()

    class Meta:
        db_table = "pgqueue_job"  # the SQL hard-codes this name; a test checks they agree
        ordering = ["-id"]
        permissions = [
            ("requeue_job", "Can requeue dead jobs"),
            ("cancel_job", "Can cancel jobs"),
        ]
        indexes = [
            # The claim path: exactly JOB_CLAIM's predicate and ORDER BY. Built
            # CONCURRENTLY in its own migration (0002) so it never locks the table.
            models.Index(
                fields=["-priority", "id"],
                name="pgqueue_job_claim_idx",
                condition=Q(status="pending"),
            ),
            # The claim path of a worker of some queues (JOB_CLAIM_QUEUES): each queue's
            # pending jobs in claim order, so a small queue is never reached by walking
            # a huge one's entries. Built CONCURRENTLY in its own migration (0007).
            models.Index(
                fields=["queue", "-priority", "id"],
                name="pgqueue_job_queue_claim_idx",
                condition=Q(status="pending"),
            ),
            # Each queue's oldest pending job and its backlog (pgqueue_status, the
            # dashboard, the metrics: sql.JOB_GET_QUEUE_BACKLOG), one seek per queue
            # however big another queue is. Built CONCURRENTLY in its own migration (0024).
            models.Index(
                fields=["queue", "run_at"],
                name="pgqueue_job_pending_age_idx",
                condition=Q(status="pending"),
            ),
            # The sweeper's rescue scan: only leased rows, by expiry.
            models.Index(
                fields=["lease_expires_at"],
                name="pgqueue_job_lease_idx",
                condition=Q(status="running"),
            ),
            # Promotion of due delayed/backing-off jobs, kept out of the claim index.
            models.Index(
                fields=["run_at"],
                name="pgqueue_job_scheduled_idx",
                condition=Q(status="scheduled"),
            ),
            # The dead-letter admin list (status = 'dead' ORDER BY id DESC): without it,
            # a few dead letters among millions of jobs cost a full scan per page.
            # Built CONCURRENTLY in its own migration (0003).
            models.Index(
                fields=["id"],
                name="pgqueue_job_dead_idx",
                condition=Q(status="dead"),
            ),
            # Pruning of finished jobs past retention.
            models.Index(
                fields=["finished_at"],
                name="pgqueue_job_done_idx",
                condition=Q(status="done"),
            ),
            # Cancellations of the last minutes (monitoring), newest first. Built
            # CONCURRENTLY in its own migration (0010).
            models.Index(
                fields=["finished_at"],
                name="pgqueue_job_cancelled_idx",
                condition=Q(status="cancelled"),
            ),
            # The flow claim's walk over groups of pending jobs (queue, priority, key):
            # a seek from one key to the next, so a key's backlog is never walked
            # (sql.JOB_CLAIM_FLOW, _LIMITED). Built CONCURRENTLY in its own migration (0017).
            models.Index(
                fields=["queue", "-priority", "concurrency_key", "id"],
                name="pgqueue_job_key_claim_idx",
                condition=Q(status="pending"),
            ),
            # What runs per concurrency key: a limited claim counts a key's running
            # jobs by a range of it (sql.FLOW_USAGE_FUNCTION). Keyed jobs only, so a
            # claim of a job without a key costs nothing more. Its predicate says
            # "(status = 'running') IS TRUE", as the queries that use it do, so that
            # pgqueue_job_lease_idx (status = 'running') can never serve them: with
            # statistics that see no running job, the planner priced both alike and a
            # worker's cached plan could read every running job of the fleet for
            # each key of every claim. Built CONCURRENTLY (0019, which replaced
            # 0017's pgqueue_job_key_running_idx).
            models.Index(
                fields=["concurrency_key"],
                name="pgqueue_job_running_key_idx",
                condition=Q(IsTrue(Q(status="running")), concurrency_key__gt=""),
            ),
            # Jobs waiting for their parents (status counts, the admin's list): never in
            # the claim index. Built CONCURRENTLY in its own migration (0014).
            models.Index(
                fields=["id"],
                name="pgqueue_job_waiting_idx",
                condition=Q(status="waiting"),
            ),
            # A workflow's jobs (the admin's progress of a chain or group); only jobs of
            # one are in it. Built CONCURRENTLY in its own migration (0014).
            models.Index(
                fields=["workflow_id", "id"],
                name="pgqueue_job_workflow_idx",
                condition=Q(workflow_id__isnull=False),
            ),
            # The admin's search and tag filter: "every job with tag X" (tags @> ARRAY[X]),
            # an argument's value (args @> '[42]', kwargs @> '{"customer_id": 42}';
            # jsonb_path_ops: containment only, a smaller index) and a task path (exact,
            # or a prefix). Not for running jobs (``SEARCHABLE``): every claim and
            # completion moves a row to a new version, and an index that holds every
            # version gets an entry at each, which cost the drain a fifth of
            # PostgreSQL's time per job; with running rows left out the claim adds
            # none. The few running jobs are found through pgqueue_job_lease_idx
            # (admin.search.searched). Built CONCURRENTLY (0027, replacing 0026's).
            GinIndex(fields=["tags"], name="pgqueue_job_tags_search_idx", condition=SEARCHABLE),
            GinIndex(
                fields=["args"],
                opclasses=["jsonb_path_ops"],
                name="pgqueue_job_args_search_idx",
                condition=SEARCHABLE,
            ),
            GinIndex(
                fields=["kwargs"],
                opclasses=["jsonb_path_ops"],
                name="pgqueue_job_kwargs_search_idx",
                condition=SEARCHABLE,
            ),
            models.Index(
                fields=["task", "id"],
                name="pgqueue_job_task_search_idx",
                opclasses=["text_pattern_ops", "int8_ops"],
                condition=SEARCHABLE,
            ),
            # The admin's search by idempotency key (finished jobs too, which
            # pgqueue_job_idempotency_uniq does not hold). Built CONCURRENTLY (0026).
            models.Index(
                fields=["idempotency_key"],
                name="pgqueue_job_key_search_idx",
                condition=Q(idempotency_key__isnull=False),
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=Status.values),
                name="pgqueue_job_status_valid",
            ),
            models.CheckConstraint(
                condition=Q(priority__gte=-100, priority__lte=100),
                name="pgqueue_job_priority_range",
            ),
            models.CheckConstraint(
                condition=Q(attempts__gte=0), name="pgqueue_job_attempts_nonnegative"
            ),
            models.CheckConstraint(
                condition=Q(max_attempts__gte=1),
                name="pgqueue_job_max_attempts_positive",
            ),
            models.CheckConstraint(
                condition=~Q(status="running")
                | Q(lease_owner__isnull=False, lease_expires_at__isnull=False),
                name="pgqueue_job_running_has_lease",
            ),
            models.UniqueConstraint(
                fields=["queue", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False, status__in=LIVE_STATUSES),
                name="pgqueue_job_idempotency_uniq",
            ),
        ]

    def __str__(self) -> str:
        return f"Job {self.id} {self.task} [{self.status}]"

    @property
    def last_error(self) -> dict | None:
        """The newest error entry, or None."""
        return self.errors[-1] if self.errors else None


class JobKey(models.Model):
    """A key that outlives its job: the window of ``enqueue(unique_for=...)`` (kind
    ``unique``, until ``expires_at``) and the not-yet-started job of
    ``enqueue(debounce=...)`` (kind ``debounce``). Written only by the statements of
    ``sql/`` (``JOB_ENQUEUE_UNIQUE``, ``JOB_ENQUEUE_DEBOUNCED``,
    ``JOB_DELETE_EXPIRED_KEYS``); see ``enqueue.py``."""

    pk = models.CompositePrimaryKey("kind", "queue", "key")
    kind = models.CharField(max_length=16)
    queue = models.CharField(max_length=64)
    key = models.CharField(max_length=255)
    # Not a foreign key: the job may be pruned while its window is still open.
    job_id = models.BigIntegerField()
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()

    class Meta:
        db_table = "pgqueue_job_key"  # the SQL hard-codes this name too
        indexes = [
            # The sweeper's pruning of expired keys. Built CONCURRENTLY (0012).
            models.Index(fields=["expires_at"], name="pgqueue_job_key_expires_idx"),
        ]

    def __str__(self) -> str:
        return f"JobKey {self.kind} {self.queue}/{self.key} -> {self.job_id}"


class Limit(models.Model):
    """A limit set at run time (``Job.objects.set_limit``, the admin), by its key as in
    ``PGQUEUE_LIMITS``: it replaces the settings' entry of the same key, which is the
    declared default; a row with neither a concurrency nor a rate lifts that entry.
    Workers read the rows about once a second, and at once when told (see flow.py)."""

    key = models.CharField(
        max_length=255,
        primary_key=True,
        help_text='"stripe" (one budget), "tenant:*" (one per matching key), "queue:NAME"',
    )
    concurrency = models.IntegerField(
        null=True, blank=True, help_text="Most jobs running at once (empty: no bound)"
    )
    rate = models.CharField(
        max_length=32,
        blank=True,
        default="",
        help_text='Most starts in any sliding window: "R/s", "R/m" or "R/h" (empty: none)',
    )
    updated_at = models.DateTimeField(db_default=ClockTimestamp())

    class Meta:
        db_table = "pgqueue_limit"  # the SQL hard-codes this name too
        ordering = ["key"]
        verbose_name = "limit"

    def __str__(self) -> str:
        return f"Limit {self.key}"


class Queue(models.Model):
    """A queue's run-time state: paused (``paused_at`` set) or not. Written only by
    ``Job.objects.pause_queue``/``resume_queue`` (``QUEUE_*`` of ``sql/flow_control.py``);
    a queue without a row is running."""

    name = models.CharField(max_length=64, primary_key=True)
    paused_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(db_default=ClockTimestamp())

    class Meta:
        db_table = "pgqueue_queue"  # the SQL hard-codes this name too
        ordering = ["name"]
        verbose_name = "queue"

    def __str__(self) -> str:
        return f"Queue {self.name}{' (paused)' if self.paused_at else ''}"


class RateWindow(models.Model):
    """The starts of one rate budget within its window (a limit's key and the budget's
    subject: the concurrency key, or the queue of a ``queue:NAME`` limit). Written only
    by the limited claims, under the budget's lock (``sql._RATE_LOGGED``); rows whose
    window closed are deleted by the sweeper."""

    pk = models.CompositePrimaryKey("name", "subject")
    name = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    starts = TimestampArrayField()
    expires_at = models.DateTimeField()

    class Meta:
        db_table = "pgqueue_rate"  # the SQL hard-codes this name too
        indexes = [
            # The sweeper's pruning of closed windows (a new table: built with it, 0016).
            models.Index(fields=["expires_at"], name="pgqueue_rate_expires_idx"),
        ]

    def __str__(self) -> str:
        return f"RateWindow {self.name} {self.subject}: {len(self.starts or ())} starts"


class JobDependency(models.Model):
    """One edge of a workflow: job ``job_id`` waits for job ``parent_id``, its
    ``position``-th parent (``depends_on`` order, the order of a group's results).

    ``state`` is NULL until the parent finishes, then the parent's final status
    (``done``, ``dead``, ``cancelled``), with its ``result`` when done: the edge keeps
    the parent's outcome, so nothing needs the parent's row once its edges are resolved
    (retention may prune it). Written only by the statements of ``sql/``; each edge is
    resolved once (``state IS NULL`` is every resolving UPDATE's guard). ``repair``
    marks an edge whose parent's finishing statement may not see it (the parent existed
    before the dependant was enqueued, or a cascade stopped at its depth); the sweeper
    resolves such an edge once its parent finished (``sql.JOB_RESOLVE_MISSED``). Not
    foreign keys: a pruned parent leaves its edges, which the dependant's pruning
    deletes."""

    pk = models.CompositePrimaryKey("job_id", "position")
    job_id = models.BigIntegerField()
    position = models.IntegerField()
    parent_id = models.BigIntegerField()
    state = models.CharField(max_length=16, null=True, blank=True)  # noqa: DJ001
    result = models.JSONField(null=True, blank=True)
    repair = models.BooleanField(default=False, db_default=False)

    class Meta:
        db_table = "pgqueue_job_dependency"  # the SQL hard-codes this name too
        indexes = [
            # A job's dependants, resolved or not (the admin, a requeue's restore).
            # Built CONCURRENTLY (0014), as the two below.
            models.Index(fields=["parent_id"], name="pgqueue_job_dep_parent_idx"),
            # Unresolved edges only: whether there is any at all is the one probe a
            # completion makes when no workflow is in flight (sql._RESOLVE).
            models.Index(
                fields=["parent_id"],
                name="pgqueue_job_dep_unresolved_idx",
                condition=Q(state__isnull=True),
            ),
            # The sweeper's missed edges: few, and only while their parent runs.
            models.Index(
                fields=["parent_id"],
                name="pgqueue_job_dep_repair_idx",
                condition=Q(repair=True, state__isnull=True),
            ),
        ]

    def __str__(self) -> str:
        return f"JobDependency {self.job_id} <- {self.parent_id} (#{self.position})"


class JobStep(models.Model):
    """A durable step of a job (``current_job().run_step``), a cursor
    (``current_job().cursor``) or a durable sleep (``current_job().sleep``): what a
    later run of the job reads instead of doing the work again (see steps.py).

    Written only by the fenced statements of ``sql/steps.py``. The foreign key to the
    job is the database's, ``ON DELETE CASCADE`` (migration 0020): retention, or any
    delete of a job, removes its steps in the same statement; Django does nothing
    itself (``DO_NOTHING``). Unique per (job, kind, name), which is also the index a
    cascade and a job's read of its steps use."""

    class Kind(models.TextChoices):
        STEP = "step", "step"
        CURSOR = "cursor", "cursor"
        SLEEP = "sleep", "sleep"

    id = models.BigAutoField(primary_key=True)
    job = models.ForeignKey(
        Job,
        on_delete=models.DO_NOTHING,
        db_constraint=False,  # created by migration 0020, with ON DELETE CASCADE
        db_index=False,  # the unique constraint below leads with job_id
        related_name="steps",
    )
    kind = models.CharField(max_length=8, choices=Kind.choices)
    name = models.CharField(max_length=200)
    #: The attempt that wrote it (a cursor: its last save).
    attempt = models.IntegerField()
    value = models.JSONField(null=True, blank=True)
    #: The size of ``value`` as JSON text, in bytes (characters), when written.
    size = models.IntegerField()
    finished_at = models.DateTimeField()

    class Meta:
        db_table = "pgqueue_step"  # the SQL hard-codes this name too
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(
                fields=["job", "kind", "name"], name="pgqueue_step_job_name_uniq"
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.name!r} of job {self.job_id}"


class DeadLetter(Job):
    """Proxy over dead jobs, so the admin can list dead letters on their own page."""

    class Meta:
        proxy = True
        verbose_name = "dead letter"
        verbose_name_plural = "dead letters"


class Schedule(models.Model):
    """The state of one ``PGQUEUE_PERIODIC`` entry: the last tick enqueued for it.

    Written only by the sweeper's two statements (``sql.SCHEDULE_SYNC`` and
    ``sql.SCHEDULE_ENQUEUE_TICKS``); the settings stay the source of the entry itself, so
    a row whose entry was removed from the settings is left behind and ignored."""

    name = models.CharField(max_length=200, primary_key=True)
    task = models.CharField(max_length=255)
    cron = models.CharField(max_length=255)
    timezone = models.CharField(max_length=64)
    enabled = models.BooleanField(default=True)
    last_tick = models.DateTimeField(
        help_text="The latest tick enqueued (or skipped: a new, changed or disabled entry)"
    )
    # Not a foreign key: done jobs are pruned, and the link may outlive its job.
    last_job_id = models.BigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=ClockTimestamp())
    updated_at = models.DateTimeField(db_default=ClockTimestamp())

    class Meta:
        db_table = "pgqueue_schedule"  # the SQL hard-codes this name too
        ordering = ["name"]
        verbose_name = "periodic schedule"

    def __str__(self) -> str:
        return f"Schedule {self.name} ({self.cron})"


class ScheduleDefinition(models.Model):
    """A periodic schedule kept in the database (``django_pgqueue.schedules``), editable
    at run time: what a ``PGQUEUE_PERIODIC`` entry says, in a row. Written by
    ``schedules.py`` (and the admin through it), every value checked as a settings
    entry's is; read by each sweep pass, which ticks it through the same statements as
    the settings' entries (its tick state is its ``Schedule`` row, by name). A name
    the settings use is refused."""

    name = models.CharField(max_length=200, primary_key=True)
    task = models.CharField(max_length=255, help_text="Dotted path of a django.tasks.Task")
    cron = models.CharField(max_length=255, help_text="5-field cron, or @daily, @hourly...")
    timezone = models.CharField(max_length=64, default="UTC")
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)
    queue = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001
    priority = models.IntegerField(null=True, blank=True)
    enabled = models.BooleanField(default=True)
    unique_for = models.FloatField(null=True, blank=True, help_text="Seconds")
    created_at = models.DateTimeField(db_default=ClockTimestamp())
    updated_at = models.DateTimeField(db_default=ClockTimestamp())

    class Meta:
        db_table = "pgqueue_schedule_definition"
        ordering = ["name"]
        verbose_name = "database schedule"
        permissions = [("run_scheduledefinition", "Can run a database schedule now")]

    def __str__(self) -> str:
        return f"{self.name} ({self.cron}, {self.timezone})"


class Dashboard(Job):
    """Proxy that gives the admin's queue dashboard its place on the admin index; it
    reads nothing of its own (see ``admin.DashboardAdmin``)."""

    class Meta:
        proxy = True
        verbose_name = "dashboard"
        verbose_name_plural = "dashboard"
        default_permissions = ()  # shown to whoever may view jobs


class WorkerQuerySet(models.QuerySet["WorkerProcess"]):
    def with_state(self) -> WorkerQuerySet:
        """Annotate ``lost``: last seen longer ago than the worker's own lease, by the
        database clock (the same rule as ``sql.WORKER_GET_ALL``)."""
        lease = ExpressionWrapper(
            Value(dt.timedelta(seconds=1)) * F("lease_seconds"),
            output_field=models.DurationField(),
        )
        expires = ExpressionWrapper(F("last_seen_at") + lease, output_field=models.DateTimeField())
        return self.annotate(lost=LessThan(expires, ClockTimestamp()))


class WorkerProcess(models.Model):
    """One running ``pgqueue_worker`` process, as it last reported itself.

    Registered when the worker starts, refreshed by its heartbeat, deleted when it exits
    cleanly. A row whose ``last_seen_at`` is older than the worker's own lease belongs to
    a worker that died or lost the database: it is shown as lost, and the sweeper deletes
    it once ``PGQUEUE_LOST_WORKER_SECONDS`` more have passed. Written only by the
    statements of ``sql/`` (``WORKER_*``); read by the admin and ``monitoring.py``.
    """

    id = models.CharField(max_length=255, primary_key=True, help_text="The lease owner name")
    #: A random token of the process that registered the row: a worker refreshes and
    #: deletes only a row of its own instance, not one another process took over.
    instance = models.CharField(max_length=32, default="", db_default="", blank=True)
    hostname = models.CharField(max_length=255)
    pid = models.IntegerField()
    queues = CharArrayField(item_length=64, null=True, blank=True, help_text="None: every queue")
    concurrency = models.IntegerField()
    lease_seconds = models.FloatField()
    version = models.CharField(max_length=64)
    started_at = models.DateTimeField(db_default=ClockTimestamp())
    last_seen_at = models.DateTimeField(db_default=ClockTimestamp())
    jobs_held = models.IntegerField(default=0, db_default=0)
    jobs_done = models.BigIntegerField(default=0, db_default=0)
    jobs_failed = models.BigIntegerField(default=0, db_default=0)
    #: Its resident memory at its last heartbeat (None: not measured).
    rss_bytes = models.BigIntegerField(null=True, blank=True)
    #: How many processes were in its place before it: replaced for a job past its
    #: time limit or for ``--max-memory`` (a supervisor's slot, or one process).
    restarts = models.IntegerField(default=0, db_default=0)

    objects = WorkerQuerySet.as_manager()

    class Meta:
        db_table = "pgqueue_worker"  # the SQL hard-codes this name; a test checks they agree
        ordering = ["hostname", "id"]
        verbose_name = "worker"
        verbose_name_plural = "workers"

    def __str__(self) -> str:
        return self.id
