"""A running job asked to cancel shows it (issue 28, item 6): the job list and the job
page show the request, the job page has a *Cancel this job* button, and the log line
of a job that ran to its end after the request does not say the task stopped."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from django_pgqueue.models import Job

from .conftest import wait_for

JOB_LIST = "admin:django_pgqueue_job_changelist"
JOB_PAGE = "admin:django_pgqueue_job_change"
WORKER = ("pgqueue_worker", "--poll-interval", "0.1")


@pytest.mark.django_db
def test_admin__a_running_job_asked_to_stop_shows_it(staff, job_factory):
    job = job_factory()
    (running,) = Job.objects.claim("w1", limit=1, lease_seconds=60)
    assert running.pk == job.pk
    assert Job.objects.cancel([job.pk]).requested == [job.pk]
    requested = Job.objects.get(pk=job.pk).cancel_requested_at
    client = staff("view_job", "cancel_job")

    listing = client.get(reverse(JOB_LIST)).content.decode()
    assert "(cancel requested)" in listing

    page = client.get(reverse(JOB_PAGE, args=[job.pk])).content.decode()
    second = requested.strftime("%Y-%m-%d %H:%M:%S")
    assert f"Running, asked to stop at {second} +00:00" in page
    assert re.search(rf"cancellation requested.*{second} \+00:00", page, re.S | re.I)
    assert 'id="pgqueue-cancel-job"' not in page  # asked already: no second button


@pytest.mark.django_db
def test_admin__job_page_has_a_cancel_button_that_confirms_first(staff, job_factory):
    job = job_factory()
    done = job_factory()
    Job.objects.filter(pk=done.pk).update(status="done")
    operator = staff("view_job", "cancel_job")
    page = operator.get(reverse(JOB_PAGE, args=[job.pk])).content.decode()
    form = re.search(r'<form method="post" action="([^"]+)" id="pgqueue-cancel-job">', page)
    assert form is not None and form.group(1) == reverse(JOB_LIST)
    assert "Cancel this job" in page
    # The button posts the list's action: the confirmation page first, nothing cancelled.
    confirm = operator.post(
        form.group(1), {"action": "cancel_selected", "_selected_action": str(job.pk)}
    )
    assert confirm.status_code == 200
    assert "1 job selected: 1 pending." in confirm.content.decode()
    assert "Yes, cancel them" in confirm.content.decode()
    assert Job.objects.get(pk=job.pk).status == "pending"
    # No button for a finished job, nor for a user who may not cancel.
    assert (
        "pgqueue-cancel-job"
        not in operator.get(reverse(JOB_PAGE, args=[done.pk])).content.decode()
    )
    viewer = staff("view_job")
    assert (
        "pgqueue-cancel-job" not in viewer.get(reverse(JOB_PAGE, args=[job.pk])).content.decode()
    )


@pytest.mark.slow
def test_process__a_task_that_ran_to_its_end_after_a_cancel_request_is_not_said_to_stop(
    transactional_db, manage, tmp_path
):
    """``sleep_after_marking`` never reads ``cancel_requested``: it sleeps its 2 s out.
    The job ends cancelled (the request stands) but the line must not say it stopped."""
    from tests.tasks import cooperative, sleep_after_marking

    marker = tmp_path / "started"
    job = Job.objects.enqueue(sleep_after_marking, [str(marker), 2.0])
    worker = manage(*WORKER, "--lease-seconds", "3")
    wait_for(marker.exists, timeout=30)
    assert Job.objects.cancel([job.id]).requested == [job.id]
    wait_for(lambda: Job.objects.get(pk=job.id).status == "cancelled", timeout=20)
    stopper_marker = tmp_path / "stopper"
    stopper = Job.objects.enqueue(cooperative, [str(stopper_marker), 60])
    wait_for(stopper_marker.exists, timeout=30)
    assert Job.objects.cancel([stopper.id]).requested == [stopper.id]
    wait_for(lambda: Job.objects.get(pk=stopper.id).status == "cancelled", timeout=20)
    worker.signal(15)
    assert worker.wait() == 0, worker.output()
    out = worker.output()
    line = next(x for x in out.splitlines() if f"job {job.id} tests.tasks.sleep" in x)
    assert "the task stopped" not in line and "ran to its end" in line, line
    assert Job.objects.get(pk=job.id).result == 2.0
    line = next(x for x in out.splitlines() if f"job {stopper.id} tests.tasks.cooperative" in x)
    assert "(the task stopped)" in line, line
