"""Workflows: jobs that wait for other jobs. Chains, groups with a callback, and
``Job.objects.enqueue(..., depends_on=[...])`` for any graph.

A job with parents is stored ``waiting``, with ``parents_left`` (how many of them have
not finished) and one ``JobDependency`` row (an edge) per parent. It is never claimed:
the claim reads only ``pending`` rows. A parent created with its dependants (a chain's
or a group's, ``has_dependants``) is completed by a statement that releases them in
place, as is any job ending otherwise (failed, rescued, cancelled: ``sql._RESOLVE``):
pending (or scheduled, if its ``run_at`` is ahead), its parents' results prepended to
its args if it takes them. A late (zombie) completion changes no row, so nothing is
released twice; a crash after the completion's commit loses nothing, since the release
was part of it. A parent that got a dependant after it was created is completed by the
plain statement, which says so, and its dependants are resolved right after
(``Job.objects._completed``; the sweeper if the worker died in between).

A parent that ends ``dead`` or ``cancelled`` cancels what waits on it, and what waits on
that, unless the dependant was enqueued with ``on_parent_failure="run"``: then it runs
once all its parents finished, whatever their outcome, and reads them through
``current_job().parents()``. Requeueing a dead parent puts back what its death
cancelled (``Job.objects.requeue_dead``).

This module builds the graphs: :func:`step`, :func:`chain`, :func:`group` write a whole
workflow at once (:func:`write`: one statement, or COPY batches in one transaction for a
big one), joining the caller's transaction if any; :func:`enqueue_dependant` writes one
job with existing parents (``sql.JOB_ENQUEUE_DEPENDANT``).

The one race SQL alone cannot close: a job enqueued with a parent that is running, in a
transaction that commits while that parent's completion statement runs. That statement's
snapshot predates the new edge, so it cannot release it. Such an edge is marked for
repair: right after the enqueue commits, :func:`resolve_late` resolves it if the parent
finished meanwhile (``sql.JOB_RESOLVE_LATE``), and the sweeper resolves whatever that
missed (``sql.JOB_RESOLVE_MISSED``): the enqueuer died first, or the completion wrote
its row only after the re-check read it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from django.apps import apps
from django.db import DatabaseError, connections, models, transaction

from . import bulk, db, defaults, enqueue, schema, validation
from .conf import settings
from .databases import QueueBackend, backend_database
from .exceptions import InvalidJob
from .framework import to_task_result
from .sql import resolve
from .sql import workflow as sql
from .states import Status
from .taskapi import FRAMEWORK, InvalidTask, Task, task_backends, task_enqueued

logger = logging.getLogger(__name__)

# Annotations only: the models and the manager sit above this module.
Job = Any
JobManager = Any

#: What ``on_parent_failure`` may be: the default cancels the dependant when a parent
#: ends dead or cancelled; "run" releases it anyway once every parent finished.
ON_PARENT_FAILURE = ("cancel", "run")
#: The payload prefix of the NOTIFY a released dependant sends (then its queue name; no
#: queue name holds a colon): the listener makes the next claim start at the head.
RELEASE_NOTIFY_PREFIX = resolve.RELEASE_NOTIFY_PREFIX
#: The largest job id (a bigint): a larger one in ``depends_on`` is refused, never sent.
MAX_JOB_ID = 2**63 - 1
#: How many levels of dependants ``Job.objects.requeue_dead`` puts back at most.
RESTORE_LEVELS = 1000


@dataclass(frozen=True, slots=True)
class Step:
    """A call not yet enqueued: ``task`` (a ``Task``, options through ``task.using()``,
    or its dotted path) with ``args`` and ``kwargs``. Made by :func:`step`."""

    task: Task | str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


def step(task: Task | str, /, *args: Any, **kwargs: Any) -> Step:
    """A call of ``task`` with these arguments, to put in a :func:`chain` or a
    :func:`group` (where results are prepended to ``args``)."""
    return Step(task, args, kwargs)


def on_parent_failure_option(value: Any) -> str | None:
    """The stored form of ``on_parent_failure``: None for "cancel" (the default), "run";
    anything else raises ``InvalidJob`` naming it."""
    if value is None or value == "cancel":
        return None
    if value == "run":
        return "run"
    raise InvalidJob(
        f"on_parent_failure must be one of {', '.join(map(repr, ON_PARENT_FAILURE))}, "
        f"not {validation.show(value)}"
    )


def _steps(given: Iterable[Any], what: str) -> list[Step]:
    """``given`` as steps: a bare ``Task`` is a step without arguments."""
    steps = []
    for position, item in enumerate(given):
        if isinstance(item, Step):
            steps.append(item)
        elif isinstance(item, Task):
            steps.append(Step(item))
        else:
            raise InvalidJob(
                f"{what} #{position} must be a step (django_pgqueue.step(task, ...)) or a "
                f"{FRAMEWORK}.Task, not {type(item).__name__} {validation.show(item)}"
            )
    return steps


@dataclass
class _Node:
    """One job of a workflow being written: its step and its place in the graph
    (``parents``: indexes of earlier nodes)."""

    step: Step
    parents: list[int] = field(default_factory=list)
    parent_results: str | None = None
    on_parent_failure: str | None = None


class Chain:
    """Steps run one after another, each given the previous one's return value as its
    first positional argument. Made by :func:`chain`."""

    def __init__(
        self,
        steps: Sequence[Step],
        *,
        on_parent_failure: str | None = None,
        tags: Sequence[str] | None = None,
    ) -> None:
        self.steps = list(steps)
        self.on_parent_failure = on_parent_failure_option(on_parent_failure)
        self.tags = validation.tags(tags)

    def enqueue(self) -> Jobs:
        """Store every step (all or nothing, joining the caller's transaction); return
        their jobs in order. The first is pending; each other waits for the one before
        it, and is cancelled if that one ends dead or cancelled (unless
        ``on_parent_failure="run"``: then it runs, given None)."""
        if not self.steps:
            raise InvalidJob("chain() needs at least one step")
        nodes = [
            _Node(s) if i == 0 else _Node(s, [i - 1], "value", self.on_parent_failure)
            for i, s in enumerate(self.steps)
        ]
        return write(nodes, tags=self.tags)


class Group:
    """Steps run side by side, then ``then`` once with the list of their results (in
    the members' order) as its first positional argument. Made by :func:`group`."""

    def __init__(
        self,
        steps: Sequence[Step],
        *,
        then: Step | None = None,
        on_parent_failure: str | None = None,
        tags: Sequence[str] | None = None,
    ) -> None:
        self.steps = list(steps)
        self.then = then
        self.on_parent_failure = on_parent_failure_option(on_parent_failure)
        self.tags = validation.tags(tags)

    def enqueue(self) -> Jobs:
        """Store the members and the callback (all or nothing, joining the caller's
        transaction; through COPY, however many); return the members' jobs, then the
        callback's. The callback waits for every member; it is cancelled as soon as one
        ends dead or cancelled, unless ``on_parent_failure="run"``: then it runs once
        all finished, a failed member's result None. Without members it starts at once,
        given ``[]``."""
        nodes = [_Node(s) for s in self.steps]
        if self.then is not None and not self.steps:
            # No member: the callback starts at once, given the empty list of results.
            then = self.then
            nodes.append(_Node(Step(then.task, ([], *then.args), then.kwargs)))
        elif self.then is not None:
            nodes.append(
                _Node(self.then, list(range(len(self.steps))), "list", self.on_parent_failure)
            )
        elif self.on_parent_failure is not None:
            raise InvalidJob("on_parent_failure applies to the callback: give then=step")
        if not nodes:
            raise InvalidJob("group() needs at least one step")
        return write(nodes, tags=self.tags)


def chain(
    *steps: Step | Task,
    on_parent_failure: str | None = None,
    tags: Sequence[str] | None = None,
) -> Chain:
    """``chain(step(a, 1), step(b), c).enqueue()``: a, then b(a's result), then c(b's
    result). ``tags`` are added to every step's job (after its task's). See
    :class:`Chain`."""
    return Chain(_steps(steps, "chain step"), on_parent_failure=on_parent_failure, tags=tags)


def group(
    *steps: Step | Task,
    then: Step | Task | None = None,
    on_parent_failure: str | None = None,
    tags: Sequence[str] | None = None,
) -> Group:
    """``group(step(a, 1), step(a, 2), then=step(total)).enqueue()``: both a's side by
    side, then total([result 1, result 2]). ``tags`` are added to every job (after its
    task's). See :class:`Group`."""
    callback = None if then is None else _steps([then], "then")[0]
    return Group(
        _steps(steps, "group member"),
        then=callback,
        on_parent_failure=on_parent_failure,
        tags=tags,
    )


# --- writing a workflow ---------------------------------------------------------------


class _Checker:
    """Checks a workflow's steps as ``Job.objects.enqueue`` would (``defaults.resolve``,
    the payload, the backend's ``validate_task``) and that they share one jobs database
    (edges cannot cross databases), raising ``InvalidJob`` naming the step. A task
    object shared by many steps (a group's members, usually) is resolved once."""

    def __init__(self, tags: Sequence[str] = ()) -> None:
        #: The workflow's tags, added to each task's own.
        self.tags = tags
        #: id(task) -> (task, its resolution, its Task, its jobs database); the task is
        #: kept so that its id cannot be reused by another object during the call.
        self.known: dict[int, tuple[Any, defaults.JobDefaults, Task, str]] = {}
        self.max_bytes = settings.MAX_PAYLOAD_BYTES
        self.alias = ""
        self.first_backend = ""

    def __call__(
        self, position: int, node: _Node
    ) -> tuple[defaults.JobDefaults, Task, str, str, str]:
        """The step's defaults, its ``Task``, its args and kwargs as JSON text, and its
        concurrency key (``defaults.concurrency_key``: the task's, maybe made from the
        step's arguments)."""
        task = node.step.task
        try:
            entry = self.known.get(id(task))
            if entry is None:
                resolved, own, database = _resolve(task, position)
                if self.tags:
                    merged = validation.merged_tags(resolved.tags, self.tags)
                    resolved = dataclasses.replace(resolved, tags=tuple(merged))
                entry = self.known[id(task)] = (task, resolved, own, database)
            _, resolved, own, database = entry
            args, kwargs, key = defaults.job_payload(
                resolved, node.step.args, node.step.kwargs, max_bytes=self.max_bytes
            )
        except InvalidJob as exc:
            raise InvalidJob(f"step #{position}: {exc}") from exc
        if not self.alias:
            self.alias, self.first_backend = database, resolved.backend
        elif database != self.alias:
            raise InvalidJob(
                f"step #{position} goes to jobs database {database!r} (backend "
                f"{resolved.backend!r}), step #0 to {self.alias!r} (backend "
                f"{self.first_backend!r}): a workflow's jobs must share one jobs database"
            )
        return resolved, own, args, kwargs, key


def _resolve(task: Any, position: int) -> tuple[defaults.JobDefaults, Task, str]:
    """A step's task: its defaults, its ``Task`` (checked by its backend, which must be
    a ``PgQueueBackend``) and its jobs database."""
    resolved = defaults.resolve(task)
    own = validation.task_object(task)
    backend = task_backends[resolved.backend]
    if not isinstance(backend, QueueBackend):
        raise InvalidJob(
            f"backend {resolved.backend!r} is {type(backend).__name__}, not a "
            "PgQueueBackend: workflows need django-pgqueue's jobs table"
        )
    try:
        backend.validate_task(own)
    except InvalidTask as exc:
        raise InvalidJob(str(exc)) from None
    try:
        database = backend_database(resolved.backend)
    except ValueError as exc:
        raise InvalidJob(str(exc)) from None
    return resolved, own, database


def write(nodes: Sequence[_Node], *, tags: Sequence[str] = ()) -> Jobs:
    """Store a workflow's jobs and edges in one transaction (the caller's, if any);
    return its jobs in node order. Steps are checked a batch at a time while the batch
    before is COPYed (as ``bulk_enqueue`` does); a bad one rolls everything back, so
    nothing is kept. Ids are taken from the sequence first, so that edges can name
    them; idle workers are woken once per queue of a job that can start now."""
    check = _Checker(tags)
    check(0, nodes[0])  # the workflow's jobs database
    try:
        if len(nodes) <= bulk.DEFAULT_BATCH_SIZE:
            return _insert(check, nodes)
        return _store(check, nodes)
    except DatabaseError as exc:
        missing = schema.not_migrated(exc, check.alias)
        if missing is None:
            raise
        raise missing from exc


def _insert(check: _Checker, nodes: Sequence[_Node]) -> Jobs:
    """A workflow of at most one COPY batch: one statement (``sql.JOB_ENQUEUE_WORKFLOW``),
    atomic by itself, joining the caller's transaction if any."""
    checked = [check(position, node) for position, node in enumerate(nodes)]
    parents = {parent for node in nodes for parent in node.parents}
    edges = [
        (job + 1, position, parent + 1)
        for job, node in enumerate(nodes)
        for position, parent in enumerate(node.parents)
    ]
    params = {
        "backend": [r.backend for r, *_ in checked],
        "queue": [r.queue for r, *_ in checked],
        "task": [r.task for r, *_ in checked],
        "args": [args for _, _, args, _, _ in checked],
        "kwargs": [kwargs for _, _, _, kwargs, _ in checked],
        "priority": [r.priority for r, *_ in checked],
        "max_attempts": [r.max_attempts for r, *_ in checked],
        "run_at": [r.run_at for r, *_ in checked],
        "concurrency_key": [key for *_, key in checked],
        "tags": [bulk.array_text(r.tags) for r, *_ in checked],
        "parents_left": [len(node.parents) if node.parents else None for node in nodes],
        "parent_results": [node.parent_results for node in nodes],
        "on_parent_failure": [node.on_parent_failure for node in nodes],
        "has_dependants": [i in parents for i in range(len(nodes))],
        "edge_job": [e[0] for e in edges],
        "edge_position": [e[1] for e in edges],
        "edge_parent": [e[2] for e in edges],
        "channel": settings.NOTIFY_CHANNEL,
        "now": None,
    }
    found = db.rows(check.alias, sql.JOB_ENQUEUE_WORKFLOW, params, prepare=True)
    ids = [row[0] for row in found]
    now = found[0][1]
    rows = []
    for position, (node, job_id, (r, _, args, kwargs, key)) in enumerate(
        zip(nodes, ids, checked, strict=True)
    ):
        rows.append(
            _job_row(node, job_id, r, args, kwargs, key, now, min(ids), position in parents)
        )
    jobs = Jobs(check.alias, rows)
    if bulk.wants_announcements():
        _announce(jobs, [own for _, own, *_ in checked])
    return jobs


#: Where a row of _job_row holds the job's status.
_STATUS_COLUMN = [name for name, _ in sql.WORKFLOW_COLUMNS].index("status")


def _job_row(
    node: _Node,
    job_id: int,
    r: defaults.JobDefaults,
    args: str,
    kwargs: str,
    key: str,
    now: dt.datetime,
    workflow_id: int,
    has_dependants: bool,
) -> tuple[Any, ...]:
    """A workflow job's row in ``sql.WORKFLOW_COLUMNS``' order: ``waiting`` while it has
    parents, else ``scheduled`` or ``pending`` by its run time against the database's
    ``now``. ``r``: its resolved defaults; ``args``/``kwargs``: its checked JSON."""
    run_at = r.run_at or now
    if node.parents:
        status = Status.WAITING.value
    elif run_at > now:
        status = Status.SCHEDULED.value
    else:
        status = Status.PENDING.value
    return (
        job_id,
        r.backend,
        r.queue,
        r.task,
        args,
        kwargs,
        r.priority,
        status,
        r.max_attempts,
        run_at,
        now,
        "[]",
        None,
        key,
        list(r.tags),
        len(node.parents) if node.parents else None,
        node.parent_results,
        node.on_parent_failure,
        workflow_id,
        has_dependants,
    )


def _store(check: _Checker, nodes: Sequence[_Node]) -> Jobs:
    alias = check.alias
    size = bulk.DEFAULT_BATCH_SIZE
    connection = connections[alias]
    job_types = [type_ for _, type_ in sql.WORKFLOW_COLUMNS]
    edge_types = [type_ for _, type_ in sql.EDGE_COLUMNS]
    announce = bulk.wants_announcements()
    tasks: list[Task] = []
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        now = db.clock(alias)
        ids = bulk.take_ids(cursor, len(nodes))
        workflow_id = ids[0]
        # Each full batch is COPYed by a helper thread while this one checks and builds
        # the next: jobs first, then the edges that name them.
        rows: list[tuple[Any, ...]] = []
        woken: set[str] = set()
        parents = {parent for node in nodes for parent in node.parents}
        with bulk.BackgroundCopy(connection) as background:
            batch: list[tuple[Any, ...]] = []
            for position, (node, job_id) in enumerate(zip(nodes, ids, strict=True)):
                r, own, args, kwargs, key = check(position, node)
                if announce:
                    tasks.append(own)
                row = _job_row(
                    node, job_id, r, args, kwargs, key, now, workflow_id, position in parents
                )
                if row[_STATUS_COLUMN] == Status.PENDING.value:
                    woken.add(r.queue)
                batch.append(row)
                if len(batch) == size:
                    background.submit(
                        len(rows), batch, statement=sql.JOB_BULK_COPY_WORKFLOW, types=job_types
                    )
                    rows.extend(batch)
                    batch = []
            if batch:
                background.submit(
                    len(rows), batch, statement=sql.JOB_BULK_COPY_WORKFLOW, types=job_types
                )
                rows.extend(batch)
            edges: list[tuple[Any, ...]] = []
            written = 0
            for node, job_id in zip(nodes, ids, strict=True):
                for position, parent in enumerate(node.parents):
                    edges.append((job_id, position, ids[parent]))
                    if len(edges) == size:
                        background.submit(
                            written, edges, statement=sql.JOB_BULK_COPY_EDGES, types=edge_types
                        )
                        written, edges = written + size, []
            if edges:
                background.submit(
                    written, edges, statement=sql.JOB_BULK_COPY_EDGES, types=edge_types
                )
            background.wait()
        if woken:
            enqueue.notify_queues(alias, woken)
        jobs = Jobs(alias, rows)
        if announce:
            _announce(jobs, tasks)
    logger.debug(
        "workflow %s: %s jobs enqueued",
        workflow_id,
        len(jobs),
        extra={"action": "enqueue", "job_id": workflow_id},
    )
    return jobs


def _announce(jobs: Jobs, tasks: Sequence[Task]) -> None:
    """``task_enqueued`` for each job, as ``PgQueueBackend.enqueue`` sends it."""
    for job, task in zip(jobs, tasks, strict=True):
        sender = type(task_backends[job.backend])
        task_enqueued.send(sender, task_result=to_task_result(job, task))


class Jobs(Sequence[Any]):
    """The jobs a workflow wrote, in order: a sequence of ``Job`` objects, each built
    when first read (a group of 100,000 whose caller reads only its callback builds
    one), as the database would give it back."""

    def __init__(self, alias: str, rows: list[tuple[Any, ...]]) -> None:
        self._alias = alias
        self._rows = rows
        self._made: list[Job | None] = [None] * len(rows)

    def __len__(self) -> int:
        return len(self._rows)

    @overload
    def __getitem__(self, index: int) -> Job: ...

    @overload
    def __getitem__(self, index: slice) -> list[Job]: ...

    def __getitem__(self, index: int | slice) -> Job | list[Job]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self._rows)))]
        job = self._made[index]
        if job is None:
            job = self._made[index] = _job(self._alias, self._rows[index])
        return job

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<Jobs: {len(self)} jobs, ids {self._rows[0][0]}..{self._rows[-1][0]}>"


