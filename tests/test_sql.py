"""sql.py: one named, commented constant per query, agreeing with the model and indexes."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from django_pgqueue import sql
from django_pgqueue.models import Job

SQL_SOURCE = Path(sql.__file__).read_text()
CONSTANTS = sorted(name for name in vars(sql) if name.startswith("JOB_"))


def constant_lines() -> dict[str, int]:
    """Line number (1-based) of each top-level ``JOB_*`` assignment in sql.py."""
    tree = ast.parse(SQL_SOURCE)
    return {
        node.targets[0].id: node.lineno
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id.startswith("JOB_")
    }


def test_sql__constants_exist_and_are_alphabetical():
    names = list(constant_lines())
    assert len(names) >= 10
    assert names == sorted(names), "sql.py constants must be in alphabetical order"
    assert set(names) == set(CONSTANTS)


@pytest.mark.parametrize("name", CONSTANTS)
def test_sql__every_constant_has_a_comment_header(name):
    lines = SQL_SOURCE.splitlines()
    index = constant_lines()[name] - 1
    header = []
    for line in reversed(lines[:index]):
        if not line.startswith("#"):
            break
        header.append(line)
    assert header, f"{name} has no comment header"
    # One line on what it does at least; the header is prose, not a stray marker.
    assert sum(len(line) for line in header) > 40, f"{name}'s header is too short: {header}"


@pytest.mark.parametrize("name", CONSTANTS)
def test_sql__only_named_parameters(name):
    text = getattr(sql, name)
    assert isinstance(text, str)
    # Positional %s placeholders and string formatting are banned (STYLE rule 3).
    assert "%" not in re.sub(r"%\(\w+\)s", "", text), f"{name} has a non-named placeholder"
    assert "{" not in text, f"{name} looks like a format string"


@pytest.mark.parametrize("name", CONSTANTS)
def test_sql__table_name_matches_model(name):
    tables = set(
        re.findall(r"\b(?:FROM|UPDATE|INTO|JOIN|COPY)\s+([a-z_][a-z0-9_]*)", getattr(sql, name))
    )
    # CTE names and set-returning functions are not tables; everything else is ours.
    ctes = set(re.findall(r"\b([a-z_]+) AS \(", getattr(sql, name)))
    tables -= ctes | {"unnest", "jsonb_array_elements", "generate_series"}
    if name in ("JOB_NOTIFY", "JOB_NOTIFY_MANY", "JOB_BULK_CLOCK"):
        assert tables == set()
    elif name == "JOB_BULK_IDS":  # the table's id sequence, no table read
        assert tables == set()
        assert f"pg_get_serial_sequence('{Job._meta.db_table}', 'id')" in getattr(sql, name)
    elif name == "JOB_GET_COLUMN_STATS":  # reads the planner's catalogs about our table
        assert tables == {"pg_class", "pg_namespace", "pg_stats"}
        assert f"'{Job._meta.db_table}'::regclass" in getattr(sql, name)
    else:
        assert tables == {Job._meta.db_table}


def test_sql__time_is_pinnable_in_every_time_comparison():
    for name in CONSTANTS:
        text = getattr(sql, name)
        if "clock_timestamp()" in text:
            assert "coalesce(%(now)s::timestamptz, clock_timestamp())" in text, name
        assert "now()" not in text.replace("clock_timestamp()", ""), name


def claim_candidate() -> tuple[str, str]:
    """The WHERE and ORDER BY of JOB_CLAIM's candidate selection, whitespace-folded."""
    match = re.search(
        r"WITH candidate AS \(\s*SELECT id\s+FROM pgqueue_job\s+WHERE (.*?)\s+"
        r"ORDER BY (.*?)\s+LIMIT %\(limit\)s\s+FOR UPDATE SKIP LOCKED\s*\)",
        sql.JOB_CLAIM,
        re.S,
    )
    assert match, "JOB_CLAIM lost its candidate CTE shape"
    where, order = (" ".join(part.split()) for part in match.groups())
    return where, order


