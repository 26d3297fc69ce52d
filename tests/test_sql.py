"""The statements of django_pgqueue/sql/: named, commented constants, one module per
family, each run by its one module, agreeing with the models and the indexes."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from django_pgqueue import sql
from django_pgqueue.flow import QUEUE_HEAD
from django_pgqueue.models import Job, JobDependency, JobKey, JobStep, RateWindow
from django_pgqueue.sql.common import FENCE, LEASE
from tests.conftest import connect_test_db

SQL_DIR = Path(sql.__file__).parent
#: Every module of the package's SQL, by file name, as its source text.
SOURCES = {path.name: path.read_text() for path in sorted(SQL_DIR.glob("*.py"))}
STATEMENTS = sql.statements()
ALL = sorted(STATEMENTS)
CONSTANTS = sorted(name for name in STATEMENTS if name.startswith("JOB_"))


def constant_lines(source: str) -> list[str]:
    """The top-level constants a family module assigns, in their order."""
    return [
        node.targets[0].id
        for node in ast.parse(source).body
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
    ]


def test_sql__every_family_is_a_module_and_every_module_a_family_or_fragments():
    families = {f"{name}.py" for name in sql.RUNNERS}
    fragments = {f"{name}.py" for name in sql.FRAGMENTS}
    assert set(SOURCES) == families | fragments | {"__init__.py"}
    assert len(STATEMENTS) >= 80


@pytest.mark.parametrize("family", sorted(sql.RUNNERS))
def test_sql__each_familys_statements_come_after_its_fragments_in_alphabetical_order(family):
    names = [n for n in constant_lines(SOURCES[f"{family}.py"]) if n in STATEMENTS]
    assert names, f"{family} has no statement"
    assert names == sorted(names), f"sql/{family}.py: statements out of alphabetical order"
    order = constant_lines(SOURCES[f"{family}.py"])
    last_fragment = max((i for i, n in enumerate(order) if n not in STATEMENTS), default=-1)
    assert last_fragment < order.index(names[0]), f"sql/{family}.py: a fragment after a statement"


def test_sql__fragment_modules_hold_no_statement():
    for name in sql.FRAGMENTS:
        module = sql.family(name)
        held = [
            n for n, v in vars(module).items() if isinstance(v, str) and sql.NAME_LINE.match(v)
        ]
        assert held == [], f"sql/{name}.py holds statements {held}"


@pytest.mark.parametrize("name", ALL)
def test_sql__every_statement_has_its_header_inside_it(name):
    """``-- name: NAME``, then at most three lines on why, then ``moves:`` lines; ASCII
    and free of ``%`` and braces, which psycopg and psycopg.sql would read as theirs."""
    text = STATEMENTS[name][1]
    match = sql.NAME_LINE.match(text)
    assert match and match["name"] == name, f"{name} does not start with its name line"
    lines = sql.header(text)
    why = [line for line in lines[1:] if not line.startswith("moves:")]
    moves = [line for line in lines[1:] if line.startswith("moves:")]
    assert 1 <= len(why) <= 3, f"{name}: {len(why)} lines of why (1 to 3)"
    assert sum(len(line) for line in why) > 40, f"{name}'s header is too short: {why}"
    assert lines[1:] == why + moves, f"{name}: moves: lines come last"
    for line in moves:
        assert sql.MOVES_LINE.match(f"-- {line}"), f"{name}: unreadable {line!r}"
    head = "\n".join(lines)
    assert head.isascii() and not re.search(r"[%{}]", head), name
    assert text.isascii(), f"{name} holds a non-ASCII character"


@pytest.mark.parametrize("name", ALL)
def test_sql__only_named_parameters(name):
    text = STATEMENTS[name][1]
    # Only psycopg named parameters: no positional %s placeholders, no string formatting
    # (SESSION_LISTEN alone is a psycopg.sql template: LISTEN takes an identifier).
    assert "%" not in re.sub(r"%\(\w+\)s", "", text), f"{name} has a non-named placeholder"
    braces = re.findall(r"[{}]", text.replace("'{}'", ""))
    assert braces == ([] if name != "SESSION_LISTEN" else ["{", "}"]), name


def test_sql__the_rendered_statements_file_is_fresh():
    """``rendered.sql`` (``make sql``) holds every statement whole, as it runs: a change to
    a shared fragment shows in review in every statement it lands in."""
    rendered = (SQL_DIR / "rendered.sql").read_text()
    assert rendered == sql.render(), "django_pgqueue/sql/rendered.sql is stale: run make sql"
    for name, (_family, text) in STATEMENTS.items():
        assert text.strip("\n") in rendered, name


@pytest.mark.parametrize("name", CONSTANTS)
def test_sql__table_name_matches_model(name):
    text = re.sub(r"--[^\n]*", "", getattr(sql, name))  # the SQL, not its header
    tables = set(re.findall(r"\b(?:FROM|UPDATE|INTO|JOIN|COPY)\s+([a-z_][a-z0-9_]*)", text))
    # CTE names and set-returning functions are not tables; everything else is ours.
    ctes = set(
        re.findall(r"\b([a-z_0-9]+)(?:\([a-z_, ]*\))? AS (?:MATERIALIZED )?\(", getattr(sql, name))
    )
    tables -= ctes | {"unnest", "jsonb_array_elements", "generate_series"}
    tables -= {"jsonb_to_recordset", "jsonb_each_text", "pgqueue_flow_usage"}
    if name in ("JOB_NOTIFY", "JOB_NOTIFY_CANCEL", "JOB_NOTIFY_MANY"):
        assert tables == set()
    elif name == "JOB_BULK_IDS":  # the table's id sequence, no table read
        assert tables == set()
        assert f"pg_get_serial_sequence('{Job._meta.db_table}', 'id')" in getattr(sql, name)
    elif name == "MIGRATION_LOCK_TIMEOUT":  # a setting, no table
        assert tables == set()
    elif name == "MIGRATION_LOCK_HOLDERS":  # who holds our table, from the catalogs
        assert tables == {"pg_locks", "pg_stat_activity"}
        assert f"'{Job._meta.db_table}'::regclass" in getattr(sql, name)
    elif name == "JOB_GET_COMMON_TAGS":  # the planner's common tags, or the tags themselves
        assert tables == {"pg_stats", Job._meta.db_table}
    elif name == "JOB_GET_COLUMN_STATS":  # reads the planner's catalogs about our table
        assert tables == {"pg_class", "pg_namespace", "pg_stats"}
        assert f"'{Job._meta.db_table}'::regclass" in getattr(sql, name)
    elif name in ("JOB_DELETE_EXPIRED_KEYS", "JOB_ENQUEUE_DEBOUNCED", "JOB_ENQUEUE_UNIQUE"):
        # The keys that outlive their jobs (enqueue.py), and the jobs they name.
        assert tables == {Job._meta.db_table, JobKey._meta.db_table}
    elif name.startswith(("JOB_CLAIM_FLOW", "JOB_CLAIM_LIMITED")):
        # Flow claims read (the limited ones write) the rate windows of limited budgets
        # (their reads after the budgets' locks go through pgqueue_flow_usage).
        assert tables == {Job._meta.db_table, RateWindow._meta.db_table}
    elif name == "JOB_GET_RUNNING":  # with each running job's durable steps
        assert tables == {Job._meta.db_table, JobStep._meta.db_table}
    elif name == "JOB_BULK_COPY_EDGES":  # a workflow's edges (workflows.py)
        assert tables == {JobDependency._meta.db_table}
    elif name in WORKFLOW_STATEMENTS:
        # Every statement that ends a job resolves its edges (sql.resolve.RESOLVE).
        assert tables == {Job._meta.db_table, JobDependency._meta.db_table}
    else:
        assert tables == {Job._meta.db_table}


#: The statements that read or write the workflows' edges as well as the jobs.
WORKFLOW_STATEMENTS = {
    "JOB_CANCEL",
    "JOB_COMPLETE",
    "JOB_COMPLETE_MANY",
    "JOB_COMPLETE_MANY_RELEASING",
    "JOB_COMPLETE_RELEASING",
    "JOB_DELETE_DEAD",
    "JOB_DELETE_FINISHED_LOCKED",
    "JOB_DELETE_FINISHED",
    "JOB_ENQUEUE_DEPENDANT",
    "JOB_ENQUEUE_WORKFLOW",
    "JOB_FAIL",
    "JOB_GET_PARENTS",
    "JOB_LOCK_FINISHED_BEFORE",
    "JOB_RELEASE",
    "JOB_RESCUE_EXPIRED",
    "JOB_RESOLVE_LATE",
    "JOB_RESOLVE_MISSED",
    "JOB_RESOLVE_PARENTS",
    "JOB_RESOLVE_STRANDED",
    "JOB_RESTORE_DEPENDANTS",
    "JOB_SNOOZE",
}


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
    # Exactly the predicate: a queue filter takes JOB_CLAIM_QUEUES and its own index.
    assert where == "status = 'pending'"
    for name in ("JOB_CLAIM", "JOB_CLAIM_AFTER", "JOB_CLAIM_QUEUES"):
        assert "run_at" not in getattr(sql, name), "future jobs are promoted, not filtered"


def test_sql__resumed_and_per_queue_claims_match_their_indexes():
    folded = {
        n: " ".join(getattr(sql, n).split()) for n in ("JOB_CLAIM_AFTER", "JOB_CLAIM_QUEUES")
    }
    # Every branch of the resumed claim is a range of the claim index, in its order.
    for bound in ("priority > %(after_priority)s", "priority < %(after_priority)s"):
        assert (
            f"WHERE status = 'pending' AND {bound} ORDER BY priority DESC, id"
            in (folded["JOB_CLAIM_AFTER"])
        )
    assert (
        "WHERE status = 'pending' AND priority = %(after_priority)s AND id > %(after_id)s "
        "ORDER BY priority DESC, id" in folded["JOB_CLAIM_AFTER"]
    )
    index = next(i for i in Job._meta.indexes if i.name == "pgqueue_job_queue_claim_idx")
    assert (index.fields, dict(index.condition.children)) == (
        ["queue", "-priority", "id"],
        {"status": "pending"},
    )
    assert (
        "WHERE status = 'pending' AND queue = q.name ORDER BY priority DESC, id"
        in folded["JOB_CLAIM_QUEUES"]
    )


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
        if re.sub(r"--[^\n]*", "", text).lstrip().startswith("COPY"):
            # COPY cannot be prepared: run it with no rows instead.
            with cursor.copy(text):
                pass
            return
        cursor.execute(f"PREPARE pgqueue_check AS {numbered}")
        cursor.execute("DEALLOCATE pgqueue_check")


def claim_plan(name: str, analyze: bool = False, **params: object) -> str:
    """EXPLAIN of a claim statement exactly as Django sends it (client-side binding),
    inside a transaction rolled back (ANALYZE runs it)."""
    connection.ensure_connection()
    params = {"worker_id": "w1", "limit": 10, "lease_seconds": 60, "now": None, **params}
    query = psycopg.ClientCursor(connection.connection).mogrify(getattr(sql, name), params)
    options = "ANALYZE, FORMAT JSON" if analyze else "FORMAT JSON"
    with connection.cursor() as cursor:
        cursor.execute("SAVEPOINT plan")
        cursor.execute(f"EXPLAIN ({options}) " + query)
        plan = json.dumps(cursor.fetchone()[0])
        cursor.execute("ROLLBACK TO SAVEPOINT plan")
    return plan


def insert_jobs(cursor: object, status: str, count: int, queue: str = "default") -> None:
    cursor.execute(  # type: ignore[attr-defined]
        """
        INSERT INTO pgqueue_job (backend, queue, task, args, kwargs, priority, status,
                                 attempts, max_attempts, run_at, errors, created_at,
                                 finished_at)
        SELECT 'default', %(queue)s, 'testproject.demo.tasks.add', '[]', '{}',
               mod(g, 201) - 100, %(status)s, 0, 5,
               clock_timestamp() + interval '1 day', '[]', clock_timestamp(),
               CASE WHEN %(status)s = 'done' THEN clock_timestamp() END
        FROM generate_series(1, %(count)s) AS g
        """,
        {"queue": queue, "status": status, "count": count},
    )


def index_scans(plan: str) -> list[dict[str, object]]:
    """Every index scan node of a JSON plan, with its rows removed by filter."""
    found: list[dict[str, object]] = []

    def walk(node: dict[str, object]) -> None:
        if "Index Name" in node:
            found.append(node)
        for child in node.get("Plans", []):  # type: ignore[attr-defined]
            walk(child)

    for entry in json.loads(plan):
        walk(entry["Plan"])
    return found


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("name", "params", "index"),
    [
        ("JOB_CLAIM", {}, "pgqueue_job_claim_idx"),
        ("JOB_CLAIM_AFTER", {"after_priority": 0, "after_id": 100}, "pgqueue_job_claim_idx"),
        ("JOB_CLAIM_QUEUES", {"queues": ["default"]}, "pgqueue_job_queue_claim_idx"),
        (
            "JOB_CLAIM_QUEUES_AFTER",
            {"queues": ["default"], "after_priorities": [0], "after_ids": [100]},
            "pgqueue_job_queue_claim_idx",
        ),
    ],
    ids=["all_queues", "resumed", "one_queue", "one_queue_resumed"],
)
def test_sql__claim_plan_uses_the_claim_index(name, params, index):
    with connection.cursor() as cursor:
        # 5,000 claimable rows, 50,000 delayed ones and 20,000 finished ones.
        insert_jobs(cursor, "pending", 5000)
        insert_jobs(cursor, "scheduled", 50000)
        insert_jobs(cursor, "done", 20000)
        cursor.execute("ANALYZE pgqueue_job")
    plan = claim_plan(name, **params)
    assert f'"Index Name": "{index}"' in plan
    assert '"Node Type": "Sort"' not in plan or name.startswith("JOB_CLAIM_QUEUES")
    assert '"Node Type": "Seq Scan"' not in plan


@pytest.mark.django_db
def test_sql__small_queue_claim_does_not_scan_past_a_huge_queue():
    with connection.cursor() as cursor:
        insert_jobs(cursor, "pending", 50000, queue="huge")
        insert_jobs(cursor, "pending", 10, queue="small")
        cursor.execute("ANALYZE pgqueue_job")
    plan = claim_plan("JOB_CLAIM_QUEUES", analyze=True, queues=["small"], limit=50)
    scans = index_scans(plan)
    assert [s["Index Name"] for s in scans] == ["pgqueue_job_queue_claim_idx", "pgqueue_job_pkey"]
    # It read the small queue's 10 entries and nothing of the huge queue's.
    assert scans[0]["Actual Rows"] == 10
    assert scans[0].get("Rows Removed by Filter", 0) == 0


@pytest.mark.django_db
def test_sql__resumed_claim_does_not_walk_the_jobs_before_it():
    with connection.cursor() as cursor:
        insert_jobs(cursor, "pending", 20000)
        cursor.execute("UPDATE pgqueue_job SET priority = 0")
        cursor.execute("SELECT max(id) - 10 FROM pgqueue_job")
        (after,) = cursor.fetchone()
        cursor.execute("ANALYZE pgqueue_job")
    plan = claim_plan("JOB_CLAIM_AFTER", analyze=True, after_priority=0, after_id=after, limit=50)
    # The candidate branches (not the final lookup by id) read only the 10 jobs after
    # the position and filtered out nothing: none of the 19,990 before it.
    branches = [s for s in index_scans(plan) if "= ANY" not in str(s["Index Cond"])]
    assert len(branches) == 3, branches  # above, level, below
    assert sum(int(s["Actual Rows"]) for s in branches) == 10  # type: ignore[call-overload]
    assert all(s.get("Rows Removed by Filter", 0) == 0 for s in branches)


@pytest.mark.django_db
def test_sql__resumed_queue_claim_does_not_walk_the_jobs_before_it():
    """The per-queue resumed claim reads each queue from its position on: none of the
    jobs before it (the dead entries a pinned horizon leaves), and a queue given the
    head position from its head."""
    with connection.cursor() as cursor:
        insert_jobs(cursor, "pending", 20000, queue="big")
        insert_jobs(cursor, "pending", 5, queue="small")
        cursor.execute("UPDATE pgqueue_job SET priority = 0")
        cursor.execute("SELECT max(id) - 10 FROM pgqueue_job WHERE queue = 'big'")
        (after,) = cursor.fetchone()
        cursor.execute("ANALYZE pgqueue_job")
    plan = claim_plan(
        "JOB_CLAIM_QUEUES_AFTER",
        analyze=True,
        queues=["big", "small"],
        after_priorities=[0, QUEUE_HEAD[0]],
        after_ids=[after, QUEUE_HEAD[1]],
        limit=50,
    )
    branches = [s for s in index_scans(plan) if "= ANY" not in str(s["Index Cond"])]
    assert len(branches) == 3, branches  # above, level, below (each run once per queue)

    def read(scan: dict[str, object]) -> int:
        loops = int(scan["Actual Loops"])  # type: ignore[call-overload]
        rows = float(scan["Actual Rows"]) * loops  # type: ignore[arg-type]
        return round(rows) + int(scan.get("Rows Removed by Filter", 0))  # type: ignore[call-overload]

    # 10 of big's after the position and small's 5 from its head: a handful of entries
    # read (whatever index the planner takes for a range), none of the 19,990 before it.
    assert sum(read(s) for s in branches) <= 30, [(s["Index Name"], read(s)) for s in branches]


def test_sql__every_claim_leases_its_candidates_alike():
    def lease(name: str) -> str:
        text = getattr(sql, name)
        return text[text.index("), clock AS (") :]

    assert lease("JOB_CLAIM_AFTER") == lease("JOB_CLAIM") == lease("JOB_CLAIM_QUEUES")
    assert lease("JOB_CLAIM_QUEUES_AFTER") == lease("JOB_CLAIM")


def test_sql__the_fence_the_lease_and_the_cancelled_entry_are_written_once():
    """Each rule is one fragment of the SQL modules' source, which every statement
    needing it joins: a second spelling would be free to drift from the first."""
    source = "".join(SOURCES.values())
    for rule in (
        "j.last_attempted_at::timestamp = owned.claimed_at",  # the fence
        "make_interval(secs => %(lease_seconds)s)",  # the lease
        "'django_pgqueue.exceptions.JobCancelled: '",  # the cancelled entry
    ):
        assert source.count(rule) == 1, rule
    texts = {name: getattr(sql, name) for name in CONSTANTS}
    fenced = {name for name, text in texts.items() if "owned" in text}
    assert fenced == {name for name, text in texts.items() if FENCE in text}
    assert {"JOB_COMPLETE_MANY", "JOB_EXTEND_LEASES", "JOB_FAIL", "JOB_SNOOZE"} <= fenced
    leased = {name for name, text in texts.items() if "%(lease_seconds)s" in text}
    assert leased == {
        "JOB_CLAIM",
        "JOB_CLAIM_AFTER",
        "JOB_CLAIM_AFTER_KINDS",
        "JOB_CLAIM_FLOW",
        "JOB_CLAIM_KINDS",
        "JOB_CLAIM_LIMITED",
        "JOB_CLAIM_LIMITED_HEAD",
        "JOB_CLAIM_LIMITED_HEAD_KEYS",
        "JOB_CLAIM_QUEUES",
        "JOB_CLAIM_QUEUES_AFTER",
        "JOB_CLAIM_QUEUES_AFTER_KINDS",
        "JOB_CLAIM_QUEUES_KINDS",
        "JOB_EXTEND_LEASES",
    }
    assert all(LEASE in texts[name] for name in leased)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "name", ["JOB_COMPLETE_MANY", "JOB_COMPLETE_MANY_RELEASING", "JOB_EXTEND_LEASES"]
)
def test_sql__batched_fenced_writes_look_rows_up_by_primary_key(name):
    with connection.cursor() as cursor:
        insert_jobs(cursor, "done", 20000)
        insert_jobs(cursor, "pending", 10)
        cursor.execute(
            "UPDATE pgqueue_job SET status = 'running', lease_owner = 'w1',"
            " lease_expires_at = clock_timestamp() WHERE status = 'pending'"
        )
        cursor.execute("ANALYZE pgqueue_job")
    ids = list(range(1, 51))
    params = {
        "worker_id": "w1",
        "ids": ids,
        "attempts": [1] * 50,
        "claimed_at": [None] * 50,
        "results": ["null"] * 50,
        "lease_seconds": 60,
        "channel": "pgqueue_job",
        "now": None,
    }
    connection.ensure_connection()
    query = psycopg.ClientCursor(connection.connection).mogrify(getattr(sql, name), params)
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + query)
        plan = json.dumps(cursor.fetchone()[0])
    # The lease index holds an entry for every job finished since the last VACUUM:
    # reading it whole instead of 50 ids would cost more with every job. (The
    # completion's jobs are also looked up in the edges table, by its own indexes.)
    edges = JobDependency._meta.db_table
    jobs_table = [
        s["Index Name"]
        for s in index_scans(plan)
        if not str(s["Index Name"]).startswith(("pgqueue_job_dep_", f"{edges}_pkey"))
    ]
    assert set(jobs_table) == {"pgqueue_job_pkey"}


def generic_claim_plan(name: str, **params: object) -> str:
    """EXPLAIN ANALYZE of a claim's generic plan, as a worker's claim connection runs it
    (SESSION_CONFIGURE_CLAIM, prepared), in a transaction rolled back."""
    params = {"worker_id": "w1", "limit": 50, "lease_seconds": 60.0, "now": None, **params}
    order = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", getattr(sql, name))))
    text = getattr(sql, name)
    for i, key in enumerate(order, 1):
        text = text.replace(f"%({key})s", f"${i}")
    types = {"worker_id": "text", "limit": "bigint", "lease_seconds": "float8",
             "now": "timestamptz", "after_priority": "int", "after_id": "bigint",
             "queues": "text[]", "after_priorities": "int[]", "after_ids": "bigint[]"}  # fmt: skip
    with connect_test_db(autocommit=True) as conn:
        conn.execute(sql.SESSION_CONFIGURE_CLAIM)
        conn.execute(f"PREPARE claim ({', '.join(types[k] for k in order)}) AS {text}")
        conn.execute("BEGIN")
        arguments = ", ".join(["%s"] * len(order))
        explain = f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE claim ({arguments})"
        cursor = psycopg.ClientCursor(conn)  # EXECUTE's arguments are literals
        (plan,) = cursor.execute(explain, [params[k] for k in order]).fetchone()
        conn.execute("ROLLBACK")
    return json.dumps(plan)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("JOB_CLAIM", {}),
        ("JOB_CLAIM_AFTER", {"after_priority": 0, "after_id": 0}),
        ("JOB_CLAIM_QUEUES", {"queues": ["default"]}),
        (
            "JOB_CLAIM_QUEUES_AFTER",
            {"queues": ["default"], "after_priorities": [0], "after_ids": [0]},
        ),
    ],
    ids=["all_queues", "resumed", "one_queue", "one_queue_resumed"],
)
def test_sql__generic_claim_plan_takes_its_rows_by_key(name, params):
    """On a claim connection the claims are prepared with one generic plan (planned for
    any LIMIT): it must still be the ordered index scan, its rows leased by key, not a
    join that walks the table (7 ms behind 20,000 finished rows, before)."""
    with connection.cursor() as cursor:
        insert_jobs(cursor, "done", 20000)
        insert_jobs(cursor, "pending", 1)
        cursor.execute("SELECT max(id) - 1 FROM pgqueue_job")
        (before,) = cursor.fetchone()
        # VACUUM too: earlier tests' rolled-back claims leave dead claim-index entries
        # that the scan would step over (hundreds of pages), whatever the plan.
        cursor.execute("VACUUM ANALYZE pgqueue_job")
    if "after_id" in params:
        params = {**params, "after_priority": -101, "after_id": before}
    plan = generic_claim_plan(name, **params)
    assert '"Node Type": "Seq Scan"' not in plan
    assert '"Merge Join"' not in plan and '"Hash Join"' not in plan
    (entry,) = json.loads(plan)
    assert entry["Plan"]["Actual Rows"] == 0 or entry["Plan"]["Node Type"] == "ModifyTable"
    # Leased by key: a handful of pages, not the 20,000 finished rows' pages.
    assert entry["Plan"]["Shared Hit Blocks"] + entry["Plan"]["Shared Read Blocks"] < 100, plan


@pytest.mark.django_db
def test_sql__the_usage_function_the_migrations_install_is_sql_pys():
    """``pgqueue_flow_usage`` is created by a migration, which holds a frozen copy of
    ``sql.FLOW_USAGE_FUNCTION``: a change to one without a migration carrying it to the
    other would leave the claims reading budgets differently from what sql.py says."""
    body = sql.FLOW_USAGE_FUNCTION.split("$body$")[1]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT p.prosrc, p.provolatile, l.lanname FROM pg_proc AS p "
            "JOIN pg_language AS l ON l.oid = p.prolang WHERE p.proname = 'pgqueue_flow_usage'"
        )
        installed = cursor.fetchall()
    # One function, volatile (a snapshot per query: why it exists), in PL/pgSQL.
    assert installed == [(body, "v", "plpgsql")]
    # Its own planner settings (why: FLOW_USAGE_FUNCTION's comment).
    with connection.cursor() as cursor:
        cursor.execute("SELECT proconfig FROM pg_proc WHERE proname = 'pgqueue_flow_usage'")
        (config,) = cursor.fetchone()
    assert config == ["enable_seqscan=off", "enable_bitmapscan=off", "jit=off"]


def _usage_key_count() -> str:
    """The key count of ``pgqueue_flow_usage`` (its first query), for ``$1`` keys."""
    body = sql.FLOW_USAGE_FUNCTION.split("$body$")[1]
    query = body.split("RETURN QUERY")[1].split("UNION ALL")[0]
    assert "FROM unnest(keys) AS k(key)" in query
    return query.replace("unnest(keys)", "unnest($1::text[])")


@pytest.mark.django_db
def test_sql__no_plan_of_the_usage_functions_key_count_can_read_the_lease_index():
    """A key's running jobs are counted in words only pgqueue_job_running_key_idx
    answers to: with that index gone, what is left is a scan of the table, never
    pgqueue_job_lease_idx (every running job of the fleet, read for each key of each
    claim), which the planner priced alike while its statistics saw nothing running."""
    with connection.cursor() as cursor:
        cursor.execute("DROP INDEX pgqueue_job_running_key_idx")  # (rolled back)
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute("SET LOCAL jit = off")
        cursor.execute(f"PREPARE usage_keys(text[]) AS {_usage_key_count()}")
        try:
            cursor.execute("EXPLAIN EXECUTE usage_keys('{k:1,k:2}')")
            plan = "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("DEALLOCATE usage_keys")
    assert "pgqueue_job_lease_idx" not in plan, plan
    assert "Seq Scan on pgqueue_job" in plan, plan


@pytest.mark.django_db
def test_sql__the_usage_function_counts_each_key_by_a_probe_of_the_running_key_index():
    """Whatever the statistics (here: none running when analyzed, the drain's
    start), the function probes pgqueue_job_running_key_idx once per key and reads
    neither pgqueue_job_lease_idx nor the table (the per-transaction counters of
    each: pg_stat_get_xact_numscans)."""
    for n in range(6):
        Job.objects.enqueue("testproject.demo.tasks.add", [n, n], concurrency_key=f"k:{n % 3}")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE pgqueue_job")
        cursor.execute(
            "UPDATE pgqueue_job SET status = 'running', lease_owner = 'w',"
            " lease_expires_at = clock_timestamp() + interval '1 minute'"
            " WHERE concurrency_key IN ('k:0', 'k:1')"
        )

        def scans() -> tuple[int, int, int]:
            cursor.execute(
                "SELECT pg_stat_get_xact_numscans('pgqueue_job_running_key_idx'::regclass),"
                " pg_stat_get_xact_numscans('pgqueue_job_lease_idx'::regclass),"
                " pg_stat_get_xact_numscans('pgqueue_job'::regclass)"
            )
            return cursor.fetchone()

        before = scans()
        cursor.execute(
            "SELECT budget_subject, running FROM pgqueue_flow_usage("
            "'{k:0,k:1,k:2,k:9}', '{}', '{}', '{}') ORDER BY 1"
        )
        counted = cursor.fetchall()
        after = scans()
    assert counted == [("k:0", 2), ("k:1", 2), ("k:2", 0), ("k:9", 0)]
    assert (after[0] - before[0], after[1] - before[1], after[2] - before[2]) == (4, 0, 0)


def _scans(node: dict, found: list[tuple[str, str, bool]]) -> list[tuple[str, str, bool]]:
    """(node type, relation, has an index condition) of every scan in a JSON plan."""
    if "Relation Name" in node:
        found.append((node["Node Type"], node["Relation Name"], "Index Cond" in node))
    for child in node.get("Plans", []):
        _scans(child, found)
    return found


@pytest.mark.django_db
def test_sql__the_stranded_repair_reads_the_jobs_table_by_key_only():
    """JOB_RESOLVE_STRANDED runs in every sweeper (once a minute): its cost must be the
    unresolved edges', never a walk of the jobs table, however big that is. (Written
    as a plain semi-join with ORDER BY p.id, it walked pgqueue_job_pkey whole.)"""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgqueue_job (backend, queue, task, args, kwargs, priority, status,"
            " attempts, max_attempts, run_at, errors, created_at, finished_at)"
            " SELECT 'default', 'default', 't', '[]', '{}', 0, 'done', 1, 3,"
            " clock_timestamp(), '[]', clock_timestamp(), clock_timestamp()"
            " FROM generate_series(1, 20000)"
        )
        cursor.execute(
            "INSERT INTO pgqueue_job_dependency (job_id, position, parent_id)"
            " SELECT 1, g, g FROM generate_series(1, 50) AS g"
        )
        cursor.execute("ANALYZE pgqueue_job")
        cursor.execute("ANALYZE pgqueue_job_dependency")
        query = psycopg.ClientCursor(connection.connection).mogrify(
            sql.JOB_RESOLVE_STRANDED, {"now": None, "batch_size": 100, "channel": "c"}
        )
        cursor.execute("EXPLAIN (FORMAT JSON) " + query)
        (plan,) = cursor.fetchone()[0]
    scans = [
        s for s in _scans(plan["Plan"], []) if s[1] == Job._meta.db_table and s[0] != "ModifyTable"
    ]
    assert scans and all(s[0].startswith("Index") and s[2] for s in scans), scans