_COLUMNS = [name for name, _ in sql.WORKFLOW_COLUMNS]


def _job(alias: str, row: tuple[Any, ...]) -> Job:
    """The ``Job`` of one row written (``sql.WORKFLOW_COLUMNS``)."""
    model = apps.get_model("django_pgqueue", "Job")
    values: dict[str, Any] = dict.fromkeys(_field_names(model))
    values.update(zip(_COLUMNS, row, strict=True))
    values.update(
        args=json.loads(row[4]),
        kwargs=json.loads(row[5]),
        errors=[],
        attempts=0,
        snoozes=0,
        waited=False,
    )
    return db.instance(model, alias, values)  # (values in field order)


@functools.cache
def _field_names(model: type[models.Model]) -> list[str]:
    return [f.attname for f in model._meta.concrete_fields]


# --- one job with existing parents ------------------------------------------------------


def parent_ids(depends_on: Any, *, alias: str) -> list[int]:
    """``depends_on`` as job ids, in order, checked: a collection of ``Job`` objects
    (of the jobs database ``alias``) or int ids, each named once. ``InvalidJob`` names
    what is wrong before anything is written."""
    if isinstance(depends_on, str | bytes | bytearray | memoryview) or not isinstance(
        depends_on, Iterable
    ):
        raise InvalidJob(
            "depends_on must be a collection of jobs or int job ids, not "
            f"{type(depends_on).__name__} {validation.show(depends_on)}"
        )
    ids: list[int] = []
    seen: set[int] = set()
    for item in depends_on:
        if isinstance(item, models.Model):
            job_id = item.pk
            database = item._state.db
            if job_id is None or item._meta.db_table != "pgqueue_job":
                raise InvalidJob(f"depends_on holds {item!r}, which is not a stored job")
            if database is not None and database != alias:
                raise InvalidJob(
                    f"depends_on: job {job_id} is in jobs database {database!r}, this job "
                    f"goes to {alias!r}: a job can only depend on jobs of its own database"
                )
        elif isinstance(item, int) and not isinstance(item, bool):
            job_id = item
        else:
            raise InvalidJob(
                "depends_on must hold jobs or int job ids, not "
                f"{type(item).__name__} {validation.show(item)}"
            )
        if not 1 <= job_id <= MAX_JOB_ID:
            raise InvalidJob(f"depends_on: {job_id} is no job id (ids are from 1 to {MAX_JOB_ID})")
        if job_id in seen:
            raise InvalidJob(f"depends_on names job {job_id} twice")
        seen.add(job_id)
        ids.append(int(job_id))
    return ids


