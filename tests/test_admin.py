"""The admin: dead letters (list, detail, requeue, discard), the read-only job list with
its summary, permissions, CSRF, escaping, and the no-COUNT(*) paginator."""

from __future__ import annotations

import datetime as dt
import html
import json
import logging
import re
import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.admin.utils import quote as admin_quote
from django.contrib.messages import get_messages
from django.db import connection, connections
from django.db.models import F
from django.db.models.functions import Now
from django.http import QueryDict
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils.html import escape

from django_pgqueue import sql
from django_pgqueue.admin.base import error_line, human_duration
from django_pgqueue.admin.dead_letters import CHANGE_FORM_ACTIONS
from django_pgqueue.admin.paginator import EstimatedCountPaginator
from django_pgqueue.conf import settings
from django_pgqueue.models import DeadLetter, Job, Schedule, WorkerProcess
from django_pgqueue.monitoring import common_values, queue_summary
from tests.conftest import wait_for

DEAD_LIST = "admin:django_pgqueue_deadletter_changelist"
JOB_LIST = "admin:django_pgqueue_job_changelist"
XSS = "<script>alert(1)</script>"
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "tasks.py", line 3, in add\n'
    "    raise ValueError(message)\n"
    "ValueError: boom at step 3\n"
    "second line of the message\n"
)


def error(traceback: str = TRACEBACK, attempt: int = 3) -> dict[str, Any]:
    return {
        "exception_class_path": "builtins.ValueError",
        "traceback": traceback,
        "worker_id": "host:42:abc123",
        "attempt": attempt,
    }


@pytest.fixture
def dead_factory(job_factory: Callable[..., Job]) -> Callable[..., Job]:
    """A job that used up its attempts, as JOB_FAIL leaves it (lease owner kept)."""

    def make(*, errors: list[Any] | None = None, **overrides: Any) -> Job:
        overrides.setdefault("max_attempts", 3)
        job = job_factory(**overrides)
        Job.objects.filter(pk=job.pk).update(
            status="dead",
            attempts=F("max_attempts"),
            lease_owner="host:42:abc123",
            started_at=Now(),
            last_attempted_at=Now(),
            finished_at=Now(),
            errors=[error()] if errors is None else errors,
        )
        return Job.objects.get(pk=job.pk)

    return make


def post_action(client: Client, action: str, ids: list[int], **extra: Any) -> Any:
    data = {
        "action": action,
        "_selected_action": [str(i) for i in ids],
        "index": "0",
        "select_across": "0",
        **extra,
    }
    return client.post(reverse(DEAD_LIST), data)


def texts(response: Any) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def status_of(*jobs: Job) -> list[str]:
    by_id = dict(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("pk", "status"))
    return [by_id.get(j.pk, "gone") for j in jobs]


# --- helpers ------------------------------------------------------------------------------


def test_error_line__takes_the_exception_line_not_the_header():
    assert error_line(TRACEBACK) == "ValueError: boom at step 3"
    assert error_line("RuntimeError: x") == "RuntimeError: x"
    assert error_line(None) == ""
    assert len(error_line("E: " + "x" * 1000)) == 200


def test_human_duration__two_largest_units():
    assert human_duration(dt.timedelta(days=2, hours=3, minutes=4)) == "2 d 3 h"
    assert human_duration(dt.timedelta(seconds=65)) == "1 min 5 s"
    assert human_duration(dt.timedelta(0)) == "0 s"
    assert human_duration(None) == "—"


# --- dead-letter list and detail -------------------------------------------------------


@pytest.mark.django_db
def test_dead_letter_list__shows_only_dead_jobs_with_their_last_error(
    admin_client, dead_factory, job_factory
):
    dead = dead_factory(queue="mail")
    alive = job_factory()
    response = admin_client.get(reverse(DEAD_LIST))
    assert response.status_code == 200
    rows = [obj.pk for obj in response.context["cl"].result_list]
    assert rows == [dead.pk]
    assert alive.pk not in rows
    content = response.content.decode()
    assert "ValueError: boom at step 3" in content
    assert "3/3" in content
    assert "Traceback (most recent call last)" not in content  # the line, not the header


@pytest.mark.django_db
def test_dead_letter_list__filters_by_queue_and_task_and_searches(admin_client, dead_factory):
    a = dead_factory(queue="mail", idempotency_key="order-17")
    b = dead_factory(queue="billing", errors=[error("KeyError: 'customer_id'\n")])
    # Earlier tests' ANALYZE of big tables leaves planner statistics behind (pg_class is
    # updated in place, even when their transaction rolls back); fresh statistics make
    # the filter choices exact here whatever ran before.
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE pgqueue_job")
    url = reverse(DEAD_LIST)

    def ids(**params: str) -> list[int]:
        return [o.pk for o in admin_client.get(url, params).context["cl"].result_list]

    assert ids(queue="mail") == [a.pk]
    assert ids(task="testproject.demo.tasks.add") == [b.pk, a.pk]
    assert ids(q=str(b.pk)) == [b.pk]  # a number is an id
    assert ids(q="order-17") == [a.pk]  # idempotency key
    assert ids(q="customer_id") == [b.pk]  # error text
    assert ids(q="demo.tasks.add") == [b.pk, a.pk]  # part of the task path
    page = admin_client.get(url).content.decode()
    assert "?queue=billing" in page and "?queue=mail" in page  # filter choices


