"""A private PgBouncer in transaction pooling mode, in front of a PostgreSQL server.

The tests and the fleet bench run the queue through it, as teams with many worker hosts
do. It uses Debian's ``pgbouncer`` binary (``.ci/install-pgbouncer``), listens on
127.0.0.1 on a free port, trusts the user names of its auth file, and forwards every
database name to the server behind it.

Two settings make breakage deterministic instead of a matter of luck:

* ``server_reset_query = DEALLOCATE ALL`` run after *every* transaction
  (``server_reset_query_always``): a statement prepared server-side is gone by the next
  transaction, so a client that prepares (psycopg does after five executions when
  allowed to) fails at once, whichever server connection it gets next;
* a small pool (``max_db_connections``): many clients share few server connections, so
  session state one client leaves behind would reach another.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

BINARY_PATHS = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer")


def pgbouncer_binary() -> str | None:
    """The pgbouncer executable, or None if it is not installed."""
    found = shutil.which("pgbouncer")
    if found:
        return found
    return next((p for p in BINARY_PATHS if os.access(p, os.X_OK)), None)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivateBouncer:
    """One pgbouncer process; ``url(database)`` is how clients reach ``database``."""

    def __init__(
        self,
        *,
        server_host: str,
        server_port: int | str,
        user: str = "postgres",
        password: str = "",
        pool_size: int = 8,
        max_client_conn: int = 1000,
        server_login_retry: int = 15,
    ) -> None:
        binary = pgbouncer_binary()
        if binary is None:
            raise FileNotFoundError("pgbouncer is not installed (bash .ci/install-pgbouncer)")
        self.binary = binary
        self.user = user
        self.password = password
        self.pool_size = pool_size
        self.port = free_port()
        # pgbouncer refuses to run as root. Then it runs as the owner of the server's
        # socket directory (it must reach the socket) or as Debian's 'postgres' user.
        self.run_as: str | None = None
        if os.geteuid() == 0:
            is_socket_dir = str(server_host).startswith("/")
            owner = os.stat(server_host).st_uid if is_socket_dir else None
            self.run_as = pwd.getpwuid(owner).pw_name if owner else "postgres"
        self.dir = Path(tempfile.mkdtemp(prefix="pgqueue-bouncer-"))
        os.chmod(self.dir, 0o755)
        quoted = '"{}" "{}"\n'.format(user.replace('"', '""'), password.replace('"', '""'))
        (self.dir / "users.txt").write_text(quoted)
        server = f"host={server_host} port={server_port}"
        (self.dir / "pgbouncer.ini").write_text(
            "\n".join(
                [
                    "[databases]",
                    f"* = {server}",
                    "[pgbouncer]",
                    "listen_addr = 127.0.0.1",
                    f"listen_port = {self.port}",
                    "unix_socket_dir =",
                    "auth_type = trust",
                    f"auth_file = {self.dir / 'users.txt'}",
                    f"admin_users = {user}",
                    "pool_mode = transaction",
                    f"default_pool_size = {pool_size}",
                    "min_pool_size = 0",
                    "reserve_pool_size = 0",
                    f"max_db_connections = {pool_size}",
                    f"max_user_connections = {pool_size}",
                    f"max_client_conn = {max_client_conn}",
                    "server_reset_query = DEALLOCATE ALL",
                    "server_reset_query_always = 1",
                    "ignore_startup_parameters = extra_float_digits",
                    # After a failed server login (the server restarting), how long
                    # pgbouncer refuses clients before it tries again: its default, 15.
                    f"server_login_retry = {server_login_retry}",
                    f"logfile = {self.dir / 'pgbouncer.log'}",
                    f"pidfile = {self.dir / 'pgbouncer.pid'}",
                    "",
                ]
            )
        )
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> None:
        """Start pgbouncer and wait until it accepts connections."""
        args = [self.binary, str(self.dir / "pgbouncer.ini")]
        if self.run_as is not None:
            for path in (self.dir, self.dir / "users.txt", self.dir / "pgbouncer.ini"):
                shutil.chown(path, self.run_as)
            args[1:1] = ["-u", self.run_as]
        self.process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.admin("SHOW VERSION")
                return
            except psycopg.OperationalError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"pgbouncer did not start:\n{self.log()}") from None
                time.sleep(0.05)

    def url(self, database: str) -> str:
        """The URL of ``database`` through this pgbouncer."""
        auth = self.user if not self.password else f"{self.user}:{self.password}"
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{database}"

    def admin(self, command: str) -> list[dict[str, Any]]:
        """Run a command on pgbouncer's admin console (``SHOW POOLS`` ...): rows as dicts.

        The console speaks only the simple query protocol: hence a client-side cursor."""
        with psycopg.connect(
            self.url("pgbouncer"),
            autocommit=True,
            connect_timeout=2,
            cursor_factory=psycopg.ClientCursor,
        ) as conn:
            cur = conn.execute(command)
            if cur.description is None:
                return []
            names = [c.name for c in cur.description]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def server_connections(self) -> int:
        """Server connections pgbouncer holds now, across all pools."""
        return sum(
            int(p["sv_active"]) + int(p["sv_idle"]) + int(p["sv_used"])
            + int(p["sv_tested"]) + int(p["sv_login"])
            for p in self.admin("SHOW POOLS")
            if p["database"] != "pgbouncer"
        )  # fmt: skip

    def log(self) -> str:
        path = self.dir / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # immediate shutdown
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PrivateBouncer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
