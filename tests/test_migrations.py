"""Migrations: the claim index is built CONCURRENTLY in a non-atomic migration of its own."""

from __future__ import annotations

import importlib
from io import StringIO

import pytest
from django.contrib.postgres.operations import AddIndexConcurrently
from django.core.management import call_command
from django.db import NotSupportedError, connection
from django.db.migrations.executor import MigrationExecutor

APP = "django_pgqueue"
INDEX_MIGRATION = importlib.import_module("django_pgqueue.migrations.0002_job_claim_idx")


def index_state(name: str = "pgqueue_job_claim_idx") -> tuple[bool, bool] | None:
    """(valid, ready) of an index in the database, or None if it does not exist."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT i.indisvalid, i.indisready FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = %s",
            [name],
        )
        row = cursor.fetchone()
    return None if row is None else tuple(row)


def test_migration_0002__is_not_atomic():
    assert INDEX_MIGRATION.Migration.atomic is False


def test_migration_0002__holds_only_add_index_concurrently():
    operations = INDEX_MIGRATION.Migration.operations
    assert len(operations) == 1
    assert type(operations[0]) is AddIndexConcurrently
    assert operations[0].index.name == "pgqueue_job_claim_idx"


def test_migration_0001__does_not_create_the_claim_index():
    initial = importlib.import_module("django_pgqueue.migrations.0001_initial")
    text = repr(initial.Migration.operations)
    assert "pgqueue_job_claim_idx" not in text
    assert initial.Migration.atomic is True


@pytest.mark.django_db(transaction=True)  # sqlmigrate, like migrate, runs it outside one
def test_migration_0002__sqlmigrate_emits_create_index_concurrently():
    out = StringIO()
    call_command("sqlmigrate", APP, "0002", stdout=out)
    text = out.getvalue()
    assert 'CREATE INDEX CONCURRENTLY "pgqueue_job_claim_idx" ON "pgqueue_job"' in text
    assert '("priority" DESC, "id") WHERE "status" = \'pending\'' in text
    # A non-atomic migration is not wrapped in a transaction.
    assert "BEGIN;" not in text


@pytest.mark.django_db
def test_migration_0002__refuses_to_run_atomically():
    """Mirrors Django's own test_requires_atomic_false: inside a transaction the
    operation raises instead of building the index with a table-locking CREATE INDEX."""
    executor = MigrationExecutor(connection)
    before = executor.loader.project_state((APP, "0001_initial"))
    after = executor.loader.project_state((APP, "0002_job_claim_idx"))
    operation = INDEX_MIGRATION.Migration.operations[0]
    with (
        pytest.raises(NotSupportedError, match="cannot be executed inside a transaction"),
        connection.schema_editor(atomic=True) as editor,
    ):
        operation.database_forwards(APP, editor, before, after)


@pytest.mark.django_db(transaction=True)
def test_migration_0002__unapply_and_apply_rebuilds_a_valid_index():
    """The real executor runs 0002 outside a transaction, both ways."""
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes(APP)  # later migrations come back too
    assert index_state() == (True, True)
    try:
        executor.migrate([(APP, "0001_initial")])
        assert index_state() is None
        executor = MigrationExecutor(connection)
        executor.migrate([(APP, "0002_job_claim_idx")])
        assert index_state() == (True, True)
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(latest)
    assert MigrationExecutor(connection).migration_plan(latest) == []  # all applied again


@pytest.mark.django_db
def test_makemigrations__check_is_clean():
    out = StringIO()
    # Exits non-zero (SystemExit) if the models have changes without a migration.
    call_command("makemigrations", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()


def test_migration_0005__widens_the_status_check_without_a_locked_scan(db):
    """The new CHECK is added NOT VALID and validated afterwards, in its own transaction
    (a non-atomic migration), and ends up validated, rejecting unknown statuses."""
    migration = importlib.import_module("django_pgqueue.migrations.0005_job_cancel")
    assert migration.Migration.atomic is False
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT convalidated, pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conname = 'pgqueue_job_status_valid'"
        )
        validated, definition = cursor.fetchone()
    assert validated is True
    assert "'cancelled'" in definition


@pytest.mark.django_db
def test_migration_0008__sets_the_tables_autovacuum_settings():
    autovacuum = importlib.import_module("django_pgqueue.migrations.0008_job_autovacuum")
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE oid = 'pgqueue_job'::regclass")
        (options,) = cursor.fetchone()
    assert dict(option.split("=", 1) for option in options) == autovacuum.SETTINGS