@pytest.mark.django_db
@pytest.mark.parametrize(
    "term",
    ["\u00b2", "\u0661", "9" * 5000, str(2**63), "12\u00b2"],
    ids=["superscript-two", "arabic-one", "5000-digits", "2**63", "digits-and-superscript"],
)
def test_job_list__search_for_a_number_that_is_no_job_id_is_text(admin_client, job_factory, term):
    """SUPERSCRIPT TWO is isdigit() but int() refuses it (a 500); now it is searched as text."""
    job_factory()
    response = admin_client.get(reverse(JOB_LIST), {"q": term})
    assert response.status_code == 200
    assert list(response.context["cl"].result_list) == []


@pytest.mark.django_db
@pytest.mark.parametrize("parameter", ["queue", "task", "status__exact", "q"])
@pytest.mark.parametrize("url", [JOB_LIST, DEAD_LIST])
def test_lists__nul_in_a_filter_drops_the_filters_with_a_message(
    admin_client, dead_factory, url, parameter
):
    """PostgreSQL refuses NUL in text (a DataError, a 500): the admin shows the list
    unfiltered (Django's ?e=1) and says which parameter it ignored."""
    dead_factory(queue="mail")
    response = admin_client.get(reverse(url) + f"?{parameter}=mail%00x", follow=True)
    assert response.status_code == 200
    assert response.redirect_chain == [(reverse(url) + "?e=1", 302)]
    assert f"Ignored the filters: '{parameter}' holds a NUL character" in texts(response)[0]
    assert len(response.context["cl"].result_list) == 1


@pytest.mark.django_db
def test_requeue_action__selection_that_is_no_job_id_is_ignored(admin_client, dead_factory):
    """Django filtered pk__in with the posted values: "x" or 2**63 raised (a 500)."""
    job = dead_factory()
    response = post_action(admin_client, "requeue", ["x", str(2**63), "\u00b2", "9" * 5000])
    assert response.status_code == 302
    assert texts(response) == [
        "Items must be selected in order to perform actions on them. No items have been changed."
    ]
    assert status_of(job) == ["dead"]
    response = post_action(admin_client, "requeue", ["x", str(job.pk)])
    assert any("Requeued 1 dead letter" in text for text in texts(response))
    assert status_of(job) == ["pending"]


@pytest.mark.django_db
def test_dead_letter_detail__empty_to_field_is_no_field(admin_client, dead_factory):
    """Django looked up a field named "" for ?_to_field= (FieldDoesNotExist, a 500)."""
    job = dead_factory()
    url = reverse("admin:django_pgqueue_deadletter_change", args=[job.pk])
    assert admin_client.get(url + "?_to_field=").status_code == 200


@pytest.mark.django_db
def test_dead_letter_detail__is_read_only_and_shows_everything(admin_client, dead_factory):
    job = dead_factory(args=[1, 2], kwargs={}, idempotency_key="k-1")
    response = admin_client.get(reverse("admin:django_pgqueue_deadletter_change", args=[job.pk]))
    assert response.status_code == 200
    content = response.content.decode()
    assert 'name="task"' not in content and 'name="queue"' not in content  # nothing editable
    assert "host:42:abc123" in content  # lease owner of the last attempt
    assert "ValueError: boom at step 3" in content and "raise ValueError(message)" in content
    assert "[\n  1,\n  2\n]" in content  # args pretty-printed
    # The action, on the detail page (Django 6.1 has actions on the change form).
    assert ("Requeue selected dead letters" in content) is CHANGE_FORM_ACTIONS
    assert reverse("admin:django_pgqueue_deadletter_delete", args=[job.pk]) in content


@pytest.mark.django_db
def test_dead_letter_pages__escape_job_data(admin_client, dead_factory):
    job = dead_factory(
        args=[XSS],
        kwargs={"x": '"><svg onload=alert(2)>'},
        idempotency_key=XSS,
        errors=[{**error(f"ValueError: {XSS}\n"), "worker_id": XSS, "exception_class_path": XSS}],
    )
    Job.objects.filter(pk=job.pk).update(task=XSS, lease_owner=XSS)
    for url in (
        reverse(DEAD_LIST),
        reverse("admin:django_pgqueue_deadletter_change", args=[job.pk]),
        reverse("admin:django_pgqueue_job_change", args=[job.pk]),
        reverse(JOB_LIST),
    ):
        content = admin_client.get(url).content.decode()
        assert XSS not in content, url
        assert "<svg onload" not in content, url
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in content, url


