"""Migrations: the claim index is built CONCURRENTLY in a non-atomic migration of its own."""

from __future__ import annotations

import importlib
import threading
import time
from io import StringIO

import pytest
from django.contrib.postgres.operations import AddIndexConcurrently
from django.core.management import call_command
from django.db import NotSupportedError, OperationalError, connection, migrations
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.state import ProjectState

from django_pgqueue.migration_ops import BrieflyLocked
from django_pgqueue.models import Job
from tests.conftest import wait_for

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


# makemigrations checks the migration history of every database the router lets
# django_pgqueue migrate on: the test project's second jobs database too.
@pytest.mark.django_db(databases=["default", "second"])
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


# --- ALTER TABLE pgqueue_job: a short lock_timeout, retried (issue 28 item 15) ----------


def _wrapped_operations(operations, inside=False):
    """(operation, whether it runs inside BrieflyLocked), through the wrappers."""
    for operation in operations:
        if isinstance(operation, BrieflyLocked):
            yield from _wrapped_operations(operation.operations, True)
        elif isinstance(operation, migrations.SeparateDatabaseAndState):
            yield from _wrapped_operations(operation.database_operations, inside)
        else:
            yield operation, inside


def _takes_the_jobs_table(operation) -> bool:
    """An operation that takes ACCESS EXCLUSIVE on pgqueue_job (a column, a constraint
    swap); not the storage parameters' SET nor VALIDATE, whose locks let DML through."""
    if isinstance(operation, migrations.AddField):
        return operation.model_name == "job"
    if isinstance(operation, migrations.RunSQL) and isinstance(operation.sql, str):
        sql = operation.sql
        return (
            sql.startswith("ALTER TABLE pgqueue_job ")
            and "VALIDATE CONSTRAINT" not in sql
            and not sql.startswith("ALTER TABLE pgqueue_job SET (")
        )
    return False


def test_migrations__every_alter_of_the_jobs_table_waits_briefly_for_its_lock():
    """0005, 0006, 0011, 0013, 0016, 0021 and 0022 add columns and swap a constraint on
    the jobs table: each such operation runs in BrieflyLocked, never waiting without a bound."""
    loader = MigrationLoader(None, ignore_no_migrations=True)
    bare, wrapped = [], []
    for (app, name), migration in sorted(loader.disk_migrations.items()):
        if app != APP:
            continue
        for operation, inside in _wrapped_operations(migration.operations):
            if _takes_the_jobs_table(operation):
                (wrapped if inside else bare).append(f"{name}: {operation.describe()}")
    assert bare == []
    assert {entry.split(":")[0][:4] for entry in wrapped} == {
        "0005",
        "0006",
        "0011",
        "0013",
        "0016",
        "0021",
        "0022",
    }


PROBE = migrations.RunSQL(
    "ALTER TABLE pgqueue_job ADD COLUMN pgqueue_probe integer",
    reverse_sql="ALTER TABLE pgqueue_job DROP COLUMN pgqueue_probe",
)


def _probe_columns() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM information_schema.columns "
            "WHERE table_name = 'pgqueue_job' AND column_name = 'pgqueue_probe'"
        )
        return cursor.fetchone()[0]


def _apply(operation: BrieflyLocked, *, backwards: bool = False) -> None:
    state = ProjectState()
    with connection.schema_editor(atomic=False) as editor:
        if backwards:
            operation.database_backwards(APP, editor, state, state)
        else:
            operation.database_forwards(APP, editor, state, state)


@pytest.mark.django_db(transaction=True)
def test_briefly_locked__an_open_reader_stalls_no_claim_and_the_migration_retries(
    other_connection, caplog
):
    """Issue 28 item 15: a transaction that read pgqueue_job and stays open (a view under
    ATOMIC_REQUESTS waiting on an API) holds ACCESS SHARE. An ALTER waiting behind it
    stalled every claim for as long. Under BrieflyLocked each attempt waits at most its
    lock_timeout, so claims go on (none waits much longer); with the reader still open
    after the last attempt, the migration fails naming it, nothing applied; a reader
    that ends meanwhile lets a later attempt through."""
    for n in range(200):
        Job.objects.enqueue("testproject.demo.tasks.add", [n, n])
    reader = other_connection()
    reader.execute("SELECT count(*) FROM pgqueue_job")  # and stays open
    reader_pid = reader.info.backend_pid
    waits: list[float] = []
    stop = threading.Event()

    def claim_all_along() -> None:
        try:
            while not stop.is_set():
                began = time.monotonic()
                Job.objects.claim("w-migrate", limit=1)
                waits.append(time.monotonic() - began)
                time.sleep(0.02)
        finally:
            connection.close()

    claimer = threading.Thread(target=claim_all_along)
    claimer.start()
    try:
        op = BrieflyLocked(PROBE, lock_timeout=0.3, attempts=3, pause=0.2)
        with pytest.raises(OperationalError, match=r"no lock within 0.3s in 3 attempts") as info:
            _apply(op)
        assert f"pid {reader_pid} " in str(info.value)
        assert _probe_columns() == 0
        assert caplog.text.count("lock not granted within 0.3s") == 2
        # Now the reader ends while the migration is retrying: it gets through.
        patient = BrieflyLocked(PROBE, lock_timeout=0.3, attempts=50, pause=0.1)
        applying = threading.Thread(target=lambda: (_apply(patient), connection.close()))
        applying.start()
        wait_for(lambda: caplog.text.count("lock not granted") >= 4)
        reader.rollback()
        applying.join(20)
        assert not applying.is_alive()
        assert _probe_columns() == 1
    finally:
        stop.set()
        claimer.join(20)
        reader.rollback()
        if _probe_columns():
            _apply(BrieflyLocked(PROBE), backwards=True)
    assert _probe_columns() == 0
    assert len(waits) > 20
    assert max(waits) < 1.5, sorted(waits)[-5:]


def test_briefly_locked__deconstructs_for_the_migration_writer():
    """squashmigrations writes an operation through its deconstruct(): BrieflyLocked
    comes back whole from what Django's writer makes of it."""
    from django.db.migrations.writer import OperationWriter

    op = BrieflyLocked(PROBE, lock_timeout=0.5, attempts=4, pause=0.25)
    text, imports = OperationWriter(op, indentation=0).serialize()
    assert "import django_pgqueue.migration_ops" in imports
    namespace: dict = {"migrations": migrations}  # (every migration file imports it)
    source = "\n".join(sorted(imports)) + "\nop = " + text.rstrip().rstrip(",")
    exec(source, namespace)  # noqa: S102
    again = namespace["op"]
    assert (again.lock_timeout, again.attempts, again.pause) == (0.5, 4, 0.25)
    assert [o.sql for o in again.operations] == [PROBE.sql]