def enqueue_dependant(
    model: type[models.Model],
    alias: str,
    params: dict[str, Any],
    parents: list[int],
    *,
    on_parent_failure: str | None,
) -> Job:
    """``Job.objects.enqueue`` with ``depends_on``: ``params`` are the validated
    parameters of ``sql.JOB_ENQUEUE``, ``parents`` the checked ids (:func:`parent_ids`).
    Every parent must exist in the manager's database; with an idempotency key a live
    job holds, that job is returned (and refused if it is one of the parents: a job
    cannot depend on itself). A job that waits for a live parent is re-checked once the
    enqueue commits (:func:`resolve_late`)."""
    full = {
        **params,
        "parents": parents,
        "on_parent_failure": on_parent_failure,
        "parent_results": None,
        "workflow_id": None,
    }
    for _ in range(5):
        row = db.row(alias, sql.JOB_ENQUEUE_DEPENDANT, full)
        job_id, status, found = row[0], row[1], row[-1]
        missing = sorted(set(parents) - set(found or ()))
        if missing:
            raise InvalidJob(
                f"depends_on: no job {', '.join(map(str, missing))} in jobs database {alias!r}"
            )
        if job_id is None:
            # ON CONFLICT: a live job holds the key (it may end before this read).
            existing = enqueue.live_with_key(
                model, alias, params["queue"], params["idempotency_key"]
            )
            if existing is None:
                continue
            if existing.id in parents:
                raise InvalidJob(
                    f"idempotency key {params['idempotency_key']!r} is held by job "
                    f"{existing.id}, which is in depends_on: a job cannot depend on itself"
                )
            return existing
        if status == Status.WAITING:
            transaction.on_commit(
                functools.partial(resolve_late, alias, [job_id]), using=alias, robust=True
            )
        return _dependant(model, alias, params, on_parent_failure, row)
    raise RuntimeError("idempotency key kept changing hands; giving up")