# --- requeue ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_requeue_action__resets_attempts_keeps_errors_and_reports_count(
    admin_client, admin_user, dead_factory, caplog
):
    a, b = dead_factory(), dead_factory()
    before = Job.objects.get(pk=a.pk)
    caplog.set_level(logging.INFO, logger="django_pgqueue.admin")
    response = post_action(admin_client, "requeue", [a.pk, b.pk])
    assert response.status_code == 302
    assert texts(response) == [f"Requeued 2 dead letters (job {a.pk}, {b.pk})."]
    a.refresh_from_db()
    assert (a.status, a.attempts, a.lease_owner, a.finished_at) == ("pending", 0, None, None)
    assert a.errors == before.errors  # the previous failure stays visible
    assert a.run_at >= before.finished_at
    assert status_of(b) == ["pending"]
    record = next(r for r in caplog.records if getattr(r, "action", None) == "requeue")
    assert record.user == admin_user.username and record.job_ids == [a.pk, b.pk]
    assert LogEntry.objects.filter(object_id=str(a.pk), user=admin_user).exists()


@pytest.mark.django_db
def test_requeue_action__to_another_queue_with_a_new_priority(admin_client, dead_factory):
    job = dead_factory(queue="mail", priority=0)
    post_action(admin_client, "requeue", [job.pk], requeue_queue="retry", requeue_priority="50")
    job.refresh_from_db()
    assert (job.status, job.queue, job.priority) == ("pending", "retry", 50)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("queue", "priority", "message"),
    [
        ("bad queue!", "", "queue name 'bad queue!' is invalid"),
        ("", "high", "priority must be a whole number"),
        ("", "1000", "priority 1000 is out of range"),
    ],
)
def test_requeue_action__rejects_bad_options_and_changes_nothing(
    admin_client, dead_factory, queue, priority, message
):
    job = dead_factory()
    response = post_action(
        admin_client, "requeue", [job.pk], requeue_queue=queue, requeue_priority=priority
    )
    assert message in texts(response)[0]
    assert status_of(job) == ["dead"]


@pytest.mark.django_db
def test_requeue_action__second_request_on_stale_selection_changes_nothing(
    admin_client, dead_factory
):
    a, b = dead_factory(), dead_factory()
    first = post_action(admin_client, "requeue", [a.pk, b.pk])
    assert texts(first)[0].startswith("Requeued 2 dead letters")
    Job.objects.claim("w1", limit=1)  # one of them is already running again
    second = post_action(admin_client, "requeue", [a.pk, b.pk])  # the same, stale page
    assert texts(second)[-1:] == [
        "Requeued 0 dead letters; 2 of 2 selected not requeued: no longer dead (requeued or "
        "discarded by someone else) or a live job holds the same idempotency key."
    ]
    assert sorted(status_of(a, b)) == ["pending", "running"]
    assert Job.objects.get(status="running").attempts == 1  # not reset by the second click


@pytest.mark.django_db
def test_requeue_dead__skips_a_key_held_by_a_live_job_and_duplicates_in_selection(
    dead_factory, job_factory
):
    held = dead_factory(idempotency_key="order-1")
    live = job_factory(idempotency_key="order-1")
    older, newer = dead_factory(idempotency_key="order-2"), dead_factory(idempotency_key="order-2")
    plain = dead_factory()
    requeued = Job.objects.requeue_dead([held.pk, older.pk, newer.pk, plain.pk])
    assert requeued == [newer.pk, plain.pk]
    assert status_of(held, live, older, newer, plain) == [
        "dead",
        "pending",
        "dead",
        "pending",
        "pending",
    ]


@pytest.mark.django_db(transaction=True)
@pytest.mark.concurrency
def test_requeue_dead__wakes_workers_once_per_queue(dead_factory, other_connection):
    jobs = [dead_factory(queue="mail"), dead_factory(queue="mail"), dead_factory(queue="sms")]
    listener = other_connection(autocommit=True)
    listener.execute("LISTEN " + settings.NOTIFY_CHANNEL)
    assert Job.objects.requeue_dead([j.pk for j in jobs]) == sorted(j.pk for j in jobs)
    payloads = sorted(n.payload for n in listener.notifies(timeout=5, stop_after=2))
    assert payloads == ["mail", "sms"]  # PostgreSQL folds the duplicate "mail"
    assert list(listener.notifies(timeout=0.2)) == []


@pytest.mark.django_db
def test_requeue_action__select_all_takes_the_filtered_list(admin_client, dead_factory):
    mail = [dead_factory(queue="mail"), dead_factory(queue="mail")]
    other = dead_factory(queue="sms")
    response = admin_client.post(
        reverse(DEAD_LIST) + "?queue=mail",
        {
            "action": "requeue",
            "_selected_action": [str(mail[0].pk)],  # the page's boxes; "select all" wins
            "select_across": "1",
            "index": "0",
        },
    )
    assert texts(response)[0].startswith("Requeued 2 dead letters")
    assert status_of(*mail, other) == ["pending", "pending", "dead"]


