"""The workers table: real worker processes register, are refreshed by their heartbeat,
leave at a clean exit, show as lost when killed, and are pruned by the sweeper."""

from __future__ import annotations

import datetime as dt
import os
import signal
import threading

import pytest
from django.db import OperationalError, connection
from django.test import override_settings
from django.urls import reverse

from django_pgqueue import monitoring, sql
from django_pgqueue.models import Job, WorkerProcess
from django_pgqueue.sweeper import Sweeper, prune_lost_workers
from django_pgqueue.worker import Worker, presence
from django_pgqueue.worker.state import WorkerState
from tests.conftest import wait_for
from tests.tasks import GATES, STARTED, gated, sleep_after_marking

pytestmark = [pytest.mark.django_db(transaction=True)]

WORKER = ("pgqueue_worker", "--poll-interval", "0.1", "--lease-seconds", "1")


def row(worker_id: str) -> monitoring.WorkerInfo | None:
    return next((w for w in monitoring.workers() if w.id == worker_id), None)


def test_workers_table__name_agrees_with_sql():
    assert WorkerProcess._meta.db_table == "pgqueue_worker"
    for name in ("WORKER_DELETE", "WORKER_GET_ALL", "WORKER_REGISTER", "WORKER_TOUCH"):
        assert "pgqueue_worker" in getattr(sql, name)


@pytest.mark.slow
def test_presence__worker_appears_is_refreshed_and_leaves_on_sigterm(
    job_factory, manage, tmp_path
):
    marker = tmp_path / "started"
    job = job_factory(task=sleep_after_marking, args=[str(marker), 3])
    proc = manage(
        *WORKER,
        "--worker-id",
        "seen-1",
        "--queue",
        "default",
        "--queue",
        "b",
        "--concurrency",
        "2",
    )
    first = wait_for(lambda: row("seen-1"), timeout=20)
    assert (first.pid, first.queues, first.concurrency, first.lost) == (
        proc.pid,
        ["b", "default"],
        2,
        False,
    )
    assert first.hostname == os.uname().nodename
    assert first.version == presence.package_version()
    assert first.started_at <= first.last_seen_at
    # The heartbeat refreshes the row and reports the job it holds.
    wait_for(marker.exists, timeout=20)
    refreshed = wait_for(
        lambda: (
            (r := row("seen-1")) and r.last_seen_at > first.last_seen_at and r.jobs_held == 1 and r
        ),
        timeout=10,
    )
    assert refreshed.started_at == first.started_at
    proc.signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0, proc.output()
    assert Job.objects.get(pk=job.pk).status == "done"
    assert row("seen-1") is None


@pytest.mark.slow
def test_presence__killed_worker_is_shown_lost_then_pruned_by_the_sweeper(manage):
    proc = manage(*WORKER, "--worker-id", "doomed-1")
    wait_for(lambda: row("doomed-1"), timeout=20)
    proc.signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    # Not seen for longer than its 1 s lease: lost, but still listed.
    lost = wait_for(lambda: (r := row("doomed-1")) and r.lost and r, timeout=10)
    assert lost.state == "lost"
    assert Sweeper().run_once().lost_workers == 0  # kept for LOST_WORKER_SECONDS
    with override_settings(PGQUEUE_LOST_WORKER_SECONDS=0):
        assert Sweeper().run_once().lost_workers == 1
    assert row("doomed-1") is None


def test_presence__a_pruned_row_is_registered_again_at_the_next_beat():
    state = WorkerState(alias="default", worker_id="back-1", lease_seconds=30)
    presence.register("default", "back-1", queues=None, concurrency=3, lease_seconds=30)
    try:
        started = row("back-1").started_at
        WorkerProcess.objects.filter(id="back-1").delete()  # as the sweeper would
        state.stats.count("done")
        presence.touch(state)
        again = row("back-1")
        assert (again.concurrency, again.queues, again.jobs_done) == (3, None, 1)
        assert again.started_at >= started
    finally:
        presence.unregister("back-1")
    assert row("back-1") is None


