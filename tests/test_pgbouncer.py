"""The queue through PgBouncer in transaction pooling mode (Debian's ``pgbouncer``).

Every test here starts a private pgbouncer (``testkit/private_bouncer.py``: 127.0.0.1, a free
port, a pool of at most 8 server connections, ``DEALLOCATE ALL`` after every
transaction) in front of the test server, and points real ``manage.py`` processes at it
with ``DATABASE_POOLED=1`` (the test project then sets Django's
``DISABLE_SERVER_SIDE_CURSORS``). A statement prepared server-side, a LISTEN, or a
session setting that must outlive a transaction breaks here; the canary test proves
the first of those would.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from testkit.private_bouncer import PrivateBouncer, pgbouncer_binary

from .conftest import ManagedProcess, connect_test_db, test_database_url, wait_for

pytestmark = [
    pytest.mark.slow,
    # The admin test opens the second backend's list too: create and flush its database.
    pytest.mark.django_db(databases=["default", "second"], transaction=True),
    pytest.mark.skipif(
        pgbouncer_binary() is None,
        reason="pgbouncer is not installed (bash .ci/install-pgbouncer installs Debian's)",
    ),
]

POOL_SIZE = 8
COMMANDS_DIR = Path(__file__).resolve().parent.parent / "django_pgqueue/management/commands"


def server_address() -> tuple[str, str]:
    """(host or socket directory, port) of the test server, as pgbouncer needs them."""
    s = connection.settings_dict
    options = s.get("OPTIONS") or {}
    host = s.get("HOST") or options.get("host") or "127.0.0.1"
    port = s.get("PORT") or options.get("port") or "5432"
    return str(host), str(port)


@pytest.fixture
def bouncer(transactional_db: None) -> Iterator[PrivateBouncer]:
    host, port = server_address()
    with PrivateBouncer(
        server_host=host,
        server_port=port,
        user=connection.settings_dict.get("USER") or "postgres",
        password=connection.settings_dict.get("PASSWORD") or "",
        pool_size=POOL_SIZE,
    ) as private:
        yield private


@pytest.fixture
def pooled(
    bouncer: PrivateBouncer, manage: Callable[..., ManagedProcess]
) -> Callable[..., ManagedProcess]:
    """Start ``manage.py`` through the pgbouncer, as a deployment behind one would."""
    url = bouncer.url(connection.settings_dict["NAME"])

    def start(*args: str, env: dict[str, str] | None = None) -> ManagedProcess:
        return manage(*args, env={"DATABASE_URL": url, "DATABASE_POOLED": "1", **(env or {})})

    return start


def run_python(pooled: Callable[..., ManagedProcess], code: str, timeout: float = 120) -> str:
    """Run ``code`` in ``manage.py shell`` through the pgbouncer; return its output."""
    proc = pooled("shell", "-c", code)
    assert proc.wait(timeout) == 0, proc.output()
    return proc.output()


def statuses() -> dict[str, int]:
    with connect_test_db(autocommit=True) as conn:
        return dict(conn.execute("SELECT status, count(*) FROM pgqueue_job GROUP BY status"))


def assert_nothing_prepared(*procs: ManagedProcess) -> None:
    """No process met a missing prepared statement or any other database error."""
    for proc in procs:
        out = proc.output()
        for sign in ("prepared statement", "database error", "DatabaseError", "sweep failed"):
            assert sign not in out, out


ENQUEUE = """
from django.db import transaction
from django_pgqueue.models import Job
from testproject.demo.fault_tasks import ledger_plain, ledger_tx
from testproject.demo.tasks import always_fails
with transaction.atomic():
    for n in range({single}):
        (ledger_tx if n % 2 else ledger_plain).enqueue(n=n)
with transaction.atomic():  # rolled back: leaves no job
    ledger_plain.enqueue(n=-1)
    transaction.set_rollback(True)
