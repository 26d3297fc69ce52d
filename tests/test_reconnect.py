"""``reconnect.Retry``: the one pacing helper of every database retry loop. A wait
ends early once a server found down takes connections again; an error with the server
up waits out its backoff; a deadline bounds the retrying."""

from __future__ import annotations

import socket
import threading
import time

from django_pgqueue.reconnect import Retry, server_reachable, socket_targets
from tests.conftest import wait_for


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_socket_targets__tcp_hosts_unix_directories_and_port_lists():
    assert socket_targets({"host": "db1,/run/pg", "port": "6432,5433"}) == [
        (socket.AF_UNSPEC, ("db1", 6432)),
        (socket.AF_UNIX, "/run/pg/.s.PGSQL.5433"),
    ]
    assert socket_targets({"host": "db", "hostaddr": "10.0.0.1", "port": 5432}) == [
        (socket.AF_UNSPEC, ("10.0.0.1", 5432))
    ]
    assert socket_targets({"host": "db"}) == [(socket.AF_UNSPEC, ("db", 5432))]
    assert socket_targets({"host": ""}) == []  # libpq's default socket: not probed
    assert socket_targets({"conninfo": "postgresql://u@db2:6543/x"}) == [
        (socket.AF_UNSPEC, ("db2", 6543))
    ]


def test_server_reachable__none_without_targets():
    assert server_reachable([]) is None
    assert server_reachable([(socket.AF_UNSPEC, ("127.0.0.1", free_port()))]) is False


def test_retry__wait_ends_soon_after_a_server_found_down_comes_back():
    port = free_port()
    retry = Retry(stop=threading.Event(), params={"host": "127.0.0.1", "port": port})
    for _ in range(6):
        delay = retry.failed()
    assert delay > 10  # without the probe, the next attempt would be this far off
    done: list[float] = []
    thread = threading.Thread(target=lambda: done.append(retry.wait() and time.monotonic()))
    thread.start()
    wait_for(lambda: retry._seen_down, timeout=10)  # a probe found the server down
    with socket.socket() as server:
        server.bind(("127.0.0.1", port))
        server.listen()
        back = time.monotonic()
        thread.join(10)
    assert done and done[0] - back < 1.0


def test_retry__error_with_the_server_up_waits_out_the_backoff():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        retry = Retry(
            stop=threading.Event(),
            params=dict(zip(("host", "port"), server.getsockname(), strict=True)),
        )
        retry.failed()
        retry.failed()  # about 1 s
        began = time.monotonic()
        assert retry.wait()
        assert time.monotonic() - began >= 0.75


def test_retry__deadline_bounds_the_wait_and_expires():
    retry = Retry(stop=threading.Event(), params={"host": ""}, deadline=0.3)
    for _ in range(5):
        retry.failed()
    assert not retry.expired()
    began = time.monotonic()
    retry.wait()
    assert time.monotonic() - began < 1.0
    assert retry.expired()
    retry.succeeded()
    assert not retry.expired() and retry.failures == 0


def test_retry__stop_ends_the_wait():
    stop = threading.Event()
    retry = Retry(stop=stop, params={"host": ""})
    for _ in range(6):
        retry.failed()
    threading.Timer(0.2, stop.set).start()
    began = time.monotonic()
    assert retry.wait() is False
    assert time.monotonic() - began < 2.0
