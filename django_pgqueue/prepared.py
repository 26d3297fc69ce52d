"""Prepared statements for the queue's hot statements, decided in one place.

Django's PostgreSQL backend binds parameters on the client (``ClientCursor``) and turns
psycopg's statement preparation off (``prepare_threshold=None``) so that transaction
poolers keep working. For a statement run thousands of times a second (one
``enqueue()`` per web request, say) parsing and planning it each time costs as much
as the Python around it: measured with ``python -m bench.enqueue --methods loop``,
preparing ``JOB_ENQUEUE`` is most of what takes the loop from about 1,900 to about
3,000 jobs/s.

:func:`cursor` gives a Django cursor (so ``assertNumQueries``, query logging and
``execute_wrapper`` instrumentation still see the statement) over a psycopg cursor
that binds on the server and asks psycopg to prepare every statement it runs. Whether
psycopg may prepare is the connection's ``prepare_threshold``:

* given in the database's ``OPTIONS`` (``"prepare_threshold": None`` turns preparation
  off, for PgBouncer in transaction mode before 1.21, for example): respected as is;
* not given, on a database behind a transaction pooler (``DISABLE_SERVER_SIDE_CURSORS``,
  see ``databases.is_pooled``): nothing is prepared, since PgBouncer before 1.21 hands
  the next transaction to a server connection that never saw the statement (give
  ``prepare_threshold`` to prepare through a pooler that supports it);
* not given otherwise (Django's default): these cursors prepare. Only they do: Django's own
  client-binding cursors never prepare, whatever the threshold (with
  ``server_side_binding`` on, they would, so then nothing is prepared unless
  ``prepare_threshold`` is given).

Statements run through here must be prepareable: one statement, no client-side
composition, parameters whose types the server can infer.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg
from django.db import connections
from django.db.backends.postgresql.psycopg_any import register_tzloader
from django.db.backends.utils import CursorWrapper

from .databases import is_pooled

#: What psycopg is given as the threshold when the settings leave it to us: unused
#: by ``prepare=True`` statements, and the number psycopg itself defaults to.
DEFAULT_PREPARE_THRESHOLD = 5


class PreparingCursor(psycopg.Cursor[Any]):
    """Server-side binding; every ``execute`` is prepared (psycopg prepares only if the
    connection's ``prepare_threshold`` is not None) unless the class says ``PREPARE``
    False (:class:`BindingCursor`)."""

    PREPARE = True

    def execute(
        self,
        query: Any,
        params: Any = None,
        *,
        prepare: bool | None = None,
        binary: bool | None = None,
    ) -> PreparingCursor:
        super().execute(query, params, prepare=self.PREPARE, binary=binary)
        return self


class BindingCursor(PreparingCursor):
    """Server-side binding; never prepared, whatever the connection's threshold."""

    PREPARE = False


def prepares(alias: str) -> bool:
    """True if statements run through :func:`cursor` on ``alias`` are prepared."""
    options = connections[alias].settings_dict.get("OPTIONS") or {}
    if "prepare_threshold" in options:
        return options["prepare_threshold"] is not None
    if is_pooled(alias):
        return False
    # With server_side_binding, Django's own cursors would prepare too once the
    # connection has a threshold: leave such a connection as configured.
    return options.get("server_side_binding") is not True


def cursor(alias: str, *, prepare: bool = True) -> CursorWrapper:
    """A Django cursor on ``alias`` that binds on the server, and whose statements are
    prepared where allowed unless ``prepare`` is False.

    ``prepare=False`` is for a statement whose best plan depends on its parameters and
    on the data: a prepared statement may switch to a generic plan, planned once for
    any parameters, and for the claim that plan is a sort of the whole backlog
    (measured: 42 ms a claim at 200,000 pending against 0.34 ms planned each time).
    Binding on the server still spares the client-side quoting of every parameter."""
    wrapper = connections[alias]
    wrapper.ensure_connection()
    raw = wrapper.connection
    if prepare and raw.prepare_threshold is None and prepares(alias):
        raw.prepare_threshold = DEFAULT_PREPARE_THRESHOLD
    # Django's own cursor() does the same: ensure_connection, create_cursor (which
    # gives the cursor the time zone's loader when the connection's time zone changed
    # since it connected, as override_settings(USE_TZ=...) does), then _prepare_cursor
    # (debug wrapper when queries are logged, thread-sharing check).
    with wrapper.wrap_database_errors:
        made = PreparingCursor(raw) if prepare else BindingCursor(raw)
        _timestamp_loader(made, wrapper.timezone)
        return wrapper._prepare_cursor(made)  # type: ignore[attr-defined]


_TIMESTAMPTZ_OID = psycopg.adapters.types["timestamptz"].oid
#: psycopg's default (C, when psycopg-binary or psycopg-c is installed) text loader.
_NATIVE_TIMESTAMPTZ = psycopg.adapters.get_loader(_TIMESTAMPTZ_OID, psycopg.pq.Format.TEXT)


def _timestamp_loader(made: psycopg.Cursor[Any], timezone: Any) -> None:
    """Give ``made`` the ``timestamptz`` loader that returns Django's values.

    Django's loader wraps psycopg's, then replaces each value's tzinfo with the
    connection's time zone: a Python call per value. In a UTC session with Django's
    time zone UTC (``USE_TZ``, no database ``TIME_ZONE``), psycopg's own loader already
    gives that very value, so the cursor uses it (the claim reads seven timestamps a
    row). Otherwise, when the connection's time zone changed since it connected,
    Django's loader for the new one, as Django's ``create_cursor`` does. Registered on
    this cursor only, never on the connection Django's own queries use."""
    raw = made.connection
    if _NATIVE_TIMESTAMPTZ is not None and timezone is dt.UTC and raw.info.timezone is dt.UTC:
        made.adapters.register_loader(_TIMESTAMPTZ_OID, _NATIVE_TIMESTAMPTZ)
        return
    loader = raw.adapters.get_loader(_TIMESTAMPTZ_OID, psycopg.pq.Format.TEXT)
    if timezone != getattr(loader, "timezone", timezone):
        register_tzloader(timezone, made)