def _dependant(
    model: type[models.Model],
    alias: str,
    params: dict[str, Any],
    on_parent_failure: str | None,
    row: tuple[Any, ...],
) -> Job:
    """The ``Job`` ``JOB_ENQUEUE_DEPENDANT`` stored (``row``): the database's id, status,
    times, args (its parents' results prepended) and errors, the rest as sent."""
    job_id, status, run_at, created_at, args, errors, finished_at, parents_left = row[:8]
    workflow_id = row[8]
    trace_context = params.get("trace_context")
    values = dict.fromkeys(_field_names(model))
    values.update(
        id=job_id,
        backend=params["backend"],
        queue=params["queue"],
        task=params["task"],
        args=json.loads(args) if isinstance(args, str) else args,
        kwargs=json.loads(params["kwargs"]),
        priority=params["priority"],
        status=status,
        attempts=0,
        max_attempts=params["max_attempts"],
        run_at=run_at,
        idempotency_key=params["idempotency_key"],
        errors=json.loads(errors) if isinstance(errors, str) else errors,
        snoozes=0,
        created_at=created_at,
        finished_at=finished_at,
        trace_context=None if trace_context is None else json.loads(trace_context),
        parents_left=parents_left,
        on_parent_failure=on_parent_failure,
        workflow_id=workflow_id,
        has_dependants=False,
        tags=list(params.get("tags", ())),
    )
    return db.instance(model, alias, values)  # (values in field order)


