"""The Prometheus view: protected (token or staff), and its text parses back with
prometheus-client's own parser into the queue's figures."""

from __future__ import annotations

import datetime as dt

import pytest
from django.test import Client, override_settings
from prometheus_client.parser import text_string_to_metric_families

from django_pgqueue.models import Job
from django_pgqueue.worker import presence
from django_pgqueue.worker.state import WorkerState

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/metrics/pgqueue"
TOKEN = "s3cret-scrape-token"


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@pytest.fixture
def queue_state(job_factory):
    for _ in range(3):
        job_factory(queue="mail")
    job_factory(queue="web", run_at=dt.datetime(2100, 1, 1, tzinfo=dt.UTC))
    dead = job_factory(queue="web")
    Job.objects.filter(pk=dead.pk).update(status="dead")
    state = WorkerState(alias="default", worker_id="w-1", lease_seconds=30)
    presence.register("default", "w-1", queues=None, concurrency=2, lease_seconds=30)
    for _ in range(7):
        state.stats.count("done")
    state.stats.count("failed")
    presence.touch(state)
    yield
    presence.unregister("w-1")


@override_settings(PGQUEUE_METRICS_TOKEN=TOKEN)
def test_metrics__bearer_token_gets_parseable_metrics(client, queue_state):
    response = client.get(URL, HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    text = response.content.decode()
    got = samples(text)
    assert got[("pgqueue_jobs_pending", (("queue", "mail"),))] == 3
    assert got[("pgqueue_jobs_scheduled", (("queue", "web"),))] == 1
    assert got[("pgqueue_jobs_dead", (("queue", "web"),))] == 1
    assert got[("pgqueue_oldest_pending_age_seconds", (("queue", "mail"),))] >= 0
    assert got[("pgqueue_workers", (("state", "live"),))] == 1
    assert got[("pgqueue_jobs_finished_total", (("worker", "w-1"),))] == 7
    assert got[("pgqueue_jobs_failed_total", (("worker", "w-1"),))] == 1
    families = {f.name: f.type for f in text_string_to_metric_families(text)}
    assert families["pgqueue_jobs_finished"] == "counter"
    assert families["pgqueue_jobs_pending"] == "gauge"
    assert all(name.startswith("pgqueue_") for name in families)


@override_settings(PGQUEUE_METRICS_TOKEN=TOKEN)
def test_metrics__refuses_without_the_right_credentials(client, django_user_model):
    assert client.get(URL).status_code == 401
    assert client.get(URL)["WWW-Authenticate"].startswith("Bearer")
    assert client.get(URL, HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
    assert client.get(URL, HTTP_AUTHORIZATION=f"Basic {TOKEN}").status_code == 403
    user = django_user_model.objects.create_user("u", "u@example.com", "pw")
    plain = Client()
    plain.force_login(user)
    assert plain.get(URL).status_code == 403


def test_metrics__no_token_configured_means_staff_only(client, admin_client):
    assert client.get(URL, HTTP_AUTHORIZATION="Bearer ").status_code == 403
    assert client.get(URL, HTTP_AUTHORIZATION="Bearer anything").status_code == 403
    response = admin_client.get(URL)
    assert response.status_code == 200
    assert "pgqueue_workers" in response.content.decode()
