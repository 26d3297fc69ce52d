"""What every ``manage.py pgqueue_*`` command shares."""

from __future__ import annotations

import logging

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from django_pgqueue import __version__
from django_pgqueue.conf import settings
from django_pgqueue.exceptions import UnsupportedServerError
from django_pgqueue.server import check_server_version

logger = logging.getLogger(__name__)


class PgQueueCommand(BaseCommand):
    """Base class of django-pgqueue's commands.

    ``--version`` prints this package's version (``BaseCommand`` prints Django's), and
    :meth:`check_server` stops the command with a clear error on a server older than
    django-pgqueue supports, before it touches a job."""

    def get_version(self) -> str:
        return __version__

    def check_server(self, alias: str | None = None) -> None:
        """Raise ``CommandError`` naming the version if the jobs database's server is
        older than PostgreSQL 14."""
        try:
            check_server_version(alias or settings.DATABASE)
        except UnsupportedServerError as exc:
            raise CommandError(str(exc)) from exc
        except DatabaseError as exc:
            # Down or restarting: not a reason to exit. The command's own loop retries
            # with backoff, and Django checks the version again at its first connection.
            logger.warning(
                "could not read the database server's version (%s); going on, the "
                "connection is retried",
                str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
            )
