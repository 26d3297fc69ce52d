"""The admin's lists at 1400 px in a real headless browser, navigation sidebar open:
every column is on screen, none cut off at the right (``.ci/install-browser``).

Set ``PGQUEUE_ADMIN_LAYOUT_SHOTS=dir`` to keep a screenshot of each list there."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db.models import F
from django.db.models.functions import Now
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from django_pgqueue.models import Job, WorkerProcess
from testkit.browser import BROWSER_MARKS, chromium

pytestmark = BROWSER_MARKS

WIDTH = 1400
#: A worker id as the worker names itself (host:pid:random) on a long host name.
WORKER_ID = "web-1.eu-west-1.prod.example.com:424242:9f3c1a7b"
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/srv/app/notify.py", line 41, in send_notification\n'
    "    smtp.send(recipient, body)\n"
    "smtplib.SMTPServerDisconnected: Connection unexpectedly closed while sending the "
    "message body to mail.example.com after 3 retries (timeout 30 s)\n"
)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    with chromium(tmp_path / "chromium-profile", width=WIDTH, height=900) as driver:
        yield driver


def fill() -> None:
    """Rows as long as real ones get: long task paths, worker ids and errors."""
    for status in ("pending", "running", "dead", "done"):
        job = Job.objects.enqueue(
            "testproject.demo.tasks.send_notification",
            ["ann@example.com"],
            queue="notifications-eu",
            max_attempts=10,
        )
        Job.objects.filter(pk=job.pk).update(
            status=status,
            attempts=F("max_attempts") if status == "dead" else 1,
            lease_owner=WORKER_ID,
            lease_expires_at=Now() if status == "running" else None,
            started_at=Now(),
            last_attempted_at=Now(),
            finished_at=None if status in ("pending", "running") else Now(),
            errors=[
                {
                    "exception_class_path": "smtplib.SMTPServerDisconnected",
                    "traceback": TRACEBACK,
                    "worker_id": WORKER_ID,
                    "attempt": 10,
                }
            ],
        )
    WorkerProcess.objects.create(
        id=WORKER_ID,
        hostname="web-1.eu-west-1.prod.example.com",
        pid=424242,
        queues=["notifications-eu", "notifications-us", "billing", "default"],
        concurrency=16,
        lease_seconds=30,
        version="0.1.0",
        jobs_held=12,
        jobs_done=123_456_789,
        jobs_failed=12_345,
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("model", ["job", "deadletter", "workerprocess"])
def test_admin_lists__every_column_fits_at_1400_px(
    live_server: Any, browser: webdriver.Chrome, django_user_model: Any, tmp_path: Path, model: str
) -> None:
    django_user_model.objects.create_superuser("oncall", "oncall@example.com", "s3cret-pw")
    fill()
    browser.get(f"{live_server.url}/admin/login/?next=/admin/django_pgqueue/{model}/")
    browser.find_element(By.NAME, "username").send_keys("oncall")
    browser.find_element(By.NAME, "password").send_keys("s3cret-pw")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    WebDriverWait(browser, 15).until(
        expected_conditions.presence_of_element_located((By.ID, "result_list"))
    )
    shot = tmp_path / f"{model}.png"
    browser.save_screenshot(str(shot))
    if keep := os.environ.get("PGQUEUE_ADMIN_LAYOUT_SHOTS"):
        shutil.copyfile(shot, Path(keep) / shot.name)
    layout: dict[str, Any] = browser.execute_script(
        """
        const results = document.querySelector('.results');
        const view = document.documentElement.clientWidth;
        const heads = [...document.querySelectorAll('#result_list thead th')];
        return {
            view: view,
            page: document.documentElement.scrollWidth,
            scroll: results.scrollWidth, box: results.clientWidth,
            cut: heads.filter(th => th.getBoundingClientRect().right > view + 1)
                      .map(th => th.textContent.trim()),
        };
        """
    )
    assert layout["cut"] == [], layout
    assert layout["scroll"] <= layout["box"], layout  # no scrolling inside the list
    assert layout["page"] <= layout["view"], layout  # nor of the page
