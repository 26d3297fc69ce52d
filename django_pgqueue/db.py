"""Where the package runs its SQL: the cursor, prepared statements, the row loader,
and the translation of a missing table into ``NotMigrated``.

Every statement of ``sql/`` goes through :func:`rows`, :func:`rowcount` or
:func:`jobs` here; no other module opens a cursor for the queue's own statements.

Django's PostgreSQL backend binds parameters on the client and turns psycopg's
statement preparation off (``prepare_threshold=None``) so that transaction poolers keep
working. The queue's hot statements (one ``enqueue()`` per web request, the worker's
batched completion) go through :func:`cursor` instead: a Django cursor (so
``assertNumQueries``, query logging and ``execute_wrapper`` still see the statement)
over a psycopg cursor that binds on the server and prepares where allowed. Whether
psycopg may prepare is the connection's ``prepare_threshold``:

* given in the database's ``OPTIONS`` (``"prepare_threshold": None`` turns preparation
  off, for PgBouncer in transaction mode before 1.21, for example): respected as is;
* not given, on a database behind a transaction pooler (``databases.is_pooled``):
  nothing is prepared, since an old pooler hands the next transaction to a server
  connection that never saw the statement;
* not given otherwise: these cursors prepare, and only they do (with
  ``server_side_binding`` on, Django's own cursors would too, so then nothing is
  prepared unless ``prepare_threshold`` is given).

Statements run through here must be prepareable: one statement, no client-side
composition, parameters whose types the server can infer.
"""

from __future__ import annotations

import datetime as dt
import json
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from django.db import DatabaseError, connections, models
from django.db.backends.postgresql.psycopg_any import register_tzloader
from django.db.backends.utils import CursorWrapper
from django.db.models import signals
from django.db.models.base import ModelState
from psycopg._queries import PostgresQuery
from psycopg.types.array import ListBinaryDumper

from .databases import is_pooled
from .schema import not_migrated
from .sql import clock as clock_sql

#: What psycopg is given as the threshold when the settings leave it to us: unused
#: by ``prepare=True`` statements, and the number psycopg itself defaults to.
DEFAULT_PREPARE_THRESHOLD = 5


class StatementQuery(PostgresQuery):
    """psycopg's conversion of a statement's ``%(name)s`` placeholders, remembered per
    statement whatever its length. psycopg caches it only for statements of up to 4 KB;
    the flow claims are longer, and parsing one anew costs about as much as running it
    (0.1 to 0.2 ms). The statements of sql/ are a fixed set of ASCII constants, so
    their conversions are few and the same on every connection."""

    _converted: dict[str, tuple[Any, ...]] = {}  # noqa: RUF012 - shared on purpose
    _MAX_STATEMENTS = 256

    def convert(self, query: Any, vars: Any) -> None:  # noqa: A002 - psycopg's name
        cacheable = type(query) is str and type(vars) is dict and query.isascii()
        known = self._converted.get(query) if cacheable else None
        if known is None:
            super().convert(query, vars)
            if cacheable and len(self._converted) < self._MAX_STATEMENTS:
                self._converted[query] = (self.query, self._want_formats, self._order, self._parts)
            return
        self.query, self._want_formats, self._order, self._parts = known
        self.dump(vars)


class PreparingCursor(psycopg.Cursor[Any]):
    """Server-side binding; every ``execute`` is prepared (psycopg prepares only if the
    connection's ``prepare_threshold`` is not None) unless the class says ``PREPARE``
    False (:class:`BindingCursor`). Statements are converted once (StatementQuery)."""

    PREPARE = True
    _query_cls = StatementQuery

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


def cursor(alias: str, *, prepare: bool = True, binary_lists: bool = False) -> CursorWrapper:
    """A Django cursor on ``alias`` that binds on the server, and whose statements are
    prepared where allowed unless ``prepare`` is False. ``binary_lists``: lists are
    sent as binary arrays (see :func:`rows`).

    ``prepare=False`` is for a statement whose best plan depends on its parameters and
    on the data: a generic plan, made once for any parameters, is for the claim a sort
    of the whole backlog. Binding on the server still spares the client-side quoting
    of every parameter."""
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
        if binary_lists:
            made.adapters.register_dumper(list, ListBinaryDumper)
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


