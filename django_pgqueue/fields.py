"""PostgreSQL arrays (of strings, of timestamps) that need no ``django.contrib.postgres``.

``ArrayField`` makes ``django.contrib.postgres`` a required app (system check
postgres.E005), and the quickstart's ``INSTALLED_APPS`` has only ``"django_pgqueue"``.
The workers table needs one list of queue names, written by ``sql.WORKER_REGISTER`` and
read back as a list (psycopg loads arrays itself), and a rate window one list of start
times, written by the flow claim: a field of our own each is enough.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import ValidationError
from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.lookups import Lookup


class CharArrayField(models.Field):
    """``varchar(item_length)[]``: the column ``ArrayField(CharField(max_length=...))``
    makes, so moving to this field changes nothing in the database. ``item_length=None``
    is ``text[]`` (a job's tags: their length is checked on enqueue)."""

    description = "Array of strings"
    empty_strings_allowed = False

    def __init__(self, *args: Any, item_length: int | None, **kwargs: Any) -> None:
        self.item_length = item_length
        super().__init__(*args, **kwargs)

    def deconstruct(self) -> Any:
        name, path, args, kwargs = super().deconstruct()
        kwargs["item_length"] = self.item_length
        return name, path, args, kwargs

    def db_type(self, connection: BaseDatabaseWrapper) -> str:
        if self.item_length is None:
            return "text[]"
        return f"varchar({int(self.item_length)})[]"

    def get_db_prep_value(
        self, value: Any, connection: BaseDatabaseWrapper, prepared: bool = False
    ) -> Any:
        return None if value is None else [str(item) for item in value]

    def to_python(self, value: Any) -> list[str] | None:
        # A string is the serializers' form (value_to_string): a JSON list.
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                raise ValidationError(f"{value!r} is not a JSON list of strings") from None
        if value is None:
            return None
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise ValidationError(f"{value!r} is not a list of strings")
        return list(value)

    def value_to_string(self, obj: models.Model) -> str:
        return json.dumps(self.value_from_object(obj))


@CharArrayField.register_lookup
class ArrayContains(Lookup):
    """``queues__contains=["a"]``: every given item is in the array (``@>``), as with
    ``ArrayField``; the right side is cast to the column's type so the operator applies."""

    lookup_name = "contains"

    def as_sql(self, compiler: Any, connection: BaseDatabaseWrapper) -> Any:
        lhs, lhs_params = self.process_lhs(compiler, connection)
        rhs, rhs_params = self.process_rhs(compiler, connection)
        cast = self.lhs.output_field.db_type(connection)
        return f"{lhs} @> {rhs}::{cast}", (*lhs_params, *rhs_params)


class TimestampArrayField(models.Field):
    """``timestamptz[]``, read back as a list of aware datetimes (psycopg loads arrays
    itself). Written only by the statements of sql/; the admin shows it."""

    description = "Array of timestamps"
    empty_strings_allowed = False

    def db_type(self, connection: BaseDatabaseWrapper) -> str:
        return "timestamptz[]"

    def value_to_string(self, obj: models.Model) -> str:
        value: Any = self.value_from_object(obj)
        return json.dumps(None if value is None else [item.isoformat() for item in value])