def requeue_until_blocked(ids: list[int], watcher: Any) -> tuple[threading.Thread, dict[str, Any]]:
    """Start ``Job.objects.requeue_dead(ids)`` in a thread (operator 2) and return once
    it waits on a row lock; its result lands in the returned dict under "ids"."""
    result: dict[str, Any] = {}

    def operator_2() -> None:
        try:
            result["ids"] = Job.objects.requeue_dead(ids)
        finally:
            connections.close_all()

    thread = threading.Thread(target=operator_2)
    thread.start()
    wait_for(
        lambda: watcher.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND query LIKE %s",
            ["%pgqueue_job%"],
        ).fetchone()[0]
    )
    return thread, result


@pytest.mark.django_db(transaction=True)
@pytest.mark.concurrency
def test_requeue_dead__racing_requeue_waits_then_changes_nothing(dead_factory, other_connection):
    job = dead_factory()
    first = other_connection()
    first.execute(  # operator 1: requeued, not yet committed (holds the row lock)
        sql.JOB_REQUEUE_DEAD,
        {
            "ids": [job.pk],
            "queue": None,
            "priority": None,
            "now": None,
            "channel": settings.NOTIFY_CHANNEL,
        },
    )
    thread, result = requeue_until_blocked([job.pk], other_connection(autocommit=True))
    first.commit()
    thread.join(10)
    assert result["ids"] == []  # re-checked the guard after the lock: no double requeue
    job.refresh_from_db()
    assert (job.status, job.attempts) == ("pending", 0)


@pytest.mark.skipif(not CHANGE_FORM_ACTIONS, reason="Django < 6.1: no change-form actions")
@pytest.mark.django_db
def test_requeue_from_detail_page__requeues_and_opens_the_job(admin_client, dead_factory):
    job = dead_factory(queue="mail")
    response = admin_client.post(
        reverse("admin:django_pgqueue_deadletter_change", args=[job.pk]),
        {
            "CHANGE_FORM-action": "requeue",
            "CHANGE_FORM-requeue_queue": "urgent",
            "CHANGE_FORM-requeue_priority": "",
            "_selected_action": str(job.pk),
            "index": "0",
        },
    )
    assert response.status_code == 302
    assert response["Location"] == reverse("admin:django_pgqueue_job_change", args=[job.pk])
    assert texts(response) == [f"Requeued 1 dead letter (job {job.pk})."]
    job.refresh_from_db()
    assert (job.status, job.queue) == ("pending", "urgent")


# --- discard ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_discard_action__asks_for_confirmation_then_deletes(admin_client, dead_factory, caplog):
    a, b = dead_factory(), dead_factory()
    confirm = post_action(admin_client, "delete_selected", [a.pk, b.pk])
    assert confirm.status_code == 200
    assert "Discard dead letters" in confirm.content.decode()
    assert status_of(a, b) == ["dead", "dead"]  # nothing yet
    caplog.set_level(logging.INFO, logger="django_pgqueue.admin")
    done = post_action(admin_client, "delete_selected", [a.pk, b.pk], post="yes")
    assert texts(done) == [f"Discarded 2 dead letters (job {a.pk}, {b.pk})."]
    assert status_of(a, b) == ["gone", "gone"]
    assert any(getattr(r, "action", None) == "discard" for r in caplog.records)


@pytest.mark.django_db
def test_discard_action__never_deletes_a_job_requeued_meanwhile(admin_client, dead_factory):
    a, b = dead_factory(), dead_factory()
    Job.objects.requeue_dead([a.pk])  # another operator, between confirm and "yes"
    done = post_action(admin_client, "delete_selected", [a.pk, b.pk], post="yes")
    assert texts(done)[0].startswith(f"Discarded 1 dead letter (job {b.pk}); 1 of 2 selected")
    assert status_of(a, b) == ["pending", "gone"]


@pytest.mark.django_db
def test_discard_from_detail_page__uses_djangos_confirmation(admin_client, dead_factory):
    job = dead_factory()
    url = reverse("admin:django_pgqueue_deadletter_delete", args=[job.pk])
    assert "Are you sure" in admin_client.get(url).content.decode()
    response = admin_client.post(url, {"post": "yes"})
    assert response.status_code == 302
    assert texts(response) == [f"Discarded 1 dead letter (job {job.pk})."]
    assert status_of(job) == ["gone"]


# --- permissions and CSRF ------------------------------------------------------------------


@pytest.mark.django_db
def test_dead_letters__anonymous_and_non_staff_go_to_login(client, staff, dead_factory):
    job = dead_factory()
    for c in (client, staff("view_deadletter", is_staff=False)):
        response = c.get(reverse(DEAD_LIST))
        assert response.status_code == 302 and "/admin/login/" in response["Location"]
        response = post_action(c, "requeue", [job.pk])
        assert response.status_code == 302 and "/admin/login/" in response["Location"]
    assert status_of(job) == ["dead"]


