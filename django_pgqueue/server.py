"""Which PostgreSQL servers django-pgqueue runs on, checked before it changes anything.

The floor is PostgreSQL 14. The statements in ``sql/`` and the migrations need 9.5 at
the least (``FOR UPDATE SKIP LOCKED`` and ``INSERT ... ON CONFLICT`` on a partial unique
index, both 9.5; ``jsonb`` and ``make_interval`` 9.4; ``CREATE INDEX CONCURRENTLY`` in a
migration), so the floor is set by what the supported Django versions accept: 14 for
Django 5.2 and 6.0, 15 for Django 6.1 (Django refuses older servers itself). 14 also
brings what a queue table's churn wants from the server: B-tree deduplication (13) and
bottom-up index deletion (14), which keep the status indexes small while every job's row
is updated several times. CI runs the suite on PostgreSQL 15 and 18.

``manage.py migrate`` (through ``pre_migrate``), ``pgqueue_worker`` and ``pgqueue_sweep``
call :func:`check_server_version` first. It reads the server's version from
``connection.pg_version`` (the server's ``server_version_num``) and nothing else, so a
test can fake an old server by setting that one attribute.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from django.db import connections

from .exceptions import UnsupportedServerError

if TYPE_CHECKING:
    from django.db.backends.postgresql.base import DatabaseWrapper

#: Lowest supported server: its major version, and as ``server_version_num``.
MIN_SERVER_MAJOR = 14
MIN_SERVER_VERSION_NUM = MIN_SERVER_MAJOR * 10000


def version_text(version_num: int) -> str:
    """``server_version_num`` as people write it: 150004 -> "15.4", 90605 -> "9.6.5"."""
    major, rest = divmod(version_num, 10000)
    if major >= 10:
        return f"{major}.{rest}"
    return f"{major}.{rest // 100}.{rest % 100}"


def check_server_version(alias: str) -> None:
    """Raise :class:`~django_pgqueue.exceptions.UnsupportedServerError` if the server of
    database ``alias`` is older than PostgreSQL 14. Other vendors are left to the
    backend's system check (pgqueue.E003)."""
    connection = connections[alias]
    if connection.vendor != "postgresql":
        return
    found = cast("DatabaseWrapper", connection).pg_version
    if found < MIN_SERVER_VERSION_NUM:
        raise UnsupportedServerError(
            f"django-pgqueue needs PostgreSQL {MIN_SERVER_MAJOR} or later; database "
            f"{alias!r} is on PostgreSQL {version_text(found)}. "
            "Upgrade the server (nothing was changed)."
        )