def _translated(alias: str, exc: DatabaseError) -> DatabaseError:
    """``NotMigrated`` ("run manage.py migrate") when ``exc`` says a table or column of
    ours is missing on ``alias``; else ``exc`` itself."""
    missing = not_migrated(exc, alias)
    return exc if missing is None else missing


def rows(
    alias: str,
    query: str,
    params: dict[str, Any],
    *,
    prepare: bool = False,
    binary_lists: bool = False,
) -> list[tuple[Any, ...]]:
    """Run one statement on ``alias``; its rows (none if it returns none).

    ``prepare``: through :func:`cursor` (bound on the server, prepared where allowed),
    for the statements run for every job or batch. Otherwise Django's own cursor.
    ``binary_lists`` (with ``prepare``): list parameters go as binary arrays, their
    element types told by the values (the statement casts them): a batch's arrays of
    ids, attempts, timestamps and JSON texts cost a fifth of their text form to send
    (about 4 µs a job of a batched completion, most of it the timestamps)."""
    try:
        if prepare:
            return _hot_rows(alias, query, params, binary_lists)
        with connections[alias].cursor() as cur:
            cur.execute(query, params)
            return cur.fetchall() if cur.description else []
    except DatabaseError as exc:
        error = _translated(alias, exc)
        if error is exc:
            raise
        raise error from exc


_TUPLES_OK = psycopg.pq.ExecStatus.TUPLES_OK


def _hot_rows(
    alias: str, query: str, params: dict[str, Any], binary_lists: bool
) -> list[tuple[Any, ...]]:
    """:func:`rows` with ``prepare``: the statement through a Django cursor (so
    ``execute_wrapper``, ``assertNumQueries`` and query logging see it) over a psycopg
    cursor kept on the connection for these statements (:func:`_kept_cursor`), its rows
    read from the psycopg cursor. An ``enqueue()`` spent a fifth of its client time
    making, closing and describing a cursor: building the column descriptions to learn
    whether there are rows, and wrapping ``fetchall`` in Django's error translation
    (the rows are already on the client; nothing of the database can fail there)."""
    wrapper = connections[alias]
    wrapper.ensure_connection()
    made = _kept_cursor(alias, wrapper, binary_lists)
    wrapper._prepare_cursor(made).execute(query, params)  # type: ignore[attr-defined]
    result = made.pgresult
    if result is None or result.status != _TUPLES_OK:
        return []
    with wrapper.wrap_database_errors:
        return made.fetchall()


def _kept_cursor(alias: str, wrapper: Any, binary_lists: bool) -> PreparingCursor:
    """The psycopg cursor of :func:`_hot_rows` on ``wrapper``'s connection, made by
    :func:`cursor`'s rules the first time (and again when Django's or the session's
    time zone changed, or the cursor was closed), then kept on the psycopg connection
    (one for each ``binary_lists``): a new connection starts without one."""
    raw = wrapper.connection
    kept: dict[Any, PreparingCursor] | None = getattr(raw, "_pgqueue_kept_cursors", None)
    if kept is None:
        kept = raw._pgqueue_kept_cursors = {}
    key = (binary_lists, wrapper.timezone, raw.info.timezone)
    made = kept.get(key)
    if made is None or made.closed:
        if raw.prepare_threshold is None and prepares(alias):
            raw.prepare_threshold = DEFAULT_PREPARE_THRESHOLD
        made = kept[key] = PreparingCursor(raw)
        _timestamp_loader(made, wrapper.timezone)
        if binary_lists:
            made.adapters.register_dumper(list, ListBinaryDumper)
    return made


def rowcount(alias: str, query: str, params: dict[str, Any]) -> int:
    """Run one statement on ``alias``; the number of rows it changed."""
    try:
        with connections[alias].cursor() as cur:
            cur.execute(query, params)
            return int(cur.rowcount)
    except DatabaseError as exc:
        error = _translated(alias, exc)
        if error is exc:
            raise
        raise error from exc


def row(alias: str, query: str, params: dict[str, Any], *, prepare: bool = False) -> Any:
    """The first row of one statement's result, or None."""
    found = rows(alias, query, params, prepare=prepare)
    return found[0] if found else None


