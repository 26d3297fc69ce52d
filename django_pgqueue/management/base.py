"""What every ``manage.py pgqueue_*`` command shares."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from typing import Any

from django.core import checks
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from django_pgqueue import __version__
from django_pgqueue.checks import PERIODIC_LEVEL
from django_pgqueue.databases import backend_database, default_database
from django_pgqueue.exceptions import NotMigrated, UnsupportedServerError, first_line
from django_pgqueue.schema import check_migrated
from django_pgqueue.server import check_server_version
from django_pgqueue.taskapi import FRAMEWORK

logger = logging.getLogger(__name__)


def backend_alias(value: str) -> str:
    """A ``TASKS`` alias served by ``PgQueueBackend``: its jobs database is worked."""
    try:
        backend_database(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def add_backend_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backend",
        type=backend_alias,
        default=None,
        help="TASKS alias whose jobs database to work (default: the default alias)",
    )


def configure_logging(verbosity: int) -> None:
    """Set django-pgqueue's loggers from ``--verbosity``: 0 warnings only, 1 (the
    default) info, 2 and 3 debug; with no handler on them or on the root logger, add
    one that writes to stderr. At 0, the framework's logger (``django.tasks``) is set
    to warnings too: a worker's per-job lines then include none of Django's either,
    whatever the project's logging would print."""
    level = {0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG)
    logger = logging.getLogger("django_pgqueue")
    logger.setLevel(level)
    if verbosity == 0:
        framework = logging.getLogger(FRAMEWORK)
        framework.setLevel(max(framework.getEffectiveLevel(), logging.WARNING))
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logger.addHandler(handler)


class PgQueueCommand(BaseCommand):
    """What django-pgqueue's commands share: the base class, ``--backend``, logging.

    ``--version`` prints this package's version (``BaseCommand`` prints Django's), and
    :meth:`check_server` stops the command with a clear error on a server older than
    django-pgqueue supports, and :meth:`check_migrated` on a database that lacks its
    migrations, before it touches a job."""

    def get_version(self) -> str:
        return __version__

    def check(self, *args: Any, **kwargs: Any) -> None:
        """Django's start-up checks, with a bad ``PGQUEUE_PERIODIC`` entry
        (``pgqueue.E030``) shown as a warning: no command here needs that entry (the
        sweeper skips it), so one stale schedule does not stop workers and sweepers."""
        token = PERIODIC_LEVEL.set(checks.WARNING)
        try:
            super().check(*args, **kwargs)
        finally:
            PERIODIC_LEVEL.reset(token)

    def check_server(self, alias: str | None = None) -> None:
        """Raise ``CommandError`` naming the version if the jobs database's server is
        older than PostgreSQL 14. A server that cannot be reached is not an error here
        (the commands wait for it)."""
        self._check_at_start(check_server_version, alias, "server version")

    def check_migrated(self, alias: str | None = None) -> None:
        """Raise ``CommandError`` naming ``migrate`` if the jobs database lacks any of
        django-pgqueue's migrations: a missing table is no fault a retry can cure. A
        server that cannot be reached is left to the commands' retries (they stop, in
        the same words, if they then find the tables missing)."""
        self._check_at_start(check_migrated, alias, "migrations")

    def _check_at_start(
        self, check: Callable[[str], object], alias: str | None, what: str
    ) -> None:
        """Run one start-up ``check`` of the jobs database: its refusal (an unsupported
        server, missing migrations) stops the command; an unreachable server is only
        logged, since the worker and the sweeper wait for it, retrying with backoff."""
        alias = alias or default_database()
        try:
            check(alias)
        except (UnsupportedServerError, NotMigrated) as exc:
            raise CommandError(str(exc)) from exc
        except DatabaseError as exc:
            logger.warning(
                "database %r unreachable at start, %s not checked: %s",
                alias,
                what,
                first_line(exc),
            )