always_fails.using(queue_name="failing").enqueue()
created = Job.objects.bulk_enqueue(
    {{"task": ledger_plain, "kwargs": {{"n": n}}}} for n in range({single}, {total})
)
print("bulk", int(created))
"""


def test_pgbouncer__canary_rejects_a_prepared_statement(bouncer: PrivateBouncer) -> None:
    """The fixture's pgbouncer makes preparing fail at once: what the other tests rely on
    to catch a statement that django-pgqueue (or psycopg for it) prepares server-side."""
    url = bouncer.url(connection.settings_dict["NAME"])
    with psycopg.connect(url, autocommit=True, prepare_threshold=0) as conn:
        with pytest.raises(psycopg.errors.InvalidSqlStatementName):
            for n in range(2):
                conn.execute("SELECT %s::int", [n])
    # The same client with Django's default (prepare_threshold None) is fine.
    with psycopg.connect(url, autocommit=True, prepare_threshold=None) as conn:
        for n in range(10):
            assert conn.execute("SELECT %s::int", [n]).fetchone() == (n,)


def test_worker__through_pgbouncer_runs_every_job_nothing_prepared(
    pooled: Callable[..., ManagedProcess], bouncer: PrivateBouncer
) -> None:
    """Enqueue (one at a time in a transaction, and in bulk through COPY), two workers,
    and a sweeper, all through pgbouncer: every job ends done by identity, the failing
    one dead after its retries, nothing was prepared, and the workers say they poll."""
    out = run_python(pooled, ENQUEUE.format(single=60, total=6000))
    assert "bulk 5940" in out
    assert statuses() == {"pending": 6001}
    env = {"PGQUEUE_RETRY_BACKOFF_BASE": "0.05", "PGQUEUE_RETRY_BACKOFF_MAX": "0.1"}
    workers = [
        pooled(
            "pgqueue_worker",
            "--concurrency",
            "4",
            "--batch-size",
            "20",
            "--lease-seconds",
            "3",
            "--poll-interval",
            "0.1",
            env=env,
        )  # fmt: skip
        for _ in range(2)
    ]
    sweeper = pooled("pgqueue_sweep", "--loop", "--interval", "0.5", env=env)
    wait_for(lambda: statuses() == {"done": 6000, "dead": 1}, timeout=180)
    with connect_test_db(autocommit=True) as conn:
        (missing,) = conn.execute(
            """SELECT count(*) FROM pgqueue_job j WHERE j.task LIKE '%%ledger%%'
               AND NOT EXISTS (SELECT 1 FROM demo_execution e WHERE e.job_id = j.id)"""
        ).fetchone()
        (tx_dupes,) = conn.execute(
            """SELECT count(*) FROM (SELECT job_id FROM demo_execution WHERE kind = 'tx'
               GROUP BY job_id HAVING count(*) <> 1) d"""
        ).fetchone()
        (attempts,) = conn.execute(
            "SELECT attempts FROM pgqueue_job WHERE queue = 'failing'"
        ).fetchone()
    assert (missing, tx_dupes, attempts) == (0, 0, 5)
    for proc in (*workers, sweeper):
        proc.signal(signal.SIGTERM)
        assert proc.wait() == 0
    assert_nothing_prepared(*workers, sweeper)
    assert "wake-ups: polling every 0.1s" in workers[0].output()
    assert bouncer.server_connections() <= POOL_SIZE


#: Session settings a worker sets on a direct connection (sql.SESSION_CONFIGURE and
#: SESSION_CONFIGURE_CLAIM): behind a pooler none may stay on a server connection.
WORKER_SETTINGS = ("statement_timeout", "enable_bitmapscan", "synchronous_commit")


def test_worker__through_pgbouncer_leaves_no_session_settings(
    pooled: Callable[..., ManagedProcess], bouncer: PrivateBouncer
) -> None:
    """The claim's and heartbeat's settings are SET LOCAL behind a pooler: after workers
    ran, every server connection of the pool still has the server's own values, so no
    other client of the pool inherits a worker's bound or its asynchronous commit."""
    run_python(pooled, ENQUEUE.format(single=40, total=400))
    worker = pooled(
        "pgqueue_worker", "--concurrency", "8", "--lease-seconds", "1.5", "--burst",
        "--poll-interval", "0.1",
    )  # fmt: skip
    assert worker.wait(120) == 0, worker.output()
    url = bouncer.url(connection.settings_dict["NAME"])
    show = "SELECT " + ", ".join(f"current_setting('{name}')" for name in WORKER_SETTINGS)
    held = [psycopg.connect(url) for _ in range(POOL_SIZE)]
    try:
        # Each client holds a transaction open, so each sits on its own server connection.
        seen = {conn.execute(show).fetchone() for conn in held}
        pids = {conn.execute("SELECT pg_backend_pid()").fetchone()[0] for conn in held}
    finally:
        for conn in held:
            conn.close()
    with psycopg.connect(test_database_url(), autocommit=True) as fresh:
        (defaults,) = {fresh.execute(show).fetchone()}
    assert len(pids) == POOL_SIZE
    assert seen == {defaults}, seen
    assert_nothing_prepared(worker)


LEAK_READ_ONLY = """
from testproject.demo.fault_tasks import leak
leak.using(priority=5).enqueue(kind="read_only")
"""

ENQUEUE_AFTER = """
from testproject.demo.tasks import add
for n in range(20):
    add.enqueue(n, n)
print("enqueued", 20)
"""