def returned(alias: str, query: str, params: dict[str, Any]) -> tuple[tuple[str, ...], list]:
    """Run a statement of whole job rows (a claim); its column names and rows.

    Bound on the server; prepared on a worker's claim connection only, whose session
    settings make the generic plan the ordered index scan (see
    ``worker.connections.configure_claim_session``)."""
    connection = connections[alias]
    try:
        connection.ensure_connection()
        generic = getattr(connection.connection, "_pgqueue_claims_prepared", False)
        with cursor(alias, prepare=generic) as cur:
            cur.execute(query, params)
            return _column_names(cur, connection.connection), cur.fetchall()
    except DatabaseError as exc:
        error = _translated(alias, exc)
        if error is exc:
            raise
        raise error from exc


def _column_names(cur: Any, raw: Any) -> tuple[str, ...]:
    """The names of the columns of ``cur``'s result (on psycopg connection ``raw``), as
    its ``description`` names them, read off the result itself: ``description`` makes a
    ``Column`` for each (its type looked up, its sizes read), a tenth of a claim's
    client time for the 34 columns of a job row."""
    result = cur.pgresult
    if result is None or result.status != _TUPLES_OK:
        return tuple(column.name for column in cur.description)
    encoding = raw.info.encoding
    names = []
    for i in range(result.nfields):
        name = result.fname(i)
        names.append(name.decode(encoding) if name else f"column_{i + 1}")
    return tuple(names)


def jobs[M: models.Model](
    model: type[M], alias: str, query: str, params: dict[str, Any]
) -> list[M]:
    """Run a statement that returns whole rows of ``model``'s table (:func:`returned`);
    the rows as model instances, as ``RawQuerySet`` would give them, at a fraction of
    its cost (a worker runs this for every batch it claims). JSON columns are decoded
    as ``JSONField`` does (by :func:`load_json`); each instance is built as
    ``Model.from_db`` builds it, minus the ``pre_init``/``post_init`` signals unless
    something receives them."""
    columns, found = returned(alias, query, params)
    return load_jobs(model, alias, columns, found, (query, params))


@dataclass(frozen=True, slots=True)
class _RowPlan:
    """How :func:`load_jobs` makes an instance of one statement's rows (see there)."""

    #: Positions of the JSON columns that ``load_json`` decodes.
    json_columns: tuple[int, ...]
    #: (position, the field's converters) of every other column with converters.
    converters: tuple[tuple[int, list[Any]], ...]
    #: (name, position) of the columns that are not the model's.
    extra: tuple[tuple[str, int], ...]
    #: The fields' attnames, in field order.
    names: tuple[str, ...]
    #: Whether the fields are the first columns, in field order (no reordering).
    in_order: bool
    #: The fields' values out of a row, in field order.
    pick: Callable[[Any], Any]
    #: Every field's attname, for a new instance's ``__dict__`` to be copied from:
    #: made at its full size at once, not grown key by key (a fifth of the cost).
    blank: dict[str, None]


#: Plans by (model, alias, columns), kept when no field has a converter beyond the
#: JSON decoding (a converter may be a method of one thread's connection).
_ROW_PLANS: dict[tuple[type[models.Model], str, tuple[str, ...]], _RowPlan] = {}


def _row_plan(model: type[models.Model], alias: str, columns: tuple[str, ...]) -> _RowPlan | None:
    """The plan of ``model``'s rows with ``columns`` on ``alias`` (None: not every
    column of the model is there). Made once per statement: asking every field for
    its converters cost about as much as loading ten rows."""
    key = (model, alias, columns)
    plan = _ROW_PLANS.get(key)
    if plan is not None:
        return plan
    connection = connections[alias]
    position: dict[Any, int] = {name: i for i, name in enumerate(columns)}
    fields = model._meta.concrete_fields
    if any(f.column not in position for f in fields):
        return None
    json_columns = []
    converters = []
    for f in fields:
        if isinstance(f, models.JSONField) and f.decoder is None:
            json_columns.append(position[f.column])
        elif f.get_db_converters(connection):
            converters.append((position[f.column], f.get_db_converters(connection)))
    known = {f.column for f in fields}
    names = tuple(f.attname for f in fields)
    plan = _RowPlan(
        json_columns=tuple(json_columns),
        converters=tuple(converters),
        extra=tuple((name, i) for i, name in enumerate(columns) if name not in known),
        names=names,
        # RETURNING j.* gives the table's columns in the fields' order.
        in_order=all(position[f.column] == i for i, f in enumerate(fields)),
        pick=operator.itemgetter(*(position[f.column] for f in fields)),
        blank=dict.fromkeys(names),
    )
    if not converters:
        _ROW_PLANS[key] = plan
    return plan


