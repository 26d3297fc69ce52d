"""System checks with stable ids (pgqueue.E0xx errors, pgqueue.W0xx warnings)."""

from __future__ import annotations

import sys
from contextvars import ContextVar
from types import FrameType
from typing import Any

from django.conf import settings as django_settings
from django.core import checks
from django.db import DatabaseError, connections

from . import bounds, flow, schema, validation
from .conf import Settings, settings
from .databases import options_database
from .periodic import entries


# Not tagged "database": Django skips database-tagged checks unless an alias is given,
# so `manage.py check` and every command's startup check would never see these.
@checks.register("pgqueue")
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    messages: list[checks.CheckMessage] = []
    for name, (allowed, nullable, check_id) in bounds.SETTINGS.items():
        value = getattr(settings, name)
        if value is None and nullable:
            continue
        problem = allowed.problem(value)
        if problem is not None:
            default = getattr(Settings, name)
            messages.append(
                checks.Error(
                    f"PGQUEUE_{name}: {problem}.",
                    hint=f"Use {bounds.setting_range(name)}, or remove the setting for "
                    f"the default, {default!r}.",
                    id=check_id,
                )
            )
    lines = settings.FRAMEWORK_LOG_LINES
    if lines is not None and not isinstance(lines, bool):
        messages.append(
            checks.Error(
                f"PGQUEUE_FRAMEWORK_LOG_LINES: {lines!r} is not True, False or None.",
                hint="Use None (Django's per-job lines only where the worker's own line "
                "is not written), True (always) or False (never).",
                id="pgqueue.E061",
            )
        )
    lease = settings.LEASE_SECONDS
    timeout = settings.JOB_TIMEOUT_SECONDS
    if (
        bounds.LEASE_SECONDS.problem(lease) is None
        and isinstance(timeout, int | float)
        and timeout < lease / 10
    ):
        messages.append(
            checks.Warning(
                "PGQUEUE_JOB_TIMEOUT_SECONDS is much shorter than the lease.",
                hint="A hung job is only recovered after its lease also expires.",
                id="pgqueue.W001",
            )
        )
    return messages


def jobs_databases() -> set[str]:
    """Aliases that hold a jobs table: each ``PgQueueBackend`` alias's jobs database
    (``databases.options_database``; read from ``TASKS``, no backend is built)."""
    aliases = set()
    for config in (getattr(django_settings, "TASKS", None) or {}).values():
        if not isinstance(config, dict):
            continue
        path = config.get("BACKEND")
        if isinstance(path, str) and validation.is_pgqueue_backend(path):
            aliases.add(options_database(config.get("OPTIONS") or {}))
    return aliases


# Tagged "database": it queries, so Django runs it only for `check --database <alias>`
# and for `migrate`. A warning, not an error: `migrate` runs database checks first
# and would refuse, on an error, to create the very tables this looks for.
@checks.register(checks.Tags.database)
def check_migrated(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    messages: list[checks.CheckMessage] = []
    if _in_migrate():
        return messages  # it is applying what the warning would ask for
    for alias in sorted(jobs_databases() & set(databases or ())):
        if alias not in connections.settings:
            continue  # the backend's own check (pgqueue.E002) says so
        try:
            missing = schema.unapplied_migrations(alias)
        except DatabaseError:
            continue  # unreachable: Django's own database checks report that
        if missing:
            messages.append(
                checks.Warning(
                    f"Database {alias!r} lacks {len(missing)} django-pgqueue "
                    f"migration(s): {', '.join(missing)}. enqueue() fails and "
                    "pgqueue_worker and pgqueue_sweep refuse to start until they are "
                    "applied.",
                    hint=f"Run `{schema.migrate_command(alias)}`.",
                    id="pgqueue.W010",
                )
            )
    return messages


def _in_migrate() -> bool:
    """True while ``migrate`` (or a project's subclass of it) runs its own checks:
    Django passes a check no hint of which command asked, so look up the call stack."""
    from django.core.management.commands.migrate import Command as Migrate

    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if isinstance(frame.f_locals.get("self"), Migrate):
            return True
        frame = frame.f_back
    return False


@checks.register("pgqueue")
def check_flow(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """One error per bad ``PGQUEUE_LIMITS`` entry (pgqueue.E063) and per bad
    ``PGQUEUE_FAIR_QUEUES`` name (pgqueue.E064): workers refuse to start until fixed.
    A warning (pgqueue.W063) per key that reads like a queue's budget but is not one."""
    messages: list[checks.CheckMessage] = [
        checks.Error(
            f"PGQUEUE_LIMITS: {problem}.",
            hint='Use {"key": {"concurrency": N, "rate": "R/s"}} with an exact key, a '
            'prefix ending in "*", or "queue:NAME"; N and R positive ints; the rate\'s '
            "period s, m or h.",
            obj="PGQUEUE_LIMITS",
            id="pgqueue.E063",
        )
        for problem in flow.limit_problems(settings.LIMITS)
    ]
    messages += [
        checks.Error(
            f"PGQUEUE_FAIR_QUEUES: {problem}.",
            hint="Use a list of queue names.",
            obj="PGQUEUE_FAIR_QUEUES",
            id="pgqueue.E064",
        )
        for problem in flow.fair_problems(settings.FAIR_QUEUES)
    ]
    messages += [
        checks.Warning(
            f"PGQUEUE_LIMITS: {miss}",
            hint='A queue\'s budget is keyed "queue:NAME", in lower case.',
            obj="PGQUEUE_LIMITS",
            id="pgqueue.W063",
        )
        for miss in flow.limit_near_misses(settings.LIMITS)
    ]
    return messages


#: The level of ``pgqueue.E030``: an error for ``manage.py check``; django-pgqueue's
#: commands lower it to a warning (``PgQueueCommand.check``), as none of them needs the
#: bad entry: the sweeper skips it and ticks the others.
PERIODIC_LEVEL: ContextVar[int] = ContextVar("pgqueue_periodic_level", default=checks.ERROR)


@checks.register("pgqueue")
def check_periodic(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """One error per bad ``PGQUEUE_PERIODIC`` entry, naming it (the sweeper skips it).
    Never raises: a task module that fails at import is reported with its exception."""
    _, errors = entries()
    return [
        checks.CheckMessage(
            PERIODIC_LEVEL.get(),
            f"PGQUEUE_PERIODIC[{name!r}]: {message}" if name else message,
            hint="Fix or remove the entry; see the periodic jobs how-to for its keys. "
            "Until then the sweeper skips it and runs the other entries.",
            obj=f"PGQUEUE_PERIODIC[{name!r}]" if name else "PGQUEUE_PERIODIC",
            id="pgqueue.E030",
        )
        for name, message in errors.items()
    ]
