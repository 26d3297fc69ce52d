"""One time limit for a group of statements, so a probe answers in time.

``pgqueue_status --check`` is what a liveness probe or a monitoring system runs; with
the jobs table locked (``LOCK TABLE``, a long ``ALTER TABLE``) its statements would
wait for the lock for as long as it is held, and the probe would hang instead of
failing. Inside :func:`within`, each statement is bound (``SET LOCAL
statement_timeout``, which counts lock waits too) to what is left of the limit, so
the whole group ends within it however many statements it runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.db import DatabaseError, connections, transaction

from . import db
from .exceptions import DeadlineExceeded
from .sql import deadline as sql

#: SQLSTATE query_canceled: what a statement that ran into statement_timeout raises.
QUERY_CANCELED = "57014"


@contextmanager
def within(using: str, seconds: float) -> Iterator[None]:
    """Run the block's statements on database ``using`` in one transaction, each
    bound to what is left of ``seconds``; raise :class:`DeadlineExceeded` when one
    runs out of it. ``SET LOCAL`` leaves nothing on the connection (nor on a pooled
    one) after the transaction, so the block is meant as a command's outermost one."""
    end = time.monotonic() + seconds

    def message() -> str:
        return f"database {using!r} did not answer within {seconds:g} s"

    def bound(
        execute: Callable[..., Any], query: str, params: Any, many: bool, context: Any
    ) -> Any:
        left_ms = int((end - time.monotonic()) * 1000)
        if left_ms <= 0:
            raise DeadlineExceeded(message())
        # The driver's own cursor: Django's would run this wrapper again.
        context["cursor"].cursor.execute(
            sql.SESSION_BOUND_TRANSACTION, {"statement_timeout": f"{left_ms}ms"}
        )
        return execute(query, params, many, context)

    connection = connections[using]
    try:
        with transaction.atomic(using=using), connection.execute_wrapper(bound):
            yield
    except DatabaseError as exc:
        if getattr(exc.__cause__, "sqlstate", None) == QUERY_CANCELED:
            raise DeadlineExceeded(
                f"{message()} (statement timeout: a lock on a table it reads, or an "
                "overloaded server)"
            ) from exc
        raise


def bind_transaction(alias: str, seconds: float) -> None:
    """Bound every statement of the current transaction on ``alias`` to ``seconds``
    (``SET LOCAL statement_timeout``: behind a transaction pooler a session setting
    would outlive the transaction on a server connection another client gets next)."""
    db.rows(
        alias, sql.SESSION_BOUND_TRANSACTION, {"statement_timeout": f"{int(seconds * 1000)}ms"}
    )
