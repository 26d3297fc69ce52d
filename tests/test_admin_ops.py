"""Operating from the admin (issue 32): tags shown and filtered by, the search box
(id, task path, idempotency key, tag, argument values), bulk actions on the job list."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse
from django.utils.html import escape

from django_pgqueue.models import Job
from django_pgqueue.monitoring import ColumnStats

JOB_LIST = "admin:django_pgqueue_job_changelist"
DEAD_LIST = "admin:django_pgqueue_deadletter_changelist"
ADD = "testproject.demo.tasks.add"

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(django_user_model: Any):
    """A logged-in staff client holding exactly the given permissions."""

    def make(*codenames: str) -> Client:
        user = django_user_model.objects.create_user(
            username=f"op{django_user_model.objects.count()}", password="pw", is_staff=True
        )
        for codename in codenames:
            user.user_permissions.add(
                Permission.objects.get(content_type__app_label="django_pgqueue", codename=codename)
            )
        client = Client()
        client.force_login(user)
        return client

    return make


def texts(response: Any) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def listed(response: Any) -> list[int]:
    return sorted(obj.pk for obj in response.context["cl"].result_list)


# --- tags ---------------------------------------------------------------------------------


def test_job_list__shows_tags_and_filters_by_one(admin_client):
    a = Job.objects.enqueue(ADD, [1], tags=["customer:42", "import"])
    b = Job.objects.enqueue(ADD, [2], tags=["customer:43"])
    Job.objects.enqueue(ADD, [3])
    page = admin_client.get(reverse(JOB_LIST))
    body = page.content.decode()
    assert '<a class="pgqueue-tag" href="?tag=customer:42">customer:42</a>' in body
    assert "?tag=customer%3A43" in body or "?tag=customer:43" in body  # the filter's choice
    assert listed(admin_client.get(reverse(JOB_LIST), {"tag": "customer:42"})) == [a.pk]
    assert listed(admin_client.get(reverse(JOB_LIST), {"tag": "customer:43"})) == [b.pk]


@pytest.mark.parametrize("value", ["no such", "x" * 300, "<script>", "'", "{}", "a,b"])
def test_tag_filter__a_value_that_is_no_tag_lists_nothing_and_no_500(admin_client, value):
    Job.objects.enqueue(ADD, [1], tags=["a"])
    page = admin_client.get(reverse(JOB_LIST), {"tag": value})
    assert page.status_code == 200
    assert listed(page) == []


def test_dead_letters__show_tags_and_filter_by_one(admin_client):
    a = Job.objects.enqueue(ADD, [1], tags=["customer:42"])
    b = Job.objects.enqueue(ADD, [2], tags=["other"])
    Job.objects.filter(pk__in=[a.pk, b.pk]).update(status="dead", attempts=1)
    page = admin_client.get(reverse(DEAD_LIST), {"tag": "customer:42"})
    assert listed(page) == [a.pk]
    assert escape("customer:42") in page.content.decode()


def test_job_detail__shows_tags(admin_client):
    job = Job.objects.enqueue(ADD, [1], tags=["customer:42"])
    page = admin_client.get(reverse("admin:django_pgqueue_job_change", args=[job.pk]))
    assert "customer:42" in page.content.decode()


# --- search -------------------------------------------------------------------------------


@pytest.fixture
def searchable():
    """Jobs that differ in each thing the search box finds."""
    return {
        "plain": Job.objects.enqueue(ADD, [1, 2]),
        "keyed": Job.objects.enqueue(ADD, [3, 4], idempotency_key="order-17"),
        "tagged": Job.objects.enqueue(ADD, [5, 6], tags=["customer:42"]),
        "arg": Job.objects.enqueue(ADD, [424242, "eu"]),
        "kwarg": Job.objects.enqueue(
            "testproject.demo.tasks.add", [], {"customer_id": 77, "region": "eu-west"}
        ),
        "other_task": Job.objects.enqueue("tests.tasks.tagged", [9]),
    }


def found(client: Client, term: str) -> list[int]:
    page = client.get(reverse(JOB_LIST), {"q": term})
    assert page.status_code == 200
    return listed(page)


def test_search__finds_by_id_task_key_tag_and_argument_values(admin_client, searchable):
    j = {name: job.pk for name, job in searchable.items()}
    assert found(admin_client, str(j["keyed"])) == [j["keyed"]]
    assert found(admin_client, "order-17") == [j["keyed"]]
    assert found(admin_client, "customer:42") == [j["tagged"]]
    assert found(admin_client, "[424242]") == [j["arg"]]  # a positional number
    assert found(admin_client, "424242") == []  # a bare number is a job id only
    assert found(admin_client, "eu") == [j["arg"]]  # a positional string
    assert found(admin_client, "customer_id=77") == [j["kwarg"]]
    assert found(admin_client, "region=eu-west") == [j["kwarg"]]
    assert found(admin_client, '{"customer_id": 77}') == [j["kwarg"]]
    assert found(admin_client, '[424242, "eu"]') == [j["arg"]]
    assert found(admin_client, "tests.tasks.tagged") == [j["other_task"]]  # whole path
    assert found(admin_client, "tests.tasks") == [j["other_task"]]  # its beginning
    assert found(admin_client, "customer_id=78") == []


def test_search__part_of_a_path_only_on_a_small_table(admin_client, searchable, monkeypatch):
    from django_pgqueue.admin import search

    assert found(admin_client, "tasks.tagged") == [searchable["other_task"].pk]
    big = ColumnStats(total=10**8, bytes=10**12, freqs={})
    monkeypatch.setattr(search, "column_stats", lambda using, column: big)
    assert found(admin_client, "tasks.tagged") == []
    assert found(admin_client, "customer:42") == [searchable["tagged"].pk]  # indexed still


def test_search__a_search_out_of_time_lists_nothing_and_says_so(
    admin_client, searchable, monkeypatch
):
    from django_pgqueue.admin import search

    monkeypatch.setattr(search, "SEARCH_SECONDS", 1e-9)
    page = admin_client.get(reverse(JOB_LIST), {"q": "customer:42"})
    assert page.status_code == 200
    assert listed(page) == []
    assert any("The search was stopped after" in text for text in texts(page))


@pytest.mark.parametrize(
    "term",
    [
        "[" * 3000,
        '{"a": "\\u0000"}',
        '["\\ud800"]',
        "x=" + "[" * 1500,
        "a=\\u0000",
        "9" * 5000,
        "=",
        "a=",
        '{"a": 1e999}',
        "[" * 600 + "]" * 600,
        "'; DROP TABLE pgqueue_job; --",
    ],
)
def test_search__odd_terms_never_500(admin_client, searchable, term):
    page = admin_client.get(reverse(JOB_LIST), {"q": term})
    assert page.status_code == 200
    page = admin_client.get(reverse(DEAD_LIST), {"q": term})
    assert page.status_code == 200


def test_search__uses_the_indexes_no_table_scan(searchable, monkeypatch):
    from django_pgqueue.admin import search

    big = ColumnStats(total=10**8, bytes=10**12, freqs={})
    monkeypatch.setattr(search, "column_stats", lambda using, column: big)

    Job.objects.bulk_enqueue({"task": ADD, "args": [i]} for i in range(3000))
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE pgqueue_job")
        # A plan without a scan of the table exists only if every branch of the OR has
        # an index (a small table's best plan is a scan: bench/search.py measures a big one).
        cursor.execute("SET LOCAL enable_seqscan = off")
    for term in ("customer:42", "[424242]", "customer_id=77", "order-17", "tests.tasks"):
        query = Job.objects.filter(search.search_q(term, using="default")).order_by("-id")[:50]
        plan = query.explain()
        assert "Seq Scan" not in plan, (term, plan)
