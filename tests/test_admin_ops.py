"""Operating from the admin (issue 32): tags shown and filtered by, the search box
(id, task path, idempotency key, tag, argument values), bulk actions on the job list."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape

from django_pgqueue.models import Job, ScheduleDefinition
from django_pgqueue.monitoring import ColumnStats

JOB_LIST = "admin:django_pgqueue_job_changelist"
DEAD_LIST = "admin:django_pgqueue_deadletter_changelist"
ADD = "testproject.demo.tasks.add"

pytestmark = pytest.mark.django_db


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


def test_search__finds_running_jobs_which_the_search_indexes_leave_out(admin_client, searchable):
    """The tag, argument and task indexes hold no running job (a claim adds no entry
    to them); the search asks for running jobs apart, so it still finds them."""
    j = {name: job.pk for name, job in searchable.items()}
    Job.objects.filter(pk__in=[j["tagged"], j["arg"], j["kwarg"], j["other_task"]]).update(
        status="running", lease_owner="w", lease_expires_at=timezone.now()
    )
    assert found(admin_client, "customer:42") == [j["tagged"]]
    assert found(admin_client, "[424242]") == [j["arg"]]
    assert found(admin_client, "customer_id=77") == [j["kwarg"]]
    assert found(admin_client, "tests.tasks") == [j["other_task"]]


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
    served = {
        "customer:42": "pgqueue_job_tags_search_idx",
        "[424242]": "pgqueue_job_args_search_idx",
        "customer_id=77": "pgqueue_job_kwargs_search_idx",
        "order-17": "pgqueue_job_key_search_idx",
        "tests.tasks": "pgqueue_job_task_search_idx",
    }
    for term, index in served.items():
        query = Job.objects.filter(search.search_q(term, using="default")).order_by("-id")[:50]
        plan = query.explain()
        assert "Seq Scan" not in plan, (term, plan)
        # The term's own index, and the lease index for the running jobs it leaves out
        # (not a walk of the primary key filtering every row: the shape that the planner
        # takes when it cannot prove the partial indexes serve the search).
        assert index in plan, (term, plan)
        assert "pgqueue_job_lease_idx" in plan, (term, plan)


# --- bulk actions -------------------------------------------------------------------------


def post_action(client: Client, action: str, ids: list[int] | None, *, confirm: bool, **query):
    data: dict[str, Any] = {"action": action, "index": "0"}
    if ids is None:
        data["select_across"] = "1"
        data["_selected_action"] = ["0"]  # the page's checkboxes; select_across decides
    else:
        data["select_across"] = "0"
        data["_selected_action"] = [str(i) for i in ids]
    if confirm:
        data["post"] = "yes"
    url = reverse(JOB_LIST)
    if query:
        url += "?" + "&".join(f"{k}={v}" for k, v in query.items())
    return client.post(url, data)


def statuses(*jobs: Job) -> list[str]:
    by_id = dict(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("pk", "status"))
    return [by_id.get(j.pk, "gone") for j in jobs]


@pytest.fixture
def mixed():
    """One job in each state a bulk action sorts out."""
    import datetime as dt

    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    jobs = {name: Job.objects.enqueue(ADD, [1]) for name in ("pending", "dead", "done")}
    jobs["scheduled"] = Job.objects.enqueue(ADD, [1], run_at=later)
    jobs["cancelled"] = Job.objects.enqueue(ADD, [1])
    Job.objects.filter(pk=jobs["dead"].pk).update(status="dead", attempts=3, finished_at=later)
    Job.objects.filter(pk=jobs["done"].pk).update(status="done", attempts=1, finished_at=later)
    Job.objects.cancel([jobs["cancelled"].pk])
    return jobs


def test_retry_now__confirms_with_counts_then_moves_dead_and_scheduled(admin_client, mixed):
    ids = [j.pk for j in mixed.values()]
    page = post_action(admin_client, "retry_now_selected", ids, confirm=False)
    body = page.content.decode()
    assert page.status_code == 200 and "Yes, retry them now" in body
    assert "5 jobs selected" in body and "1 dead" in body and "1 scheduled" in body
    assert statuses(*mixed.values()) == ["pending", "dead", "done", "scheduled", "cancelled"]
    done = post_action(admin_client, "retry_now_selected", ids, confirm=True)
    assert statuses(*mixed.values()) == ["pending", "pending", "done", "pending", "cancelled"]
    assert texts(done) == [
        "Retried 2 jobs now (1 dead, 1 scheduled); skipped 3 of 5 selected (not dead or "
        "scheduled at that instant, or a live job holds the key)."
    ]
    dead = Job.objects.get(pk=mixed["dead"].pk)
    assert dead.attempts == 0


def test_delete_finished__deletes_done_dead_cancelled_only(admin_client, mixed):
    ids = [j.pk for j in mixed.values()]
    page = post_action(admin_client, "delete_finished_selected", ids, confirm=False)
    assert "Yes, delete the finished ones" in page.content.decode()
    assert Job.objects.count() == 5
    done = post_action(admin_client, "delete_finished_selected", ids, confirm=True)
    assert statuses(*mixed.values()) == ["pending", "gone", "gone", "scheduled", "gone"]
    assert texts(done) == [
        "Deleted 3 finished jobs; skipped 2 of 5 selected (not finished, or a dependant "
        "still needs it)."
    ]


def test_delete_finished__keeps_a_parent_a_dependant_still_needs(admin_client):
    from django_pgqueue.models import JobDependency

    parent = Job.objects.enqueue(ADD, [1])
    child = Job.objects.enqueue(ADD, [2], depends_on=[parent])
    Job.objects.filter(pk=parent.pk).update(status="done", finished_at="2030-01-01T00:00Z")
    assert JobDependency.objects.filter(job_id=child.pk, repair=True, state=None).exists()
    post_action(admin_client, "delete_finished_selected", [parent.pk], confirm=True)
    assert statuses(parent) == ["done"]


@pytest.mark.parametrize(
    "action", ["retry_now_selected", "cancel_selected", "delete_finished_selected"]
)
def test_bulk_actions__staff_without_the_permission_get_403_and_nothing_changes(
    staff, mixed, action
):
    before = statuses(*mixed.values())
    viewer = staff("view_job")
    ids = [j.pk for j in mixed.values()]
    for confirm in (False, True):
        assert post_action(viewer, action, ids, confirm=confirm).status_code == 403
        assert post_action(viewer, action, None, confirm=confirm).status_code == 403
    assert statuses(*mixed.values()) == before
    assert Job.objects.count() == 5


def test_bulk_actions__each_needs_its_own_permission(staff, mixed):
    retrier = staff("view_job", "requeue_job")
    assert (
        post_action(retrier, "cancel_selected", [mixed["pending"].pk], confirm=True).status_code
        == 403
    )
    done = post_action(retrier, "retry_now_selected", [mixed["dead"].pk], confirm=True)
    assert done.status_code == 302 and statuses(mixed["dead"]) == ["pending"]
    deleter = staff("view_job", "delete_job")
    done = post_action(deleter, "delete_finished_selected", [mixed["done"].pk], confirm=True)
    assert done.status_code == 302 and statuses(mixed["done"]) == ["gone"]


def count_statements(queries: Any, name: str) -> int:
    return sum(f"-- name: {name}\n" in q["sql"] for q in queries.captured_queries)


@pytest.mark.parametrize(
    ("action", "statement", "message"),
    [
        ("cancel_selected", "JOB_CANCEL", "Cancelled 10000 jobs."),
        (
            "retry_now_selected",
            "JOB_RUN_NOW",
            "Retried 10,000 jobs now (0 dead, 10,000 scheduled); skipped 0 of 10,000 "
            "selected (not dead or scheduled at that instant, or a live job holds the key).",
        ),
    ],
)
def test_bulk_actions__10000_selected_across_a_filter_in_bounded_batches(
    admin_client, action, statement, message
):
    import datetime as dt

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_pgqueue.conf import settings

    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    Job.objects.bulk_enqueue({"task": ADD, "args": [i], "run_at": later} for i in range(10_000))
    Job.objects.enqueue(ADD, [1], run_at=later, queue="other")  # outside the filter
    page = post_action(admin_client, action, None, confirm=False, queue="default")
    body = page.content.decode()
    assert "10000 jobs selected: 10000 scheduled." in body
    assert body.count('name="_selected_action"') == 0  # select_across, not 10,000 fields
    with CaptureQueriesContext(connection) as queries:
        done = post_action(admin_client, action, None, confirm=True, queue="default")
    assert texts(done) == [message]
    batches = -(-10_000 // int(settings.SWEEP_BATCH_SIZE))
    assert count_statements(queries, statement) == batches
    assert Job.objects.filter(queue="other", status="scheduled").count() == 1
    assert Job.objects.filter(queue="default", status="scheduled").count() == 0


def test_bulk_actions__select_all_over_the_cap_changes_nothing(admin_client, monkeypatch):
    from django_pgqueue.admin import bulk_actions

    monkeypatch.setattr(bulk_actions, "MAX_SELECTED", 3)
    jobs = [Job.objects.enqueue(ADD, [i]) for i in range(4)]
    done = post_action(admin_client, "cancel_selected", None, confirm=True)
    assert "More than 3 jobs are selected" in texts(done)[0]
    assert statuses(*jobs) == ["pending"] * 4


# --- fuzz ---------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:DateTimeField .* received a naive datetime:RuntimeWarning")
def test_admin_fuzz__new_filters_search_actions_and_schedule_form_answer_no_500(admin_user, mixed):
    from tests.test_admin_fuzz import ODD_VALUES, Fuzz, encode, form

    client = Client(raise_request_exception=True)
    client.force_login(admin_user)
    fuzz = Fuzz(client)
    ids = [str(j.pk) for j in mixed.values()]
    for url in (reverse(JOB_LIST), reverse(DEAD_LIST)):
        for value in ODD_VALUES:
            fuzz.get(url, f"tag={encode(value)}")
            fuzz.get(url, f"q={encode(value)}&tag={encode(value)}")
    valid = {"_selected_action": ids, "index": "0", "select_across": "0"}
    for action in ("retry_now_selected", "cancel_selected", "delete_finished_selected"):
        for key in ("_selected_action", "select_across", "post", "index"):
            for value in ODD_VALUES:
                fields: dict[str, Any] = {**valid, "action": action, key: value}
                fuzz.post(reverse(JOB_LIST), form(**fields))
                fuzz.post(reverse(JOB_LIST) + f"?tag={encode(value)}", form(**fields))
    add = reverse("admin:django_pgqueue_scheduledefinition_add")
    good = {
        "name": "fuzz",
        "task": "tests.tasks.record_tick",
        "cron": "* * * * *",
        "timezone": "UTC",
        "args": "[]",
        "kwargs": "{}",
        "queue": "",
        "priority": "",
        "enabled": "on",
        "unique_for": "",
    }
    for key in good:
        for value in ODD_VALUES:
            fuzz.post(add, form(**{**good, key: value}))
            ScheduleDefinition.objects.all().delete()
    assert fuzz.requests > 1000
    assert not fuzz.failures, "\n".join(fuzz.failures[:40])


# --- timeline -----------------------------------------------------------------------------


def test_job_page__timeline_lists_enqueue_attempts_snoozes_and_end_in_order(admin_client):
    job = Job.objects.enqueue(ADD, [1], idempotency_key="order-9", tags=["customer:9"])
    Job.objects.filter(pk=job.pk).update(
        status="dead",
        attempts=2,
        snoozes=1,
        lease_owner="host:1:w",
        last_attempted_at="2030-01-01T00:02:00Z",
        finished_at="2030-01-01T00:03:00Z",
        errors=[
            {
                "attempt": 1,
                "worker_id": "host:1:w",
                "exception_class_path": "builtins.ValueError",
                "traceback": 'Traceback (most recent call last):\n  File "t.py", line 1\n'
                "ValueError: <b>first</b>\n",
                "at": "2030-01-01T00:01:00+00:00",
            },
            {
                "attempt": 2,
                "worker_id": "host:1:w",
                "exception_class_path": "builtins.KeyError",
                "traceback": "KeyError: 'x'\n",
                "at": "2030-01-01T00:02:30+00:00",
            },
        ],
    )
    page = admin_client.get(reverse("admin:django_pgqueue_job_change", args=[job.pk]))
    body = page.content.decode()
    assert page.status_code == 200
    timeline = body[body.index('<ol class="pgqueue-timeline">') :]
    timeline = timeline[: timeline.index("</ol>")]
    order = [
        "enqueued to queue default, priority 0, key order-9, tags customer:9",
        "attempt 1 on host:1:w ended: builtins.ValueError: ValueError: &lt;b&gt;first&lt;/b&gt;",
        "attempt 2 of",
        "attempt 2 on host:1:w ended: builtins.KeyError",
        "ended dead",
        "snoozed 1 time",
    ]
    positions = [timeline.index(text) for text in order]
    assert positions == sorted(positions), timeline
    assert "<b>first</b>" not in timeline