def test_worker__leaked_session_setting_is_reset_on_the_server_behind_pgbouncer(
    pooled: Callable[..., ManagedProcess], bouncer: PrivateBouncer
) -> None:
    """Defect: a task's ``SET default_transaction_read_only = on`` was caught
    (TransactionLeak) and its client connection closed, but closing resets nothing on
    a pooler: the server connection kept the setting, and the application's next
    enqueues through the pooler failed "read-only transaction". Now the worker resets
    the server session before it lets the connection go: the enqueues succeed and
    every server connection of the pool has the server's own value."""
    run_python(pooled, LEAK_READ_ONLY)
    worker = pooled(
        "pgqueue_worker", "--burst", "--concurrency", "1", "--batch-size", "1",
        env={"PGQUEUE_RETRY_BACKOFF_BASE": "60"},
    )  # fmt: skip
    assert worker.wait(120) == 0, worker.output()
    with connect_test_db(autocommit=True) as conn:
        (error,) = conn.execute(
            "SELECT errors -> -1 ->> 'exception_class_path' FROM pgqueue_job"
        ).fetchone()
    assert error.endswith("TransactionLeak")
    assert "enqueued 20" in run_python(pooled, ENQUEUE_AFTER)
    url = bouncer.url(connection.settings_dict["NAME"])
    held = [psycopg.connect(url) for _ in range(POOL_SIZE)]
    try:
        show = "SELECT current_setting('default_transaction_read_only'), pg_backend_pid()"
        seen = [conn.execute(show).fetchone() for conn in held]
    finally:
        for conn in held:
            conn.close()
    assert len({pid for _, pid in seen}) == POOL_SIZE
    assert {value for value, _ in seen} == {"off"}
    assert statuses() == {"pending": 20, "scheduled": 1}


def test_listener__listen_database_wakes_a_worker_behind_pgbouncer(
    pooled: Callable[..., ManagedProcess],
) -> None:
    """With OPTIONS['LISTEN_DATABASE'] naming a direct connection, a worker behind
    pgbouncer that polls only every 60 s picks a new job up at once: by NOTIFY."""
    direct = test_database_url()
    worker = pooled(
        "pgqueue_worker", "--poll-interval", "60", "--worker-id", "listening",
        env={"PGQUEUE_LISTEN_DATABASE": direct},
    )  # fmt: skip

    def listening() -> bool:
        with connect_test_db(autocommit=True) as conn:
            rows = conn.execute(
                "SELECT 1 FROM pg_stat_activity WHERE application_name = %s",
                ["pgqueue listen listening"],
            ).fetchall()
        return bool(rows) and "wake-ups: LISTEN on" in worker.output()

    wait_for(listening, timeout=30)
    # A first job done means the worker has made its claims since starting and gone
    # idle (its next poll is 60 s away); only a NOTIFY can bring it the second one soon.
    run_python(pooled, "from testproject.demo.tasks import add; add.enqueue(1, 2)")
    wait_for(lambda: statuses() == {"done": 1}, timeout=30)
    began = time.monotonic()
    run_python(pooled, "from testproject.demo.tasks import add; add.enqueue(3, 4)")
    wait_for(lambda: statuses() == {"done": 2}, timeout=30)
    assert time.monotonic() - began < 30  # far below the 60 s poll
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
    assert_nothing_prepared(worker)


#: Every pgqueue command, run through pgbouncer: (arguments, expected in its output).
COMMAND_RUNS: dict[str, tuple[list[str], str]] = {
    "pgqueue_worker": (["--burst", "--concurrency", "2"], "stopped: done=3"),
    "pgqueue_sweep": ([], "recovered=0 dead=0 promoted=0 pruned=0"),
    "pgqueue_status": (["--json"], '"workers"'),
    "pgqueue_queue": (["list"], "default  running  pending=3"),
}


def test_commands__every_command_works_through_pgbouncer(
    pooled: Callable[..., ManagedProcess],
) -> None:
    """``check``, ``migrate --check`` and each ``pgqueue_*`` command of the package run
    through pgbouncer (a new command fails here until it is added to COMMAND_RUNS)."""
    shipped = {p.stem for p in COMMANDS_DIR.glob("pgqueue_*.py")}
    assert shipped == set(COMMAND_RUNS), "add the new command to COMMAND_RUNS"
    run_python(
        pooled,
        "from testproject.demo.tasks import add\nfor n in range(3): add.enqueue(n, n)",
    )
    for args in (["check"], ["migrate", "--check"]):
        proc = pooled(*args)
        assert proc.wait(60) == 0, proc.output()
    for name, (args, expected) in sorted(COMMAND_RUNS.items()):
        proc = pooled(name, *args)
        assert proc.wait(60) == 0, proc.output()
        assert expected in proc.output(), proc.output()
        assert_nothing_prepared(proc)


