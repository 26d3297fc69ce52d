"""What every ``manage.py pgqueue_*`` command shares."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from django_pgqueue import __version__
from django_pgqueue.conf import settings
from django_pgqueue.exceptions import NotMigrated, UnsupportedServerError
from django_pgqueue.schema import check_migrated
from django_pgqueue.server import check_server_version


class PgQueueCommand(BaseCommand):
    """Base class of django-pgqueue's commands.

    ``--version`` prints this package's version (``BaseCommand`` prints Django's), and
    :meth:`check_server` stops the command with a clear error on a server older than
    django-pgqueue supports, and :meth:`check_migrated` on a database that lacks its
    migrations, before it touches a job."""

    def get_version(self) -> str:
        return __version__

    def check_server(self, alias: str | None = None) -> None:
        """Raise ``CommandError`` naming the version if the jobs database's server is
        older than PostgreSQL 14."""
        try:
            check_server_version(alias or settings.DATABASE)
        except UnsupportedServerError as exc:
            raise CommandError(str(exc)) from exc

    def check_migrated(self, alias: str | None = None) -> None:
        """Raise ``CommandError`` naming ``migrate`` if the jobs database lacks any of
        django-pgqueue's migrations: a missing table is no fault a retry can cure."""
        try:
            check_migrated(alias or settings.DATABASE)
        except NotMigrated as exc:
            raise CommandError(str(exc)) from exc
