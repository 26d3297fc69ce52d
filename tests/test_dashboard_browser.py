"""The queue dashboard in a real headless browser: an operator opens it from the admin
index, reads the figures and the charts, sees the real worker process that runs, and
follows a link into the filtered job list.

Uses Debian's ``chromium`` and ``chromedriver``, as ``test_admin_browser.py`` does. Set
``PGQUEUE_DASHBOARD_SCREENSHOT=docs/img/dashboard.png`` to refresh the docs' picture.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from testkit.browser import BROWSER_MARKS, chromium
from tests.conftest import wait_for

pytestmark = BROWSER_MARKS


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    with chromium(tmp_path / "chromium-profile", width=1600, height=1250) as driver:
        yield driver


def an_hour_of_history() -> None:
    """About 40,000 jobs finished over the last hour in three queues (a few dead, with
    waits that rise and fall), and a backlog of pending jobs."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO pgqueue_job (backend, queue, task, args, kwargs, priority, status,
                attempts, max_attempts, run_at, errors, created_at, started_at,
                last_attempted_at, finished_at, lease_owner)
            SELECT 'default', (ARRAY['default', 'emails', 'reports'])[1 + g % 3],
                   'testproject.demo.tasks.add', '[]', '{}', 0,
                   CASE WHEN g % 97 = 0 AND s.f > clock_timestamp() - interval '25 min'
                        THEN 'dead' ELSE 'done' END, 1, 3,
                   s.f - make_interval(secs => 0.3 + 2.5 * random()
                       * (1.2 + sin(extract(epoch FROM s.f) / 500))),
                   '[]', s.f, s.f, s.f, s.f, 'web-1:4242:9f3c1a'
            FROM (SELECT g, clock_timestamp() - make_interval(secs => 3590 * random()) AS f
                  FROM generate_series(1, 40000) AS g) AS s
            WHERE random() < 0.55 + 0.45 * sin(extract(epoch FROM s.f) / 900)
            """
        )
        cursor.execute(
            """
            INSERT INTO pgqueue_job (backend, queue, task, args, kwargs, priority, status,
                attempts, max_attempts, run_at, errors, created_at)
            SELECT 'default', (ARRAY['default', 'reports'])[1 + g % 2],
                   'testproject.demo.tasks.add', '[1, 2]', '{}', 0, 'pending', 0, 3,
                   clock_timestamp() - make_interval(secs => g % 50), '[]', clock_timestamp()
            FROM generate_series(1, 320) AS g
            """
        )
        cursor.execute("ANALYZE pgqueue_job")


@pytest.mark.django_db(transaction=True)
def test_dashboard_browser__from_the_index_to_the_figures_charts_and_workers(
    live_server: Any,
    browser: webdriver.Chrome,
    django_user_model: Any,
    manage: Callable[..., Any],
    tmp_path: Path,
) -> None:
    from django_pgqueue import monitoring

    an_hour_of_history()
    django_user_model.objects.create_superuser("oncall", "oncall@example.com", "s3cret-pw")
    # A real worker on a queue with no backlog: it registers and shows as live.
    worker = manage(
        "pgqueue_worker",
        "--queue",
        "emails",
        "--concurrency",
        "4",
        "--worker-id",
        "web-2:81:c0ffee",
    )
    wait_for(lambda: any(w.id == "web-2:81:c0ffee" for w in monitoring.workers()), timeout=20)
    wait = WebDriverWait(browser, 15)

    browser.get(f"{live_server.url}/admin/login/?next=/admin/")
    browser.find_element(By.NAME, "username").send_keys("oncall")
    browser.find_element(By.NAME, "password").send_keys("s3cret-pw")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    wait.until(expected_conditions.title_contains("Site administration"))
    browser.find_element(By.LINK_TEXT, "Dashboard").click()
    wait.until(expected_conditions.title_contains("Queue dashboard"))

    assert browser.find_element(By.ID, "pgqueue-pending").text == "320"
    assert browser.find_element(By.ID, "pgqueue-live-workers").text == "1"
    rows = {
        row.get_attribute("data-queue"): row
        for row in browser.find_elements(By.CSS_SELECTOR, "#pgqueue-queues tbody tr")
    }
    assert set(rows) == {"default", "emails", "reports"}
    pending = rows["default"].find_element(By.CSS_SELECTOR, "td[data-figure=pending]").text
    assert pending == "160"
    bars = browser.find_elements(By.CSS_SELECTOR, "#pgqueue-throughput svg rect")
    assert len(bars) >= 60  # finished bars for (nearly) every minute, failed on some
    assert browser.find_elements(By.CSS_SELECTOR, "#pgqueue-latency svg polyline")
    worker_row = browser.find_element(By.CSS_SELECTOR, "tr[data-worker='web-2:81:c0ffee']")
    assert "live" in worker_row.text and "emails" in worker_row.text
    # No script of any kind, let alone one from elsewhere.
    assert not browser.find_elements(By.CSS_SELECTOR, "#content script")
    assert not [
        el.get_attribute("src")
        for el in browser.find_elements(By.CSS_SELECTOR, "script[src], link[href]")
        if not (el.get_attribute("src") or el.get_attribute("href") or "").startswith(
            live_server.url
        )
    ]

    browser.find_element(By.ID, "toggle-nav-sidebar").click()  # room for the charts
    screenshot = tmp_path / "dashboard.png"
    browser.save_screenshot(str(screenshot))
    if target_path := os.environ.get("PGQUEUE_DASHBOARD_SCREENSHOT"):
        shutil.copyfile(screenshot, target_path)

    # A figure links into the job list, filtered.
    rows["reports"].find_element(By.CSS_SELECTOR, "td[data-figure=pending] a").click()
    wait.until(expected_conditions.title_contains("job"))
    assert "status__exact=pending" in browser.current_url
    assert "queue=reports" in browser.current_url
    listed = browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    assert listed and all("reports" in row.text for row in listed)
    worker.signal(15)
    assert worker.wait(timeout=20) == 0, worker.output()