def resolve_late(alias: str, ids: list[int], *, now: dt.datetime | None = None) -> int:
    """Resolve the edges of jobs ``ids`` whose parent finished while they were being
    enqueued (``sql.JOB_RESOLVE_LATE``); return how many. Run once their enqueue
    committed; what it cannot see yet, the sweeper resolves."""
    row = db.row(
        alias,
        sql.JOB_RESOLVE_LATE,
        {"ids": ids, "now": now, "channel": settings.NOTIFY_CHANNEL},
    )
    return int(row[0]) if row else 0


def resolve_parents(alias: str, ids: list[int], *, now: dt.datetime | None = None) -> int:
    """Resolve the dependants of the finished jobs ``ids`` (``sql.JOB_RESOLVE_PARENTS``),
    which their completion found but did not resolve; return how many edges."""
    row = db.row(
        alias,
        sql.JOB_RESOLVE_PARENTS,
        {"ids": ids, "now": now, "channel": settings.NOTIFY_CHANNEL},
    )
    return int(row[0]) if row else 0


def resolve_missed(using: str, *, now: dt.datetime | None = None, max_batches: int) -> int:
    """The sweeper's repair (``sql.JOB_RESOLVE_MISSED``): resolve the edges marked for
    repair whose parent finished, in batches of ``PGQUEUE_SWEEP_BATCH_SIZE`` parents;
    then, at most every ``STRANDED_EVERY_SECONDS`` per process, any unresolved edge whose
    parent finished (:func:`resolve_stranded`). Return how many edges."""
    resolved = _in_batches(using, sql.JOB_RESOLVE_MISSED, now, max_batches)
    last = _stranded_at.get(using)
    if last is None or time.monotonic() - last >= STRANDED_EVERY_SECONDS:
        _stranded_at[using] = time.monotonic()
        resolved += resolve_stranded(using, now=now, max_batches=max_batches)
    return resolved


