from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.core.management.base import CommandError
from django.db.models.signals import pre_migrate

from .exceptions import UnsupportedServerError
from .server import check_server_version


class PgQueueConfig(AppConfig):
    name = "django_pgqueue"
    verbose_name = "Job queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Django's way: the checks read the models, which exist only once apps are ready.
        from . import checks  # noqa: F401 - registers the system checks

        pre_migrate.connect(refuse_unsupported_server, sender=self)


def refuse_unsupported_server(*, using: str, **kwargs: Any) -> None:
    """Stop ``migrate`` before it changes anything on a server older than PostgreSQL 14
    (see ``server.py``)."""
    try:
        check_server_version(using)
    except UnsupportedServerError as exc:
        raise CommandError(str(exc)) from exc