@pytest.mark.django_db
def test_dead_letters__staff_without_permission_get_403(staff, dead_factory):
    job = dead_factory()
    c = staff("requeue_job")  # may requeue, but may not even see dead letters
    assert c.get(reverse(DEAD_LIST)).status_code == 403
    assert (
        c.get(reverse("admin:django_pgqueue_deadletter_change", args=[job.pk])).status_code == 403
    )
    assert post_action(c, "requeue", [job.pk]).status_code == 403
    assert status_of(job) == ["dead"]


@pytest.mark.django_db
def test_dead_letters__view_permission_sees_but_cannot_act(staff, dead_factory):
    job = dead_factory()
    c = staff("view_deadletter")
    page = c.get(reverse(DEAD_LIST)).content.decode()
    assert "Requeue selected" not in page and "Discard selected" not in page
    detail = c.get(reverse("admin:django_pgqueue_deadletter_change", args=[job.pk]))
    assert "Requeue selected" not in detail.content.decode()
    for action in ("requeue", "delete_selected"):
        response = post_action(c, action, [job.pk], post="yes")
        assert response.status_code == 200  # no action offered: the list is redrawn
        assert not texts(response)
    assert (
        c.post(
            reverse("admin:django_pgqueue_deadletter_delete", args=[job.pk]), {"post": "yes"}
        ).status_code
        == 403
    )
    assert status_of(job) == ["dead"]


@pytest.mark.django_db
def test_dead_letters__requeue_needs_requeue_permission_only(staff, dead_factory):
    job = dead_factory()
    c = staff("view_deadletter", "requeue_job")
    page = c.get(reverse(DEAD_LIST)).content.decode()
    assert "Requeue selected" in page and "Discard selected" not in page
    assert post_action(c, "requeue", [job.pk]).status_code == 302
    assert status_of(job) == ["pending"]


@pytest.mark.django_db
def test_dead_letters__discard_needs_delete_permission_only(staff, dead_factory):
    job = dead_factory()
    c = staff("view_deadletter", "delete_deadletter")
    page = c.get(reverse(DEAD_LIST)).content.decode()
    assert "Requeue selected" not in page and "Discard selected" in page
    assert post_action(c, "delete_selected", [job.pk], post="yes").status_code == 302
    assert status_of(job) == ["gone"]


@pytest.mark.django_db
def test_dead_letters__posts_need_a_csrf_token(admin_user, dead_factory):
    job = dead_factory()
    c = Client(enforce_csrf_checks=True)
    c.force_login(admin_user)
    assert post_action(c, "requeue", [job.pk]).status_code == 403
    delete_url = reverse("admin:django_pgqueue_deadletter_delete", args=[job.pk])
    assert c.post(delete_url, {"post": "yes"}).status_code == 403
    assert status_of(job) == ["dead"]
    c.get(reverse(DEAD_LIST))  # sets the CSRF cookie, as a browser would
    token = c.cookies["csrftoken"].value
    assert post_action(c, "requeue", [job.pk], csrfmiddlewaretoken=token).status_code == 302
    assert status_of(job) == ["pending"]


# --- the job list --------------------------------------------------------------------------


@pytest.mark.django_db
def test_job_admin__is_read_only_even_for_superusers(admin_client, job_factory):
    job = job_factory()
    (claimed,) = Job.objects.claim("w1", limit=1)
    assert claimed.pk == job.pk
    change = reverse("admin:django_pgqueue_job_change", args=[job.pk])
    content = admin_client.get(change).content.decode()
    assert 'name="task"' not in content and 'name="_save"' not in content
    response = admin_client.post(
        change, {"task": "os.system", "status": "done", "lease_owner": "", "_save": "Save"}
    )
    assert response.status_code == 403  # a running job belongs to its lease owner
    job.refresh_from_db()
    assert (job.task, job.status, job.lease_owner) == (
        "testproject.demo.tasks.add",
        "running",
        "w1",
    )
    assert admin_client.get(reverse("admin:django_pgqueue_job_add")).status_code == 403
    assert (
        admin_client.post(
            reverse("admin:django_pgqueue_job_delete", args=[job.pk]), {"post": "yes"}
        ).status_code
        == 403
    )
    assert Job.objects.filter(pk=job.pk).exists()


@pytest.mark.django_db
def test_job_admin__summary_counts_statuses_queues_wait_and_expired_leases(
    admin_client, job_factory, dead_factory
):
    for queue in ("mail", "mail", "billing"):
        job_factory(queue=queue)
    job_factory(queue="mail", run_at=dt.datetime(2099, 1, 1, tzinfo=dt.UTC))  # scheduled
    dead_factory(queue="mail")
    Job.objects.filter(pk__in=Job.objects.filter(queue="billing").values("pk")).update(
        run_at=Now() - dt.timedelta(hours=2)
    )
    (running,) = Job.objects.claim("w1", limit=1, queues=["mail"], lease_seconds=60)
    Job.objects.filter(pk=running.pk).update(lease_expires_at=Now() - dt.timedelta(seconds=1))

    summary = queue_summary(Job.objects.db_alias)
    assert summary.live == {
        ("pending", "billing"): 1,
        ("pending", "mail"): 1,
        ("running", "mail"): 1,
        ("scheduled", "mail"): 1,
    }
    assert summary.totals == {
        "pending": 2,
        "scheduled": 1,
        "running": 1,
        "done": 0,
        "dead": 1,
        "cancelled": 0,
        "waiting": 0,
    }
    assert not summary.estimated and not summary.capped
    assert dt.timedelta(hours=2) <= summary.oldest_pending_wait < dt.timedelta(hours=2, minutes=5)
    assert summary.expired_leases == 1

    content = admin_client.get(reverse(JOB_LIST)).content.decode()
    assert 'id="pgqueue-summary"' in content
    assert '<td data-status="dead">1</td>' in content
    assert re.search(r'id="pgqueue-oldest-wait">2 h( \d+ min)?<', content)
    assert "is <code>pgqueue_sweep</code> running?" in content


