"""Issue 32's pages in a real headless browser at 1400 px: the tagged job list, the
database schedule form (a bad cron refused on its field, then saved, its next run
times shown) and a job's timeline. Set ``PGQUEUE_ADMIN_SCREENSHOT_DIR=docs/img`` to
write the docs' pictures (``tagged-jobs.png``, ``schedule-form.png``,
``job-timeline.png``). Uses Debian's ``chromium`` and ``chromedriver``
(``.ci/install-browser``); skipped without them."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from django_pgqueue import schedules
from django_pgqueue.models import Job
from testkit.browser import BROWSER_MARKS, chromium

pytestmark = BROWSER_MARKS
ADD = "testproject.demo.tasks.add"


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    with chromium(tmp_path / "chromium-profile", width=1400, height=900) as driver:
        yield driver


def keep(browser: webdriver.Chrome, tmp_path: Path, name: str) -> None:
    shot = tmp_path / name
    browser.save_screenshot(str(shot))
    if target := os.environ.get("PGQUEUE_ADMIN_SCREENSHOT_DIR"):
        shutil.copyfile(shot, Path(target) / name)


@pytest.mark.django_db(transaction=True)
def test_admin_browser__tags_schedule_form_and_timeline(
    live_server: Any, browser: webdriver.Chrome, django_user_model: Any, tmp_path: Path
) -> None:
    django_user_model.objects.create_superuser("oncall", "oncall@example.com", "s3cret-pw")
    for customer in (41, 42, 42, 43):
        Job.objects.enqueue(ADD, [customer, 1], tags=[f"customer:{customer}", "import"])
    failed = Job.objects.enqueue(ADD, [42, 2], tags=["customer:42"])
    Job.objects.filter(pk=failed.pk).update(
        status="scheduled",
        attempts=1,
        errors=[
            {
                "attempt": 1,
                "worker_id": "web-1:4242:9f3c1a",
                "exception_class_path": "builtins.ConnectionError",
                "traceback": 'Traceback (most recent call last):\n  File "t.py", line 1\n'
                "ConnectionError: upstream timed out\n",
                "at": "2030-01-01T00:01:00+00:00",
            }
        ],
    )
    wait = WebDriverWait(browser, 15)
    browser.get(f"{live_server.url}/admin/login/?next=/admin/django_pgqueue/job/")
    browser.find_element(By.NAME, "username").send_keys("oncall")
    browser.find_element(By.NAME, "password").send_keys("s3cret-pw")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    wait.until(expected_conditions.title_contains("job"))

    browser.get(f"{live_server.url}/admin/django_pgqueue/job/?tag=customer:42")
    rows = browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    assert len(rows) == 3
    keep(browser, tmp_path, "tagged-jobs.png")

    browser.get(f"{live_server.url}/admin/django_pgqueue/scheduledefinition/add/")
    for name, value in {
        "name": "report-customer-42",
        "task": ADD,
        "cron": "every morning",
        "timezone": "Europe/Paris",
    }.items():
        field = browser.find_element(By.NAME, name)
        field.clear()
        field.send_keys(value)
    browser.find_element(By.NAME, "_continue").click()
    error = browser.find_element(By.CSS_SELECTOR, ".field-cron .errorlist").text
    assert "has 2 fields" in error
    cron = browser.find_element(By.NAME, "cron")
    cron.clear()
    cron.send_keys("0 6 * * 1-5")
    browser.find_element(By.NAME, "_continue").click()
    wait.until(
        expected_conditions.presence_of_element_located(
            (By.CSS_SELECTOR, ".field-next_runs_display li")
        )
    )
    assert len(browser.find_elements(By.CSS_SELECTOR, ".field-next_runs_display li")) == 5
    assert schedules.get("report-customer-42").cron == "0 6 * * 1-5"
    keep(browser, tmp_path, "schedule-form.png")

    browser.get(f"{live_server.url}/admin/django_pgqueue/job/{failed.pk}/change/")
    timeline = browser.find_element(By.CSS_SELECTOR, "ol.pgqueue-timeline").text
    assert "ConnectionError: upstream timed out" in timeline
    browser.execute_script("document.querySelector('ol.pgqueue-timeline').scrollIntoView()")
    keep(browser, tmp_path, "job-timeline.png")