def test_presence__restart_with_the_same_id_takes_the_row_over():
    long_ago = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
    presence.register("default", "same-1", queues=["a"], concurrency=1, lease_seconds=1)
    WorkerProcess.objects.filter(id="same-1").update(started_at=long_ago, last_seen_at=long_ago)
    presence.register("default", "same-1", queues=["b"], concurrency=4, lease_seconds=5)
    try:
        again = row("same-1")
        assert (again.queues, again.concurrency, again.lease_seconds) == (["b"], 4, 5)
        assert again.started_at > long_ago and not again.lost
    finally:
        presence.unregister("same-1")


def test_prune_lost_workers__keeps_lost_rows_for_the_configured_time(now):
    presence.register("default", "old-1", queues=None, concurrency=1, lease_seconds=10)
    try:
        WorkerProcess.objects.filter(id="old-1").update(last_seen_at=now)
        with override_settings(PGQUEUE_LOST_WORKER_SECONDS=60):
            # 10 s lease + 60 s: one second short is kept, one second past is deleted.
            assert prune_lost_workers("default", now=now + dt.timedelta(seconds=69)) == 0
            assert prune_lost_workers("default", now=now + dt.timedelta(seconds=71)) == 1
    finally:
        presence.unregister("old-1")


def test_job_list__links_a_running_job_to_its_worker(admin_client, job_factory):
    presence.register("default", "host:1:abc", queues=None, concurrency=1, lease_seconds=30)
    try:
        job_factory()
        Job.objects.claim("host:1:abc", limit=1)
        page = admin_client.get(reverse("admin:django_pgqueue_job_changelist"))
        url = reverse("admin:django_pgqueue_workerprocess_change", args=["host_3A1_3Aabc"])
        assert f'<a href="{url}">host:1:abc</a>' in page.content.decode()
        detail = admin_client.get(url)
        assert detail.status_code == 200
        assert "live" in detail.content.decode()
        workers = admin_client.get(reverse("admin:django_pgqueue_workerprocess_changelist"))
        assert "host:1:abc" in workers.content.decode()
    finally:
        presence.unregister("host:1:abc")


def cut_every_other_connection() -> None:
    """Terminate every backend of this database but the test's own (a worker's)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname ="
            " current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
        )


def test_presence__figures_follow_within_seconds_not_a_third_of_a_lease(job_factory, monkeypatch):
    """Reliability III #21: the row's figures lagged up to a third of a lease (held 0
    beside a running job); a worker that started while the database was down was not
    listed until its first lease extension; and an idle worker whose heartbeat
    connection was cut never wrote its row again (shown lost). With a 60 s lease (a
    lease extension every 20 s), each shows within seconds."""
    register = presence._register

    def down_at_start(reg, state, *, restart, take_over=False):  # type: ignore[no-untyped-def]
        if restart:
            raise OperationalError("connection refused (the server is starting)")
        return register(reg, state, restart=restart, take_over=take_over)

    monkeypatch.setattr(presence, "_register", down_at_start)
    name = f"figures-{os.getpid()}"
    job_factory(task=gated, args=[name])
    worker = Worker(worker_id="figures-1", lease_seconds=60, poll_interval=0.1)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_for(STARTED[name, 1].is_set, timeout=10)
        held = wait_for(lambda: (r := row("figures-1")) and r.jobs_held == 1 and r, timeout=8)
        assert not held.lost
        GATES[name, 1].set()
        finished = (0, 1)  # held, done
        wait_for(
            lambda: (r := row("figures-1")) and (r.jobs_held, r.jobs_done) == finished, timeout=8
        )
        cut_every_other_connection()
        job_factory(task=gated, args=[name + "-after"])
        wait_for(STARTED[name + "-after", 1].is_set, timeout=10)
        wait_for(lambda: (r := row("figures-1")) and r.jobs_held == 1, timeout=8)
    finally:
        GATES[name, 1].set()
        GATES[name + "-after", 1].set()
        worker.stop()
        thread.join(30)
    assert not thread.is_alive()