@pytest.mark.django_db
def test_job_admin__summary_caps_live_counts(job_factory):
    for _ in range(3):
        job_factory()
    summary = queue_summary(Job.objects.db_alias, cap=2)
    assert summary.totals["pending"] == 2 and summary.capped == {"pending"}


@pytest.mark.django_db
def test_job_admin__summary_uses_planner_estimates_on_a_big_table(job_factory, dead_factory):
    for _ in range(6):
        job_factory()
    for _ in range(2):
        dead_factory()
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE pgqueue_job")
    summary = queue_summary(Job.objects.db_alias, cap=5)  # 8 rows > cap: estimate done
    assert summary.estimated == {"done"}  # dead and cancelled: counted by their indexes
    assert summary.totals["dead"] == 2 and summary.totals["done"] == 0
    assert common_values(Job.objects.db_alias, "queue") == ["default"]


@pytest.mark.django_db
def test_job_admin__list_page_never_counts_the_whole_table(admin_client, job_factory):
    for _ in range(51):  # more than a page: a single page is fetched without LIMIT
        job_factory()
    with CaptureQueriesContext(connection) as queries:
        for url in (
            reverse(JOB_LIST),
            reverse(DEAD_LIST),
            reverse(JOB_LIST) + "?status__exact=pending",
        ):
            assert admin_client.get(url).status_code == 200
    counts = [
        q["sql"] for q in queries if "COUNT(" in q["sql"].upper() and "pgqueue_job" in q["sql"]
    ]
    assert counts, "expected the bounded count"
    for query in counts:
        assert re.search(r"LIMIT \d+", query), query  # SELECT COUNT(*) FROM (... LIMIT n)
    orders = [
        q["sql"]
        for q in queries
        if "ORDER BY" in q["sql"]
        and 'FROM "pgqueue_job"' in q["sql"]
        and "DISTINCT" not in q["sql"]
        and "'dead'" not in q["sql"]  # an empty list is one page: fetched without LIMIT
    ]
    assert orders
    for query in orders:
        assert re.search(r'ORDER BY "pgqueue_job"\."id" DESC\s+LIMIT', query), query


@pytest.mark.django_db
def test_job_admin__sorting_only_by_id(admin_client, job_factory):
    job_factory()
    response = admin_client.get(reverse(JOB_LIST), {"o": "3"})  # try sorting by queue
    assert response.status_code == 200
    cl = response.context["cl"]
    assert cl.get_ordering(response.wsgi_request, Job.objects.all()) == ["-pk"]  # not "queue"


# --- the paginator -------------------------------------------------------------------------


class TinyPaginator(EstimatedCountPaginator):
    exact_up_to = 3


@pytest.mark.django_db
def test_estimated_paginator__exact_below_the_cap_estimate_above(job_factory):
    for _ in range(5):
        job_factory()
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE pgqueue_job")
    small = TinyPaginator(Job.objects.filter(pk__lt=0), 2)
    assert (small.count, small.is_estimate) == (0, False)
    big = TinyPaginator(Job.objects.all(), 2)
    assert big.count == 5 and big.is_estimate  # planner estimate after ANALYZE
    exact = EstimatedCountPaginator(Job.objects.all(), 2)
    assert (exact.count, exact.is_estimate) == (5, False)


@pytest.mark.django_db
def test_estimated_paginator__stale_low_estimate_still_bounded(job_factory):
    for _ in range(5):
        job_factory()
    paginator = TinyPaginator(Job.objects.all(), 2)
    paginator.planner_estimate = lambda queryset: 1  # type: ignore[method-assign]
    assert paginator.count == 4 and paginator.is_estimate  # counted 3+1 rows, then stopped


@pytest.mark.django_db
def test_dead_letter_admin__proxy_and_json_details(admin_client, dead_factory):
    job = dead_factory(kwargs={"to": "ann@example.com"})
    assert DeadLetter.objects.filter(status="dead").get().pk == job.pk
    content = admin_client.get(
        reverse("admin:django_pgqueue_job_change", args=[job.pk])
    ).content.decode()
    assert escape(json.dumps({"to": "ann@example.com"}, indent=2)) in content
    dead_letter_page = reverse("admin:django_pgqueue_deadletter_change", args=[job.pk])
    assert f'Dead (<a href="{dead_letter_page}">requeue or discard it</a>)' in content


