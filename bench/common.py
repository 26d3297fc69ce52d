"""What several benches share: their database, Django's set-up, one value of a query,
and waiting on a condition with a deadline. Not a bench itself (the Makefile leaves it
out of ``make bench NAME=...``)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def ensure_databases(url: str, *suffixes: str) -> None:
    """Create the database of ``url`` if missing, and one named after it plus each of
    ``suffixes`` on the same server (a bench's second database)."""
    import psycopg
    from psycopg import sql

    base, _, name = url.rpartition("/")
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        for db in (name, *(name + suffix for suffix in suffixes)):
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [db]).fetchone():
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db)))


def setup_django(url: str | None = None) -> None:
    """Django with the test project's settings on ``url`` (None: ``DATABASE_URL`` as it
    is), migrated."""
    sys.path.insert(0, str(REPO))
    if url is not None:
        os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def sql_one(query: str, params: Any = None) -> Any:
    """The first column of the first row of ``query`` (None: no row)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(query, params)
        row = cursor.fetchone() if cursor.description else None
    return None if row is None else row[0]


def wait_until(
    condition: Callable[[], Any], timeout: float, what: str, poll: float = 0.02
) -> None:
    """Return once ``condition()`` is true; exit the bench naming ``what`` after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"benchmark timed out waiting for {what}")
        time.sleep(poll)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (all its threads) so far, in seconds;
    0 for a process that is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rpartition(")")[2].split()  # from field 3 (state) on
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants alive now (a worker's ``--processes`` children)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rpartition(")")[2].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, ()))
    return tree


def backend_pids(exclude: Any = ()) -> list[int]:
    """The PostgreSQL client backends of the bench's database but the bench's own
    connection's and those of ``exclude``."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
        )
        return [row[0] for row in cursor.fetchall() if row[0] not in set(exclude)]
