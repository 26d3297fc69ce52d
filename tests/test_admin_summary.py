"""The job list's summary and filters against the truth (issue 28, item 5) on a table
too big for exact counts everywhere (42,000 rows): dead and cancelled exact through
their partial indexes, and the By queue / By task filters listing every queue and task
that holds live jobs."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.urls import reverse

from django_pgqueue.models import Job
from django_pgqueue.monitoring import common_values, queue_summary

pytestmark = pytest.mark.django_db

JOB_LIST = "admin:django_pgqueue_job_changelist"

#: One live job per task, each task and queue seen nowhere else (never a common value).
LIVE = [
    (f"app.tasks.job_{i}", f"q{i % 5}", ("pending", "scheduled", "waiting")[i % 3])
    for i in range(15)
]


@pytest.fixture
def big_table():
    """42,000 done jobs of one task and queue, 13 dead, 7 cancelled, and 15 live jobs of
    15 other tasks on 5 other queues."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgqueue_job (backend, queue, task, args, kwargs, priority, status,"
            " attempts, max_attempts, run_at, errors, created_at, finished_at)"
            " SELECT 'default', 'bulk', 'app.tasks.bulk', '[]', '{}', 0,"
            " CASE WHEN g <= 13 THEN 'dead' WHEN g <= 20 THEN 'cancelled' ELSE 'done' END,"
            " 1, 1, now() - interval '1 h', '[]', now() - interval '1 h', now()"
            " FROM generate_series(1, 42000) AS g"
        )
        for task, queue, status in LIVE:
            cursor.execute(
                "INSERT INTO pgqueue_job (backend, queue, task, args, kwargs, priority, status,"
                " attempts, max_attempts, run_at, errors, created_at)"
                " VALUES ('default', %s, %s, '[]', '{}', 0, %s, 0, 1,"
                " now() + CASE WHEN %s = 'scheduled' THEN interval '1 h' ELSE interval '0' END,"
                " '[]', now())",
                [queue, task, status, status],
            )
        cursor.execute("ANALYZE pgqueue_job")


def test_summary__dead_and_cancelled_are_exact_on_a_big_table(big_table, admin_client):
    summary = queue_summary(Job.objects.db_alias)
    assert (summary.totals["dead"], summary.totals["cancelled"]) == (13, 7)
    assert "dead" not in summary.estimated and "cancelled" not in summary.estimated
    assert "done" in summary.estimated  # the planner's, and marked as one
    html = admin_client.get(reverse(JOB_LIST)).content.decode()
    assert '<td data-status="dead">13</td>' in html
    assert '<td data-status="cancelled">7</td>' in html
    assert re.search(r'<td data-status="done">≈ [\d,]+</td>', html)


def test_summary__caps_dead_and_cancelled_as_lower_bounds(big_table):
    summary = queue_summary(Job.objects.db_alias, cap=10)
    assert (summary.totals["dead"], summary.totals["cancelled"]) == (10, 7)
    assert "dead" in summary.capped and "cancelled" not in summary.capped


def test_filters__list_every_queue_and_task_that_holds_live_jobs(big_table, admin_client):
    queues = {queue for _, queue, _ in LIVE}
    tasks = {task for task, _, _ in LIVE}
    assert queues <= set(common_values(Job.objects.db_alias, "queue"))
    assert tasks <= set(common_values(Job.objects.db_alias, "task"))
    html = admin_client.get(reverse(JOB_LIST)).content.decode()
    for task in tasks:
        assert f"?task={task}" in html, task
    for queue in queues:
        assert f"?queue={queue}" in html, queue