@pytest.mark.django_db(transaction=True)
@pytest.mark.concurrency
def test_requeue_and_discard__overlapping_selections_do_not_deadlock(
    dead_factory, other_connection
):
    # Requeue orders its work by queue; a lock order following that would take b
    # ("aaa") before a ("zzz") and deadlock against a discard holding a, wanting b.
    a = dead_factory(queue="zzz")
    b = dead_factory(queue="aaa")
    first = other_connection()
    first.execute("SELECT id FROM pgqueue_job WHERE id = %s FOR UPDATE", [a.pk])
    thread, result = requeue_until_blocked([a.pk, b.pk], other_connection(autocommit=True))
    # Operator 1 now discards b: the requeue waits on a without holding b, so this goes
    # through at once instead of deadlocking (lock_timeout turns a wait into an error).
    first.execute("SET LOCAL lock_timeout = '2s'")
    deleted = first.execute(
        sql.JOB_DELETE_DEAD, {"ids": [b.pk], "now": None, "channel": "pgqueue_job"}
    ).fetchall()
    first.commit()
    thread.join(10)
    assert deleted == [(b.pk,)]
    assert result["ids"] == [a.pk]
    a.refresh_from_db()
    assert a.status == "pending"


# --- cancel action -------------------------------------------------------------------------


def post_job_action(client: Client, action: str, ids: list[int], **extra: Any) -> Any:
    data = {
        "action": action,
        "_selected_action": [str(i) for i in ids],
        "index": "0",
        "select_across": "0",
        **extra,
    }
    return client.post(reverse(JOB_LIST), data)


def test_cancel_action__needs_its_own_permission(staff, job_factory):
    job = job_factory()
    viewer = staff("view_job")
    page = viewer.get(reverse(JOB_LIST)).content.decode()
    assert "cancel_selected" not in page
    post_job_action(viewer, "cancel_selected", [job.pk], post="yes")
    assert status_of(job) == ["pending"]
    operator = staff("view_job", "cancel_job")
    assert "Cancel selected jobs" in operator.get(reverse(JOB_LIST)).content.decode()


def test_cancel_action__confirms_first_with_escaped_job_data(staff, job_factory):
    job = job_factory()
    Job.objects.filter(pk=job.pk).update(task=XSS)
    response = post_job_action(staff("view_job", "cancel_job"), "cancel_selected", [job.pk])
    assert response.status_code == 200
    html = response.content.decode()
    assert escape(XSS) in html and XSS not in html
    assert 'name="post" value="yes"' in html
    assert status_of(job) == ["pending"]  # nothing changes before the confirmation


def test_cancel_action__cancels_requests_and_reports_what_did_not_change(
    staff, job_factory, caplog
):
    job_factory()
    (running,) = Job.objects.claim("w1", limit=1)
    pending, done = job_factory(), job_factory()
    Job.objects.filter(pk=done.pk).update(status="done", finished_at=Now())
    caplog.set_level(logging.INFO, logger="django_pgqueue.admin")
    response = post_job_action(
        staff("view_job", "cancel_job"),
        "cancel_selected",
        [pending.pk, running.pk, done.pk],
        post="yes",
    )
    assert status_of(pending, running, done) == ["cancelled", "running", "done"]
    assert Job.objects.get(pk=running.pk).cancel_requested_at is not None
    (message,) = texts(response)
    assert message == (
        f"Cancelled 1 job; asked 1 running job to stop (job {running.pk}); "
        "1 of 3 selected not cancelled: already finished (done, dead or cancelled) or busy "
        "at that instant."
    )
    assert "cancelled 1 and requested cancellation of 1 of 3 selected jobs" in caplog.text
    assert LogEntry.objects.filter(change_message="Cancelled from the admin.").count() == 2
    # A second click (a stale page, another operator) changes nothing and says so.
    again = post_job_action(
        staff("view_job", "cancel_job"), "cancel_selected", [pending.pk], post="yes"
    )
    assert texts(again) == [
        "Cancelled 0 jobs; 1 of 1 selected not cancelled: already finished (done, dead or "
        "cancelled) or busy at that instant."
    ]


# --- schedules and workers: hostile URLs, the running-jobs link --------------------------

SCHEDULE_LIST = "admin:django_pgqueue_schedule_changelist"
WORKER_LIST = "admin:django_pgqueue_workerprocess_changelist"


