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


def test_metrics__a_staff_session_needs_the_view_job_permission(django_user_model):
    """Issue 28 item 11: any staff user read the figures; the dashboard's gate is view_job."""
    from django.contrib.auth.models import Permission

    user = django_user_model.objects.create_user("s", "s@example.com", "pw", is_staff=True)
    staff = Client()
    staff.force_login(user)
    assert staff.get(URL).status_code == 403
    user.user_permissions.add(Permission.objects.get(codename="view_job"))
    viewer = Client()
    viewer.force_login(user)
    assert viewer.get(URL).status_code == 200


def test_metrics__no_token_configured_means_staff_only(client, admin_client):
    assert client.get(URL, HTTP_AUTHORIZATION="Bearer ").status_code == 403
    assert client.get(URL, HTTP_AUTHORIZATION="Bearer anything").status_code == 403
    response = admin_client.get(URL)
    assert response.status_code == 200
    assert "pgqueue_workers" in response.content.decode()


def scrape(client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get(URL, HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    return samples(response.content.decode())


def by_queue(got: dict, name: str) -> dict[str, float]:
    return {dict(labels)["queue"]: v for (n, labels), v in got.items() if n == name}


@override_settings(PGQUEUE_METRICS_TOKEN=TOKEN, PGQUEUE_METRICS_MAX_QUEUES=2)
def test_metrics__queues_beyond_the_cap_are_summed_under_other(client):
    """Every queue used to get its own series: 10,000 queues, 80,903 series."""
    old = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=10)
    jobs = [("a", 5), ("b", 4), ("c", 3), ("d", 2), ("_other", 1)]
    Job.objects.bulk_enqueue(
        {"task": "testproject.demo.tasks.add", "args": [1, 2], "queue": queue, "run_at": old}
        for queue, n in jobs
        for _ in range(n)
    )
    got = scrape(client)
    assert by_queue(got, "pgqueue_jobs_pending") == {"a": 5, "b": 4, "_other": 6}
    assert set(by_queue(got, "pgqueue_oldest_pending_age_seconds")) == {"a", "b", "_other"}
    assert by_queue(got, "pgqueue_oldest_pending_age_seconds")["_other"] >= 600
    assert got[("pgqueue_queues_other", ())] == 3


@override_settings(PGQUEUE_METRICS_TOKEN=TOKEN)
def test_metrics__series_stay_bounded_with_many_queues(client):
    from django_pgqueue.conf import settings

    limit = settings.METRICS_MAX_QUEUES
    queues = limit + 50
    Job.objects.bulk_enqueue(
        {"task": "testproject.demo.tasks.add", "args": [1, 2], "queue": f"q{i:04d}"}
        for i in range(queues)
    )
    got = scrape(client)
    pending = by_queue(got, "pgqueue_jobs_pending")
    assert len(pending) == limit + 1 and "_other" in pending
    assert sum(pending.values()) == queues
    assert got[("pgqueue_queues_other", ())] == 50
    per_queue = [labels for (_, labels) in got if "queue" in dict(labels)]
    assert len({dict(labels)["queue"] for labels in per_queue}) == limit + 1


def test_metrics_max_queues__out_of_range_is_a_check_error():
    from django.core import checks

    with override_settings(PGQUEUE_METRICS_MAX_QUEUES=-1):
        ids = [m.id for m in checks.run_checks(tags=["pgqueue"])]
    assert "pgqueue.E024" in ids


@override_settings(PGQUEUE_METRICS_TOKEN=TOKEN)
def test_metrics__recent_cancellations_per_queue(client, job_factory):
    jobs = [job_factory(queue="mail") for _ in range(3)]
    Job.objects.cancel([j.pk for j in jobs[:2]])
    got = scrape(client)
    assert by_queue(got, "pgqueue_jobs_cancelled_recent") == {"mail": 2}
    assert by_queue(got, "pgqueue_jobs_pending") == {"mail": 1}
