"""Faults of PostgreSQL itself: a restart mid-run, and a server that is down when the
worker and sweeper start. These tests restart a server, so they start their OWN
embedded PostgreSQL in a temporary directory (never the shared ``.pgdata/`` one).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from testkit.private_server import PrivateServer

from .conftest import MANAGE, REPO, ManagedProcess, wait_for

pytestmark = pytest.mark.slow

ENQUEUE = """
from testproject.demo.fault_tasks import ledger_plain, ledger_tx
for n in range({count}):
    (ledger_tx if n % 2 else ledger_plain).enqueue(n=n, work_ms={work_ms})
"""


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[PrivateServer, str]]:
    with PrivateServer() as private:
        url = private.create_database("faults")
        subprocess.run(
            [sys.executable, str(MANAGE), "migrate", "-v", "0"],
            env={**os.environ, "DATABASE_URL": url},
            cwd=REPO,
            check=True,
        )
        yield private, url


@pytest.fixture
def private_db(server: tuple[PrivateServer, str]) -> tuple[PrivateServer, str]:
    """The private server, running, with empty queue and ledger tables."""
    private, url = server
    if not private.is_running():
        private.start()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE pgqueue_job, pgqueue_step, demo_execution")
    return private, url


def query(url: str, sql: str) -> list[tuple[Any, ...]]:
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=2) as conn:
            return conn.execute(sql).fetchall()
    except psycopg.OperationalError:
        return []


def statuses(url: str) -> dict[str, int]:
    return dict(query(url, "SELECT status, count(*) FROM pgqueue_job GROUP BY status"))


def enqueue(manage: Callable[..., ManagedProcess], url: str, count: int, work_ms: int) -> None:
    code = ENQUEUE.format(count=count, work_ms=work_ms)
    assert manage("shell", "-c", code, env={"DATABASE_URL": url}).wait(60) == 0


def test_worker__survives_postgres_restart(
    private_db: tuple[PrivateServer, str], manage: Callable[..., ManagedProcess]
) -> None:
    """C46: PostgreSQL restarts with jobs in flight; worker and sweeper reconnect on
    their own, every job ends done, and each transactional job has exactly one
    effect (I5) while ordinary ones have at least one."""
    private, url = private_db
    env = {"DATABASE_URL": url}
    enqueue(manage, url, 60, 100)
    worker = manage(
        "pgqueue_worker", "--concurrency", "4", "--lease-seconds", "2",
        "--poll-interval", "0.2", env=env,
    )  # fmt: skip
    sweeper = manage("pgqueue_sweep", "--loop", "--interval", "0.5", env=env)
    wait_for(lambda: statuses(url).get("done", 0) >= 8)
    private.restart()
    wait_for(lambda: statuses(url).get("done", 0) == 60, timeout=60)
    assert worker.popen.poll() is None and sweeper.popen.poll() is None
    (row,) = query(
        url,
        """
        SELECT count(*) FILTER (WHERE j.task LIKE '%ledger_tx' AND coalesce(l.n, 0) <> 1),
               count(*) FILTER (WHERE j.task LIKE '%ledger_plain' AND coalesce(l.n, 0) < 1)
        FROM pgqueue_job j
        LEFT JOIN (SELECT job_id, count(*) AS n FROM demo_execution GROUP BY job_id) l
               ON l.job_id = j.id
        """,
    )
    assert row == (0, 0)
    assert "database error" in worker.output() or "lease lost" in worker.output()
    for proc in (worker, sweeper):
        proc.signal(signal.SIGTERM)
        assert proc.wait() == 0


def test_worker__database_down_at_start_retries_quietly(
    private_db: tuple[PrivateServer, str], manage: Callable[..., ManagedProcess]
) -> None:
    """C50: the server is down when worker and sweeper start: they log one line per
    attempt (no traceback), back off, and work as soon as the server is up."""
    private, url = private_db
    env = {"DATABASE_URL": url}
    private.stop()
    worker = manage("pgqueue_worker", "--poll-interval", "0.2", env=env)
    sweeper = manage("pgqueue_sweep", "--loop", "--interval", "0.5", env=env)
    wait_for(lambda: worker.output().count("database error while claiming") >= 3)
    wait_for(lambda: sweeper.output().count("sweep failed") >= 3)
    assert worker.popen.poll() is None and sweeper.popen.poll() is None
    assert "Traceback" not in worker.output() + sweeper.output()
    private.start()
    enqueue(manage, url, 4, 0)
    wait_for(lambda: statuses(url).get("done", 0) == 4, timeout=60)
    for proc in (worker, sweeper):
        proc.signal(signal.SIGTERM)
        assert proc.wait() == 0


CLAIM_CONNECTION = """
SELECT extract(epoch FROM backend_start - pg_postmaster_start_time())
FROM pg_stat_activity WHERE application_name = 'pgqueue claim comeback'
"""


def test_worker__claims_within_2s_of_the_server_coming_back(
    private_db: tuple[PrivateServer, str], manage: Callable[..., ManagedProcess]
) -> None:
    """Reliability III #10: after an outage long enough for the reconnect backoff to
    grow past several seconds, the claim loop reconnects within about a probe interval
    of the server's return, not at the end of its backoff."""
    private, url = private_db
    env = {"DATABASE_URL": url}
    worker = manage("pgqueue_worker", "--poll-interval", "0.2", "--worker-id", "comeback", env=env)
    wait_for(lambda: query(url, CLAIM_CONNECTION), timeout=30)
    private.stop()
    # Five failures in a row: the next retry would be about 8 s away.
    wait_for(lambda: worker.output().count("database error while claiming") >= 5, timeout=60)
    private.start()
    # The claim connection's start, measured from the server's, both in database time.
    ((seconds,),) = wait_for(lambda: query(url, CLAIM_CONNECTION), timeout=30)
    assert float(seconds) < 2.0, worker.output()
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