@pytest.fixture
def schedule_and_worker(db: None) -> tuple[Schedule, WorkerProcess]:
    schedule = Schedule.objects.create(
        name="nightly", task="t.nightly", cron="0 3 * * *", timezone="UTC", last_tick=Now()
    )
    worker = WorkerProcess.objects.create(
        id="web#1&x=y",
        hostname="web",
        pid=7,
        queues=["mail"],
        concurrency=2,
        lease_seconds=30,
        version="1",
    )
    return schedule, worker


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("url", "query"),
    [
        (SCHEDULE_LIST, "name=a%00b"),
        (SCHEDULE_LIST, "task=%00"),
        (SCHEDULE_LIST, "cron=x%00"),
        (SCHEDULE_LIST, "timezone=UTC%00"),
        (WORKER_LIST, "id=a%00b"),
        (WORKER_LIST, "hostname=%00"),
        (WORKER_LIST, "queues__contains=mail"),  # not an array literal
        (WORKER_LIST, "queues__contains=%00"),
        (WORKER_LIST, "hostname__regex=%5B"),  # not a regular expression
        (JOB_LIST, "created_at__year=99999"),  # past Python's dates, while compiling
        (DEAD_LIST, "queue__range=x"),  # not a pair
    ],
)
def test_lists__a_filter_the_database_refuses_is_an_invalid_filter(
    admin_client, schedule_and_worker, url, query
):
    """Every field and lookup is a query parameter; one PostgreSQL (or Python) refuses
    raised while the page was drawn, a 500. Now: Django's invalid-filter redirect."""
    response = admin_client.get(f"{reverse(url)}?{query}")
    assert response.status_code == 302
    assert response["Location"] == reverse(url) + "?e=1"
    assert admin_client.get(response["Location"]).status_code == 200


@pytest.mark.django_db
@pytest.mark.parametrize("page", ["change", "history"])
@pytest.mark.parametrize("model", ["schedule", "workerprocess"])
def test_detail_pages__a_key_no_row_can_hold_is_not_found(
    admin_client, schedule_and_worker, model, page
):
    """A NUL in the primary key (quoted as the admin quotes keys: "_00") was a query
    PostgreSQL refused, a 500; now the admin's "does not exist" redirect."""
    url = reverse(f"admin:django_pgqueue_{model}_{page}", args=[admin_quote("a\x00b")])
    response = admin_client.get(url, follow=True)
    assert response.redirect_chain[-1] == (reverse("admin:index"), 302)
    assert "doesn’t exist" in texts(response)[0]


@pytest.mark.django_db
def test_worker_page__running_jobs_link_encodes_the_worker_id(admin_client, schedule_and_worker):
    """A worker id may hold "&", "#" and "=": the link filters on that id, whole."""
    _, worker = schedule_and_worker
    page = admin_client.get(
        reverse("admin:django_pgqueue_workerprocess_change", args=[admin_quote(worker.id)])
    ).content.decode()
    (href,) = re.findall(r'href="([^"]*)">jobs this worker holds', page)
    path, _, query = html.unescape(href).partition("?")
    assert path == reverse(JOB_LIST)
    assert QueryDict(query).dict() == {"status__exact": "running", "lease_owner": "web#1&x=y"}


@pytest.mark.django_db
@pytest.mark.parametrize("levels", [1200, 3000])  # 3.12: too deep to encode; to decode too
def test_job_pages__a_row_stored_too_deep_still_shows(admin_client, job_factory, levels):
    """Enqueue used to take up to ~1,490 levels of nesting (Reliability III #12); such a
    row, already stored, made its job and dead-letter pages a 500 (RecursionError)."""
    job = job_factory()
    deep = "[" * levels + "1" + "]" * levels
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE pgqueue_job SET args = %s::jsonb, result = %s::jsonb, status = 'dead'"
            " WHERE id = %s",
            [deep, deep, job.id],
        )
    for name in ("job_change", "deadletter_change", "job_changelist", "deadletter_changelist"):
        args = [job.id] if name.endswith("_change") else []
        response = admin_client.get(reverse(f"admin:django_pgqueue_{name}", args=args))
        assert response.status_code == 200, name
    assert response.content.decode().count(f">{job.id}<") >= 1
    page = admin_client.get(reverse("admin:django_pgqueue_job_change", args=[job.id])).content
    try:  # Python 3.13's decoder goes deeper (~9,000 levels) than 3.12's (~1,000)
        json.dumps(json.loads(deep), indent=2)
        notes = 0  # this Python shows it: the page does too, indented
        assert page.decode().count(" " * 2 * (levels - 1) + "[") == 2  # args, result
    except RecursionError:
        notes = 2  # args, result
    assert page.decode().count("(nested too deep to show here)") == notes


# --- dead-letter filters ------------------------------------------------------------------


@pytest.mark.django_db
def test_dead_letter_filters__offer_only_tasks_and_queues_of_dead_letters(
    admin_client, job_factory, dead_factory
):
    job_factory(queue="busy", task="testproject.demo.tasks.always_fails", args=[])
    dead_factory(queue="sick")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE pgqueue_job")  # exact choices whatever ran before
    page = admin_client.get(reverse(DEAD_LIST)).content.decode()
    assert "?queue=sick" in page and "?task=testproject.demo.tasks.add" in page
    assert "?queue=busy" not in page and "always_fails" not in page
    # The job list still offers every queue.
    assert "?queue=busy" in admin_client.get(reverse(JOB_LIST)).content.decode()
