"""Whether the jobs database has django-pgqueue's migrations applied.

A new project that forgot ``manage.py migrate`` should hear so in plain words: from
``manage.py check --database <alias>`` (a warning, ``pgqueue.W010``), from
``enqueue()`` (:class:`~django_pgqueue.exceptions.NotMigrated` instead of a raw
``relation "pgqueue_job" does not exist``), and from ``pgqueue_worker`` and
``pgqueue_sweep``, which stop at start-up instead of retrying a fault that no retry
can cure. The migration state is Django's own (``MigrationExecutor``); a missing
table or column in one of our statements is recognised by its SQLSTATE.
"""

from __future__ import annotations

from django.db import DatabaseError, connections

from .exceptions import NotMigrated, first_line

APP_LABEL = "django_pgqueue"

#: SQLSTATEs of a statement that names a table or column the database lacks:
#: undefined_table, undefined_column.
MISSING_SCHEMA_SQLSTATES = frozenset({"42P01", "42703"})


def migrate_command(alias: str) -> str:
    """The command that applies the migrations to database ``alias``."""
    return "python manage.py migrate" + ("" if alias == "default" else f" --database {alias}")


def unapplied_migrations(alias: str) -> list[str]:
    """Names of django-pgqueue's migrations not applied to database ``alias``, in the
    order ``migrate`` would apply them (empty: up to date)."""
    from django.db.migrations.executor import MigrationExecutor  # loads every app's migrations

    executor = MigrationExecutor(connections[alias])
    targets = [key for key in executor.loader.graph.leaf_nodes() if key[0] == APP_LABEL]
    plan = executor.migration_plan(targets)
    return [migration.name for migration, backwards in plan if not backwards]


def check_migrated(alias: str) -> None:
    """Raise :class:`NotMigrated` naming the missing migrations of database ``alias``."""
    missing = unapplied_migrations(alias)
    if missing:
        raise NotMigrated(
            f"database {alias!r} lacks {len(missing)} django-pgqueue migration(s) "
            f"({', '.join(missing)}): run `{migrate_command(alias)}`"
        )


def not_migrated(exc: BaseException, alias: str) -> NotMigrated | None:
    """The :class:`NotMigrated` to raise instead of ``exc`` when ``exc`` says one of our
    statements named a table or column database ``alias`` lacks; else None."""
    if isinstance(exc, NotMigrated):
        return exc
    if not isinstance(exc, DatabaseError):
        return None
    cause = exc.__cause__ or exc
    if getattr(cause, "sqlstate", None) not in MISSING_SCHEMA_SQLSTATES:
        return None
    return NotMigrated(
        f"the django-pgqueue tables are missing from database {alias!r} "
        f"({first_line(cause)}): "
        f"run `{migrate_command(alias)}`"
    )
