"""Shared fixtures: real PostgreSQL only (embedded by default, or ``DATABASE_URL``).

* ``job_factory(**overrides)`` inserts a job through the real enqueue path.
* ``now`` is a fixed database-style timestamp passed into the SQL as ``%(now)s``.
* ``other_connection()`` opens a second, independent psycopg connection to the test DB.
* ``manage(*args)`` starts a real ``manage.py`` subprocess against the test DB and
  kills any leftover in teardown.
* ``wait_for(condition, timeout=...)`` polls a condition with a deadline.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import Client

from django_pgqueue.models import Job

REPO = Path(__file__).resolve().parent.parent
MANAGE = REPO / "testproject" / "manage.py"

# The pgqueue fixture. The distribution's pytest11 entry point loads it too, under this
# same name (so never twice), once installed from a pyproject.toml that declares it.
pytest_plugins = ["django_pgqueue.pytest_plugin"]

# A shell starts a background job with SIGINT ignored (CI runs the suite that way), and
# subprocesses inherit that: a test's SIGINT to pgqueue_status --watch went unheard.
# Python's own handler instead, which a child's exec turns back into the default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--shard",
        default=None,
        metavar="I/N",
        help="run the I-th of N interleaved shares of the selected tests (0-based), so "
        "that N runs side by side cover them once (make test does this)",
    )


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected theirs
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    shard = config.getoption("--shard")
    if not shard:
        return
    index, count = (int(part) for part in shard.split("/"))
    if not 0 <= index < count:
        raise pytest.UsageError(f"--shard {shard}: I must be in 0..N-1")
    kept = items[index::count]
    config.hook.pytest_deselected(items=[item for item in items if item not in kept])
    items[:] = kept


def wait_for(
    condition: Callable[[], Any], *, timeout: float = 20.0, interval: float = 0.05
) -> Any:
    """Return the first truthy value of ``condition()``; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {condition}")
        time.sleep(interval)


def test_database_url() -> str:
    """URL of the database the current test uses (the ``test_`` one)."""
    s = connection.settings_dict
    user = quote(s.get("USER") or "postgres")
    password = quote(s.get("PASSWORD") or "")
    # django-environ keeps a socket directory given as ?host=... in OPTIONS, not HOST.
    options = s.get("OPTIONS") or {}
    host = s.get("HOST") or options.get("host") or ""
    port = s.get("PORT") or options.get("port") or ""
    name = s["NAME"]
    if host.startswith("/"):
        return f"postgresql://{user}:{password}@/{name}?host={host}" + (
            f"&port={port}" if port else ""
        )
    return f"postgresql://{user}:{password}@{host}:{port or 5432}/{name}"


test_database_url.__test__ = False  # type: ignore[attr-defined]


def connect_test_db(**kwargs: Any) -> psycopg.Connection:
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params.update(kwargs)
    return psycopg.connect(**params)


@pytest.fixture
def now() -> dt.datetime:
    """A fixed clock for SQL that takes ``%(now)s``: boundaries become exact."""
    return dt.datetime(2030, 1, 1, 12, 0, 0, tzinfo=dt.UTC)


@pytest.fixture
def job_factory(db: None) -> Callable[..., Job]:
    def make(**overrides: Any) -> Job:
        overrides.setdefault("task", "testproject.demo.tasks.add")
        overrides.setdefault("args", [1, 2])
        task = overrides.pop("task")
        args = overrides.pop("args")
        kwargs = overrides.pop("kwargs", None)
        return Job.objects.enqueue(task, args, kwargs, **overrides)

    return make


@pytest.fixture
def other_connection() -> Iterator[Callable[..., psycopg.Connection]]:
    """Factory of extra real connections to the test database, closed at teardown."""
    opened: list[psycopg.Connection] = []

    def open_(**kwargs: Any) -> psycopg.Connection:
        conn = connect_test_db(**kwargs)
        opened.append(conn)
        return conn

    yield open_
    for conn in opened:
        conn.close()


class ManagedProcess:
    """A ``manage.py`` subprocess whose output is collected in a file."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log_path = log
        self._log = log.open("w")
        self.popen = subprocess.Popen(
            [sys.executable, str(MANAGE), *args],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self) -> str:
        self._log.flush()
        return self.log_path.read_text()

    def signal(self, sig: int) -> None:
        self.popen.send_signal(sig)

    def wait(self, timeout: float = 30.0) -> int:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"process did not exit in {timeout}s; output:\n{self.output()}"
            ) from None

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(10)
        self._log.close()


@pytest.fixture
def manage(tmp_path: Path) -> Iterator[Callable[..., ManagedProcess]]:
    """Start real ``manage.py`` subprocesses on the test database; kill leftovers."""
    started: list[ManagedProcess] = []

    def start(*args: str, env: dict[str, str] | None = None) -> ManagedProcess:
        full_env = {
            **os.environ,
            "DATABASE_URL": test_database_url(),
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        proc = ManagedProcess(
            list(args), full_env, tmp_path / f"proc-{len(started)}-{args[0]}.log"
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.popen.poll() is None:
            proc.popen.send_signal(signal.SIGKILL)
        proc.kill()


@pytest.fixture
def run_worker(transactional_db: None) -> Callable[..., Any]:
    """Run an in-process ``Worker`` (burst and a 0.1 s poll by default) in a thread
    until it returns; stop it and fail if it is still running after ``timeout`` s.
    Returns the worker, so tests can read ``worker.stats``."""
    from django_pgqueue.worker import Worker

    def run(*, timeout: float = 30.0, **options: Any) -> Worker:
        options.setdefault("burst", True)
        options.setdefault("poll_interval", 0.1)
        worker = Worker(**options)
        errors: list[BaseException] = []

        def target() -> None:
            try:
                worker.run()
            except BaseException as exc:  # re-raised in the test thread
                errors.append(exc)

        thread = threading.Thread(target=target, name="test-worker")
        thread.start()
        thread.join(timeout)
        if thread.is_alive():
            worker.stop()
            thread.join(10)
            raise AssertionError(f"worker still running after {timeout}s")
        if errors:
            raise errors[0]
        return worker

    return run


@pytest.fixture
def staff(django_user_model: Any) -> Callable[..., Client]:
    """A logged-in staff client holding exactly the given permissions of the app
    (``staff("view_job", "cancel_job")``); ``is_staff=False`` for a user who is not."""

    def make(*codenames: str, is_staff: bool = True) -> Client:
        user = django_user_model.objects.create_user(
            username=f"op{django_user_model.objects.count()}", password="pw", is_staff=is_staff
        )
        for codename in codenames:
            user.user_permissions.add(
                Permission.objects.get(content_type__app_label="django_pgqueue", codename=codename)
            )
        client = Client()
        client.force_login(user)
        return client

    return make
