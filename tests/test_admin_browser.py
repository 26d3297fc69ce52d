"""End to end in a real headless browser: an operator logs in, opens the dead letters,
requeues one, sees the success message, and a real worker process then runs the job.

Uses Debian's ``chromium`` and ``chromedriver`` (``.ci/install-browser`` installs them).
Set ``PGQUEUE_ADMIN_SCREENSHOT=docs/img/dead-letters.png`` to refresh the docs' picture.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db.models import F
from django.db.models.functions import Now
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.select import Select
from selenium.webdriver.support.ui import WebDriverWait

from django_pgqueue.models import Job
from testkit.browser import BROWSER_MARKS, chromium
from testproject.demo.models import Delivery

pytestmark = BROWSER_MARKS


def traceback_of(message: str) -> str:
    return (
        "Traceback (most recent call last):\n"
        '  File "/srv/app/notify.py", line 41, in send_notification\n'
        "    smtp.send(recipient, body)\n"
        f"{message}\n"
    )


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    with chromium(tmp_path / "chromium-profile", width=1500, height=760) as driver:
        yield driver


def make_dead(**kwargs: Any) -> Job:
    """A dead letter as the worker leaves it after the last failed attempt."""
    message = kwargs.pop("message")
    job = Job.objects.enqueue(max_attempts=5, **kwargs)
    Job.objects.filter(pk=job.pk).update(
        status="dead",
        attempts=F("max_attempts"),
        lease_owner="web-1:4242:9f3c1a",
        started_at=Now(),
        last_attempted_at=Now(),
        finished_at=Now(),
        errors=[
            {
                "exception_class_path": message.split(":")[0],
                "traceback": traceback_of(message),
                "worker_id": "web-1:4242:9f3c1a",
                "attempt": 5,
            }
        ],
    )
    return job


@pytest.mark.django_db(transaction=True)
def test_admin_browser__requeue_a_dead_letter_and_a_worker_runs_it(
    live_server: Any,
    browser: webdriver.Chrome,
    django_user_model: Any,
    manage: Callable[..., Any],
    tmp_path: Path,
) -> None:
    django_user_model.objects.create_superuser("oncall", "oncall@example.com", "s3cret-pw")
    make_dead(
        task="testproject.demo.tasks.flaky",
        kwargs={"fail_rate": 1.0},
        queue="default",
        message="RuntimeError: flaky task failed, will be retried",
    )
    make_dead(
        task="testproject.demo.tasks.send_notification",
        args=["<script>alert('x')</script>"],
        queue="mail",
        message="ConnectionRefusedError: [Errno 111] Connection refused",
    )
    target = make_dead(
        task="testproject.demo.tasks.send_notification",
        args=["ann@example.com"],
        queue="mail",
        message="smtplib.SMTPServerDisconnected: Connection unexpectedly closed",
    )
    wait = WebDriverWait(browser, 15)

    # Log in; the admin sends us on to the dead letters.
    browser.get(f"{live_server.url}/admin/login/?next=/admin/django_pgqueue/deadletter/")
    browser.find_element(By.NAME, "username").send_keys("oncall")
    browser.find_element(By.NAME, "password").send_keys("s3cret-pw")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    wait.until(expected_conditions.title_contains("dead letter"))
    rows = browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    assert len(rows) == 3
    page = browser.find_element(By.ID, "result_list").text
    assert "SMTPServerDisconnected: Connection unexpectedly closed" in page
    assert not browser.find_elements(By.XPATH, "//script[contains(., \"alert('x')\")]")

    browser.find_element(By.ID, "toggle-nav-sidebar").click()  # room for the columns
    screenshot = tmp_path / "dead-letters.png"
    browser.save_screenshot(str(screenshot))
    if target_path := os.environ.get("PGQUEUE_ADMIN_SCREENSHOT"):
        shutil.copyfile(screenshot, target_path)

    # Select the one dead letter, choose "Requeue", run.
    browser.find_element(
        By.CSS_SELECTOR, f"input[name=_selected_action][value='{target.pk}']"
    ).click()
    Select(browser.find_element(By.NAME, "action")).select_by_value("requeue")
    browser.find_element(By.CSS_SELECTOR, "button[name=index]").click()
    message = wait.until(
        expected_conditions.visibility_of_element_located(
            (By.CSS_SELECTOR, ".messagelist .success")
        )
    )
    assert message.text == f"Requeued 1 dead letter (job {target.pk})."
    assert len(browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")) == 2

    # A real worker process picks it up and runs it.
    worker = manage("pgqueue_worker", "--burst", "--queue", "mail")
    assert worker.wait(60) == 0, worker.output()
    target.refresh_from_db()
    assert (target.status, target.attempts) == ("done", 1), worker.output()
    assert Delivery.objects.get(job_id=target.pk).recipient == "ann@example.com"
    assert Job.objects.filter(status="dead").count() == 2  # the others were left alone
