"""fields.py: the workers' array of queue names, read and written through the ORM."""

from __future__ import annotations

import pytest
from django.core import serializers
from django.core.exceptions import ValidationError

from django_pgqueue.fields import CharArrayField
from django_pgqueue.models import WorkerProcess


def make_worker(name: str, queues: list[str] | None) -> WorkerProcess:
    return WorkerProcess.objects.create(
        id=name, hostname="h", pid=1, queues=queues, concurrency=1, lease_seconds=30.0, version="v"
    )


@pytest.mark.django_db
def test_queues__round_trip_and_contains_lookup():
    make_worker("w-ab", ["a", "b"])
    make_worker("w-b", ["b"])
    make_worker("w-all", None)
    assert WorkerProcess.objects.get(id="w-ab").queues == ["a", "b"]
    assert WorkerProcess.objects.get(id="w-all").queues is None
    by = WorkerProcess.objects.order_by("id").values_list
    assert list(by("id").filter(queues__contains=["b"])) == [("w-ab",), ("w-b",)]
    assert list(by("id").filter(queues__contains=["a", "b"])) == [("w-ab",)]
    assert list(by("id").filter(queues__contains=["c"])) == []
    assert list(by("id").filter(queues__isnull=True)) == [("w-all",)]


@pytest.mark.django_db
def test_queues__column_type_is_unchanged():
    """The same varchar(64)[] column ArrayField(CharField(max_length=64)) made."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute"
            " WHERE attrelid = 'pgqueue_worker'::regclass AND attname = 'queues'"
        )
        assert cursor.fetchone() == ("character varying(64)[]",)


@pytest.mark.django_db
def test_queues__serializers_round_trip():
    make_worker("w-s", ["x", 'y"z'])
    text = serializers.serialize("json", WorkerProcess.objects.filter(id="w-s"))
    WorkerProcess.objects.filter(id="w-s").delete()
    for obj in serializers.deserialize("json", text):
        obj.save()
    assert WorkerProcess.objects.get(id="w-s").queues == ["x", 'y"z']


def test_to_python__rejects_what_is_not_a_list_of_strings():
    field = CharArrayField(item_length=64)
    assert field.to_python('["a"]') == ["a"]
    for bad in ("not json", "[1]", '{"a": 1}', 5):
        with pytest.raises(ValidationError):
            field.to_python(bad)