ADMIN = """
import json
from django.contrib.auth.models import User
from django.test import Client
from django_pgqueue.models import Job
from testproject.demo.tasks import add
user = User.objects.create_superuser("bouncer-admin", "a@example.com", "pw")
client = Client()
client.force_login(user)
for n in range(3):
    add.enqueue(n, n)
dead = Job.objects.enqueue("testproject.demo.tasks.add", [1, 1])
Job.objects.filter(pk=dead.pk).update(status="dead", attempts=5)
pages = [
    "/admin/django_pgqueue/job/",
    "/admin/django_pgqueue/job/?status=pending&queue=default",
    "/admin/django_pgqueue/job/?q=add",
    "/admin/django_pgqueue/job/?backend=second",
    f"/admin/django_pgqueue/job/{dead.pk}/change/",
    "/admin/django_pgqueue/deadletter/",
    f"/admin/django_pgqueue/deadletter/{dead.pk}/change/",
]
codes = {page: client.get(page).status_code for page in pages * 3}
post = client.post(
    "/admin/django_pgqueue/deadletter/",
    {"action": "requeue", "_selected_action": [dead.pk]},
)
codes["requeue"] = post.status_code
codes["requeued"] = Job.objects.get(pk=dead.pk).status
print("RESULT", json.dumps(codes))
"""


def test_admin__pages_and_requeue_work_through_pgbouncer(
    pooled: Callable[..., ManagedProcess],
) -> None:
    """The job and dead-letter lists (with filters and search), change pages and the
    requeue action, each page three times, with Django's admin going through pgbouncer."""
    out = run_python(pooled, ADMIN)
    codes = json.loads(out.split("RESULT ", 1)[1])
    assert codes.pop("requeued") == "pending"
    assert codes.pop("requeue") == 302
    assert set(codes.values()) == {200}, codes


FLEET_WORKERS = 16
FLEET_JOBS = 4000


def test_fleet__16_workers_through_8_server_connections_lose_nothing(
    pooled: Callable[..., ManagedProcess], bouncer: PrivateBouncer
) -> None:
    """16 worker processes (8 alone, 8 under two ``--processes 4`` supervisors) share a
    pool of at most 8 server connections: every job, by identity, ends done with at
    least one execution, none twice for a transactional one, and pgbouncer never held
    more than 8 server connections."""
    run_python(
        pooled,
        "from django_pgqueue.models import Job\n"
        "from testproject.demo.fault_tasks import ledger_plain, ledger_tx\n"
        "Job.objects.bulk_enqueue({'task': ledger_tx if n % 2 else ledger_plain, "
        f"'kwargs': {{'n': n}}}} for n in range({FLEET_JOBS}))",
    )
    with connect_test_db(autocommit=True) as conn:
        enqueued = {row[0] for row in conn.execute("SELECT id FROM pgqueue_job")}
    assert len(enqueued) == FLEET_JOBS
    most = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            most[0] = max(most[0], bouncer.server_connections())
            stop.wait(0.05)

    sampler = threading.Thread(target=sample)
    began = time.monotonic()
    sampler.start()
    try:
        # Half as single processes, half as children of two --processes supervisors.
        each = ["--concurrency", "2", "--batch-size", "10", "--burst", "--poll-interval", "0.2"]
        workers = [pooled("pgqueue_worker", *each) for _ in range(FLEET_WORKERS // 2)]
        workers += [
            pooled("pgqueue_worker", "--processes", str(FLEET_WORKERS // 4), *each)
            for _ in range(2)
        ]
        wait_for(lambda: statuses() == {"done": FLEET_JOBS}, timeout=300, interval=0.2)
        elapsed = time.monotonic() - began
        for proc in workers:
            assert proc.wait(60) == 0, proc.output()
    finally:
        stop.set()
        sampler.join()
    with connect_test_db(autocommit=True) as conn:
        done = {r[0] for r in conn.execute("SELECT id FROM pgqueue_job WHERE status = 'done'")}
        ran = {r[0] for r in conn.execute("SELECT DISTINCT job_id FROM demo_execution")}
        (tx_dupes,) = conn.execute(
            """SELECT count(*) FROM (SELECT job_id FROM demo_execution WHERE kind = 'tx'
               GROUP BY job_id HAVING count(*) <> 1) d"""
        ).fetchone()
    assert done == enqueued and ran == enqueued and tx_dupes == 0
    assert 0 < most[0] <= POOL_SIZE
    started = sum(p.output().count(" starting: ") for p in workers)
    assert started == FLEET_WORKERS
    assert_nothing_prepared(*workers)
    print(
        f"\nfleet: {FLEET_WORKERS} worker processes x concurrency 2 through pgbouncer (pool "
        f"{POOL_SIZE}): {FLEET_JOBS} jobs in {elapsed:.1f}s = {FLEET_JOBS / elapsed:.0f} "
        f"jobs/s (incl. process start-up); most server connections seen: {most[0]}"
    )