#: How often (seconds) a sweeper process looks for edges no finishing statement resolved
#: although their parent finished (:func:`resolve_stranded`): the look costs a probe per
#: unresolved edge, and only a worker of an older release leaves such edges.
STRANDED_EVERY_SECONDS = 60.0
#: When each jobs database was last looked at by :func:`resolve_stranded` (monotonic).
_stranded_at: dict[str, float] = {}


def resolve_stranded(using: str, *, now: dt.datetime | None = None, max_batches: int) -> int:
    """Resolve unresolved edges whose parent has finished all the same
    (``sql.JOB_RESOLVE_STRANDED``): during a rolling upgrade, a worker of an older
    release finishes workflow parents without releasing what waits on them. So a
    waiting job whose parents all finished is released (or cancelled), whoever finished
    them. Return how many edges."""
    return _in_batches(using, sql.JOB_RESOLVE_STRANDED, now, max_batches)


def _in_batches(using: str, statement: str, now: dt.datetime | None, max_batches: int) -> int:
    """Run a repair statement (it returns parents taken, edges resolved) while it fills
    its batch of ``PGQUEUE_SWEEP_BATCH_SIZE`` parents; the edges resolved."""
    batch_size = int(settings.SWEEP_BATCH_SIZE)
    params: dict[str, Any] = {
        "now": now,
        "batch_size": batch_size,
        "channel": settings.NOTIFY_CHANNEL,
    }
    resolved = 0
    for _ in range(max_batches):
        parents, edges = db.row(using, statement, params)
        resolved += int(edges)
        if parents < batch_size:
            break
    return resolved


def restore_dependants(alias: str, requeued: list[int]) -> list[int]:
    """After dead jobs were requeued: what their failure settled, put back, level by
    level (``sql.JOB_RESTORE_DEPENDANTS``), in the caller's transaction; return the
    ids of the dependants that wait again."""
    restored: list[int] = []
    level = requeued
    for _ in range(RESTORE_LEVELS):
        if not level:
            break
        level = [row[0] for row in db.rows(alias, sql.JOB_RESTORE_DEPENDANTS, {"ids": level})]
        restored.extend(level)
    return sorted(set(restored))


__all__ = ["Chain", "Group", "Step", "chain", "group", "step"]