def test_sql__claim_order_by_matches_claim_index_columns():
    index = next(i for i in Job._meta.indexes if i.name == "pgqueue_job_claim_idx")
    expected = ", ".join(
        f"{field[1:]} DESC" if field.startswith("-") else field for field in index.fields
    )
    _, order = claim_candidate()
    assert order == expected == "priority DESC, id"


def test_sql__claim_where_matches_claim_index_predicate():
    index = next(i for i in Job._meta.indexes if i.name == "pgqueue_job_claim_idx")
    assert dict(index.condition.children) == {"status": "pending"}
    where, _ = claim_candidate()
    conjuncts = [part.strip() for part in where.split(" AND ", 1)]
    assert conjuncts[0] == "status = 'pending'"
    # The only other filter is the optional queue list, which the index need not cover.
    assert conjuncts[1] == ("(%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))")
    assert "run_at" not in where, "future jobs must be promoted, not filtered in the claim"


@pytest.mark.django_db
def test_sql__claim_index_in_database_matches_claim_statement():
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'pgqueue_job_claim_idx'")
        (indexdef,) = cursor.fetchone()
    assert "ON public.pgqueue_job USING btree (priority DESC, id)" in indexdef
    assert indexdef.endswith("WHERE ((status)::text = 'pending'::text)")


@pytest.mark.django_db
@pytest.mark.parametrize("name", CONSTANTS)
def test_sql__every_statement_is_valid_postgresql(name):
    """PREPARE each statement with its parameters typed as unknown: a typo fails here."""
    text = getattr(sql, name)
    params = sorted(set(re.findall(r"%\((\w+)\)s", text)))
    numbered = text
    for number, param in enumerate(params, start=1):
        numbered = numbered.replace(f"%({param})s", f"${number}")
    with connection.cursor() as cursor:
        if text.lstrip().startswith("COPY"):
            # COPY cannot be prepared: run it with no rows instead.
            with cursor.copy(text):
                pass
            return
        cursor.execute(f"PREPARE pgqueue_check AS {numbered}")
        cursor.execute("DEALLOCATE pgqueue_check")


def claim_plan(queues: list[str] | None) -> str:
    """EXPLAIN of JOB_CLAIM exactly as Django sends it (psycopg binds client-side)."""
    connection.ensure_connection()
    params = {
        "worker_id": "w1",
        "limit": 10,
        "queues": queues,
        "lease_seconds": 60,
        "now": None,
    }
    query = psycopg.ClientCursor(connection.connection).mogrify(sql.JOB_CLAIM, params)
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + query)
        return json.dumps(cursor.fetchone()[0])


@pytest.mark.django_db
@pytest.mark.parametrize("queues", [None, ["default"]], ids=["all_queues", "one_queue"])
def test_sql__claim_plan_uses_the_claim_index(queues):
    with connection.cursor() as cursor:
        # 5,000 claimable rows, 50,000 delayed ones and 20,000 finished ones.
        cursor.execute(
            """
            INSERT INTO pgqueue_job (backend, queue, task, args, kwargs, priority, status,
                                     attempts, max_attempts, run_at, errors, created_at,
                                     finished_at)
            SELECT 'default', 'default', 'testproject.demo.tasks.add', '[]', '{}',
                   mod(g, 201) - 100, s.status, 0, 5,
                   clock_timestamp() + interval '1 day', '[]', clock_timestamp(),
                   CASE WHEN s.status = 'done' THEN clock_timestamp() END
            FROM (VALUES ('pending', 5000), ('scheduled', 50000), ('done', 20000))
                 AS s(status, n),
                 generate_series(1, s.n) AS g
            """
        )
        cursor.execute("ANALYZE pgqueue_job")
    plan = claim_plan(queues)
    assert '"Index Name": "pgqueue_job_claim_idx"' in plan
    assert '"Node Type": "Sort"' not in plan  # the index delivers the ORDER BY
    assert '"Node Type": "Seq Scan"' not in plan
