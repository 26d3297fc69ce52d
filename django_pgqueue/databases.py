"""Which database each Tasks backend keeps its jobs in, and how to reach it.

One model, Django's: each ``TASKS`` alias whose backend is ``PgQueueBackend`` names its
jobs database in ``OPTIONS["DATABASE"]``. Without it the backend falls back to
``PGQUEUE_DATABASE`` if that is set, else to where the project's database routers send
writes of the ``Job`` model (``"default"`` without routers). The worker, the sweeper,
the admin and ``Job.objects`` all ask here, so they cannot disagree.

A database alias whose ``DISABLE_SERVER_SIDE_CURSORS`` is True (Django's own marker of a
connection pooler in transaction mode, such as PgBouncer) is treated as pooled: no
session state is set on it that must outlive a transaction, and the worker's LISTEN
connection goes to ``OPTIONS["LISTEN_DATABASE"]`` (or, without one, the worker polls).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.apps import apps
from django.conf import settings as django_settings
from django.db import DEFAULT_DB_ALIAS, connections, router

from .conf import settings
from .taskapi import DEFAULT_TASK_BACKEND_ALIAS, BaseTaskBackend, InvalidTaskBackend, task_backends

_UNSET = object()


class QueueBackend(BaseTaskBackend):
    """What the rest of the package knows of ``PgQueueBackend``: a Tasks backend whose
    jobs are rows of a jobs database. ``backend.PgQueueBackend`` is the one subclass;
    code below the backend asks ``isinstance(..., QueueBackend)`` so that it never
    imports the backend module, which sits above it."""

    @property
    def database(self) -> str:
        """The jobs database: ``OPTIONS["DATABASE"]``, else ``PGQUEUE_DATABASE``, else
        the routers' choice for ``Job`` (see :func:`options_database`)."""
        return options_database(self.options)


def pgqueue_backend_aliases() -> list[str]:
    """The ``TASKS`` aliases served by ``PgQueueBackend``, in settings order."""
    aliases = []
    for alias in getattr(django_settings, "TASKS", {}) or {}:
        try:
            backend = task_backends[alias]
        except InvalidTaskBackend:
            continue
        if isinstance(backend, QueueBackend):
            aliases.append(alias)
    return aliases


def options_database(options: dict[str, Any]) -> str:
    """The jobs database of a backend with these ``OPTIONS`` (see the module doc)."""
    if options.get("DATABASE"):
        return str(options["DATABASE"])
    fallback = settings.DATABASE
    if fallback:
        return str(fallback)
    # By name from the app registry: the models sit above this module.
    try:
        job_model = apps.get_model("django_pgqueue", "Job")
    except LookupError:  # not in INSTALLED_APPS: the backend's check says so (E001)
        return DEFAULT_DB_ALIAS
    return router.db_for_write(job_model)


def backend_database(alias: str | None = None) -> str:
    """The jobs database of the ``TASKS`` alias ``alias`` (None: the default alias).

    Raises ``ValueError`` naming the alias when it is not a ``PgQueueBackend``."""
    alias = alias or DEFAULT_TASK_BACKEND_ALIAS
    try:
        backend = task_backends[alias]
    except InvalidTaskBackend:
        known = ", ".join(repr(a) for a in pgqueue_backend_aliases()) or "none"
        raise ValueError(
            f"TASKS has no backend {alias!r} (PgQueueBackend aliases: {known})"
        ) from None
    if not isinstance(backend, QueueBackend):
        raise ValueError(
            f"TASKS[{alias!r}] is {type(backend).__name__}, not "
            "django_pgqueue.backend.PgQueueBackend"
        )
    return backend.database


def backend_option(alias: str, name: str) -> Any:
    """``TASKS[alias]["OPTIONS"][name]`` of a ``PgQueueBackend`` alias; None when the
    alias has no such option or is not a ``PgQueueBackend``."""
    try:
        backend = task_backends[alias]
    except InvalidTaskBackend:
        return None
    return backend.options.get(name) if isinstance(backend, QueueBackend) else None


def default_database() -> str:
    """Where ``Job.objects`` works when no database is named: the default backend's
    jobs database, or (if the default alias is not a ``PgQueueBackend``) the fallback
    of a backend without ``OPTIONS["DATABASE"]``."""
    try:
        return backend_database(None)
    except ValueError:
        return options_database({})


def is_pooled(alias: str) -> bool:
    """True if the database ``alias`` is reached through a transaction pooler."""
    return bool(connections.settings[alias].get("DISABLE_SERVER_SIDE_CURSORS"))


@dataclass(frozen=True)
class ListenTarget:
    """Where a worker LISTENs for wake-ups: ``params`` for ``psycopg.connect`` (None:
    nowhere, the worker polls) and a description for its start-up log line."""

    params: dict[str, Any] | None
    description: str


def listen_target(jobs_alias: str, options: dict[str, Any]) -> ListenTarget:
    """Resolve ``OPTIONS["LISTEN_DATABASE"]``: a ``DATABASES`` alias, a libpq DSN or URL,
    or None (poll only). Unset: the jobs database itself, unless it is pooled (LISTEN
    needs a session, which a transaction pooler does not keep), in which case poll."""
    value = options.get("LISTEN_DATABASE", _UNSET)
    if value is _UNSET:
        if is_pooled(jobs_alias):
            return ListenTarget(
                None,
                f"none: database {jobs_alias!r} is behind a transaction pooler "
                "(DISABLE_SERVER_SIDE_CURSORS) and OPTIONS['LISTEN_DATABASE'] is not set",
            )
        value = jobs_alias
    if value is None:
        return ListenTarget(None, "none: OPTIONS['LISTEN_DATABASE'] is None")
    value = str(value)
    if value in connections.settings:
        params = connections[value].get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        return ListenTarget(params, f"LISTEN on database {value!r}")
    if "=" in value or "://" in value:
        return ListenTarget({"conninfo": value}, "LISTEN on OPTIONS['LISTEN_DATABASE'] (a DSN)")
    raise ValueError(
        f"OPTIONS['LISTEN_DATABASE'] = {value!r} is neither a DATABASES alias nor a DSN"
    )