def load_jobs[M: models.Model](
    model: type[M],
    alias: str,
    columns: tuple[str, ...],
    found: list[tuple[Any, ...]],
    statement: tuple[str, dict[str, Any]],
) -> list[M]:
    """The rows ``found`` (with ``columns``) of a statement returning whole rows of
    ``model``'s table, as instances (see :func:`jobs`)."""
    if not found:
        return []
    plan = _row_plan(model, alias, columns)
    if plan is None:
        # Not every column (never the case for the statements of sql/).
        return list(model._default_manager.db_manager(alias).raw(*statement))
    connection = connections[alias] if plan.converters else None
    json_columns, converters, extra = plan.json_columns, plan.converters, plan.extra
    names, in_order, pick, blank = plan.names, plan.in_order, plan.pick, plan.blank
    watched = signals.pre_init.has_listeners(model) or signals.post_init.has_listeners(model)
    new = model.__new__
    made = []
    for values_row in found:
        values = list(values_row)
        for i in json_columns:
            text = values[i]
            if text is not None:
                values[i] = load_json(text)
        for i, funcs in converters:
            for func in funcs:
                values[i] = func(values[i], None, connection)
        if not watched:
            instance = new(model)
            attributes = blank.copy()
            # (In order: the fields are the first columns; extra ones come after them.)
            attributes.update(
                zip(names, values, strict=False)
                if in_order
                else zip(names, pick(values), strict=True)
            )
            instance.__dict__ = attributes
            state = instance._state = ModelState()
            state.adding = False
            state.db = alias
        else:
            instance = model.from_db(alias, names, pick(values))
        for name, i in extra:
            setattr(instance, name, values[i])
        made.append(instance)
    return made


def instance[M: models.Model](model: type[M], alias: str, values: dict[str, Any]) -> M:
    """An instance of ``model`` as loaded from ``alias``, from ``values``: every concrete
    field's value by attname, in field order. Made as :func:`load_jobs` makes rows (the
    ``__dict__`` filled, no ``__init__``) unless something receives the model's
    ``pre_init``/``post_init`` signals, then by ``Model.from_db`` (what an ``enqueue()``
    returns: ``from_db`` cost it 8 µs)."""
    if signals.pre_init.has_listeners(model) or signals.post_init.has_listeners(model):
        return model.from_db(alias, tuple(values), tuple(values.values()))
    made = model.__new__(model)
    made.__dict__.update(values)
    state = made._state = ModelState()
    state.adding = False
    state.db = alias
    return made


#: The C scanner of ``json.loads``'s own decoder (not in the stubs).
_SCAN: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def load_json(text: str) -> Any:
    """``json.loads(text)`` for the text PostgreSQL gives a ``jsonb`` value (no space
    around it), at a third of the cost: ``[]`` and ``{}`` made at once, anything else
    read by the C scanner that ``json.loads`` itself uses, and by ``json.loads`` when
    that does not read the text whole."""
    if text == "[]":
        return []
    if text == "{}":
        return {}
    try:
        value, end = _SCAN(text, 0)
    except StopIteration:
        return json.loads(text)  # raises the JSONDecodeError loads would
    return value if end == len(text) else json.loads(text)


def clock(alias: str, now: dt.datetime | None = None) -> dt.datetime:
    """The database's now (``now`` when pinned): the one clock of leases, schedules and
    stamps, read once by a caller that uses it for many rows or ticks."""
    return rows(alias, clock_sql.CLOCK_NOW, {"now": now})[0][0]
