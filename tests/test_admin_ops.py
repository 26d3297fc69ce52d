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
