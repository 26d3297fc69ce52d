"""The job page's details and the flow pages' lists (issue 28, items 10 and 11): the
concurrency key, why a job waits, times to the second, long argument lists cut short,
error entries without a worker, tracebacks without the worker's frames; the dead-letter
date filter without "No date"; every queue on *Queues*; the settings' limits on
*Limits*; *Add queue* says it pauses; a periodic tick with its time zone."""

from __future__ import annotations

import datetime as dt
import zoneinfo

import pytest
from django.test import override_settings
from django.urls import reverse

from django_pgqueue.admin.base import task_traceback
from django_pgqueue.admin.schedules import zoned
from django_pgqueue.models import Job, Queue

pytestmark = pytest.mark.django_db

JOB_PAGE = "admin:django_pgqueue_job_change"
DEAD_LIST = "admin:django_pgqueue_deadletter_changelist"
QUEUES = "admin:django_pgqueue_queue_changelist"
LIMITS = "admin:django_pgqueue_limit_changelist"

TRACEBACK = """Traceback (most recent call last):
  File "/app/venv/site-packages/django_pgqueue/worker/runner.py", line 301, in run
    value = self._call(job, begun)
  File "/app/venv/site-packages/django_pgqueue/worker/runner.py", line 350, in _call
    return known.task.call(*job.args, **job.kwargs)
  File "/app/shop/tasks.py", line 12, in charge
    raise ValueError("card declined")
ValueError: card declined"""


def page(client, job: Job) -> str:
    response = client.get(reverse(JOB_PAGE, args=[job.pk]))
    assert response.status_code == 200
    return response.content.decode()


def test_job_page__key_times_and_a_long_argument_list(admin_client, job_factory):
    job = job_factory(args=list(range(1200)), concurrency_key="tenant:7")
    html = page(admin_client, job)
    assert "tenant:7" in html
    created = job.created_at.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
    assert f"{created} +00:00" in html
    assert "… 1,150 more items" in html and "\n  1199\n" not in html


def test_job_page__an_error_without_a_worker_and_the_workers_frames(admin_client, job_factory):
    job = job_factory()
    Job.objects.filter(pk=job.pk).update(
        errors=[
            {
                "attempt": 0,
                "worker_id": "",
                "exception_class_path": "django_pgqueue.exceptions.JobCancelled",
                "at": "2026-12-04T20:20:20.639929+00:00",
                "traceback": TRACEBACK,
            }
        ]
    )
    html = page(admin_client, job)
    assert "Attempt 0</strong> (no worker" in html and "on :" not in html
    assert "2026-12-04 20:20:20 +00:00" in html and "20:20:20.639929" not in html
    assert "worker/runner.py" not in html and "shop/tasks.py" in html
    assert "(2 frames of the worker left out)" in html


def test_task_traceback__keeps_a_traceback_that_starts_in_the_task():
    text = 'Traceback (most recent call last):\n  File "/app/t.py", line 1, in f\n    x\nE: y'
    assert task_traceback(text) == text
    assert task_traceback(None) == ""


def test_job_page__says_why_a_pending_job_waits(admin_client, job_factory):
    Job.objects.pause_queue("mail")
    paused = job_factory(queue="mail")
    assert "queue &#x27;mail&#x27; is paused" in page(admin_client, paused)
    later = job_factory(run_at=dt.datetime(2099, 1, 2, 3, 4, 5, tzinfo=dt.UTC))
    assert "Scheduled: due at 2099-01-02 03:04:05 +00:00" in page(admin_client, later)
    with override_settings(PGQUEUE_LIMITS={"tenant:*": {"concurrency": 1}}):
        keyed = job_factory(concurrency_key="tenant:1")
        other = job_factory(concurrency_key="tenant:1")
        Job.objects.claim("w", limit=1, queues=["default"])
        waiting = keyed if Job.objects.get(pk=keyed.pk).status == "pending" else other
        html = page(admin_client, waiting)
        assert "limit tenant:* is full (1 running)" in html
    ready = job_factory(queue="idle")
    assert "ready: the next free worker" in page(admin_client, ready)


def test_dead_letters__time_of_death_filter_has_no_no_date(admin_client):
    html = admin_client.get(reverse(DEAD_LIST)).content.decode()
    assert "time of death" in html
    assert "No date" not in html and "Has date" not in html


def test_queues__lists_every_queue_with_live_jobs(admin_client, job_factory):
    Job.objects.pause_queue("mail")
    Job.objects.resume_queue("mail")
    job_factory(queue="search")
    html = admin_client.get(reverse(QUEUES)).content.decode()
    assert 'id="pgqueue-other-queues"' in html
    assert "?queue=search" in html and "?queue=mail" not in html  # mail has a row


def test_queues__add_queue_says_it_pauses(admin_client):
    response = admin_client.post(
        reverse("admin:django_pgqueue_queue_add"), {"name": "mail"}, follow=True
    )
    html = response.content.decode()
    assert "Paused queue &#x27;mail&#x27;" in html and "added successfully" not in html
    assert Queue.objects.get(name="mail").paused_at is not None
    assert (
        "Pause a queue by name"
        in admin_client.get(reverse("admin:django_pgqueue_queue_add")).content.decode()
    )


def test_queues__add_queue_alone_may_not_pause_a_queue(django_user_model, client):
    """Adding a queue pauses it: a staff user with add_queue but not change_queue (the
    permission of the pause action) gets 403 and pauses nothing (issue 28 item 18)."""
    from django.contrib.auth.models import Permission

    user = django_user_model.objects.create_user(username="adder", password="pw", is_staff=True)
    for codename in ("view_queue", "add_queue"):
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="django_pgqueue", codename=codename)
        )
    client.force_login(user)
    add = reverse("admin:django_pgqueue_queue_add")
    assert client.get(add).status_code == 403
    assert client.post(add, {"name": "mail"}).status_code == 403
    assert not Queue.objects.filter(name="mail").exists()
    assert Job.objects.paused_queues() == []


@override_settings(PGQUEUE_LIMITS={"stripe": {"concurrency": 2}, "mail:*": {"rate": "5/s"}})
def test_limits__lists_the_settings_limits_in_force(admin_client):
    Job.objects.set_limit("stripe", concurrency=4)
    html = admin_client.get(reverse(LIMITS)).content.decode()
    assert 'id="pgqueue-declared-limits"' in html
    declared = html.split('id="pgqueue-declared-limits"')[1]
    assert "mail:*" in declared and "stripe" not in declared  # replaced by its row


def test_periodic__a_tick_is_shown_in_its_time_zone():
    tick = dt.datetime(2026, 12, 5, 3, 0, tzinfo=zoneinfo.ZoneInfo("Europe/Paris"))
    assert zoned(tick) == "2026-12-05 03:00:00 CET (UTC+01:00)"
