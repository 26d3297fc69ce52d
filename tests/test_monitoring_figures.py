"""The monitoring figures against the truth (issue 28, items 3 and 4): each queue's
backlog read on its own (a small queue beside a big one is not read as zero), its
oldest pending job exact, and ``--check --max-latency`` sees every queue; through the
real ``pgqueue_status`` command."""

from __future__ import annotations

import datetime as dt
import io
import json

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.models import Count

from django_pgqueue import enqueue_many, monitoring
from django_pgqueue.models import Job
from testproject.demo import tasks as demo

pytestmark = pytest.mark.django_db(transaction=True)


def status(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = 0
    try:
        call_command("pgqueue_status", *args, stdout=out, stderr=err)
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def paused_backlogs():
    """Issue 28 item 3: ``mail`` and ``search`` paused, 15,000 jobs on ``mail`` and 500
    on ``search``, the search jobs waiting for 10 minutes, the mail ones for 1."""
    Job.objects.pause_queue("mail")
    Job.objects.pause_queue("search")
    now = dt.datetime.now(dt.UTC)
    mail = demo.add.using(queue_name="mail", run_after=now - dt.timedelta(seconds=60))
    search = demo.add.using(queue_name="search", run_after=now - dt.timedelta(seconds=600))
    assert enqueue_many(mail, [((i, i), {}) for i in range(15_000)]) == 15_000
    assert enqueue_many(search, [((i, i), {}) for i in range(500)]) == 500
    assert Job.objects.filter(status="pending").count() == 15_500
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE pgqueue_job")


def test_status__a_small_queue_beside_a_big_one_is_counted_exactly(paused_backlogs):
    code, out, err = status("--json")
    assert code == 0, err
    queues = json.loads(out)["queues"]
    mail, search = queues["mail"], queues["search"]
    # The small queue: exact, with its own oldest job.
    assert search["pending"] == 500 and "pending" not in search["estimated"]
    assert search["oldest_pending_age_seconds"] == pytest.approx(600, abs=30)
    # The big one: a marked lower bound at the cap, never read as a count.
    cap = monitoring.DEFAULT_CAP
    assert mail["pending"] == cap and mail["lower_bound"] == ["pending"]
    assert mail["oldest_pending_age_seconds"] == pytest.approx(60, abs=30)
    assert "oldest_pending_age" not in mail["estimated"]

    code, table, err = status()
    assert code == 0, err
    lines = {line.split()[0]: line for line in table.splitlines() if line.strip()}
    assert f"≥ {cap:,}" in lines["mail"]
    assert " 500 " in lines["search"] and "10 min" in lines["search"]


def test_status__exact_up_to_the_cap_for_every_queue(paused_backlogs):
    """A cap above both backlogs: both exact, whatever the planner's statistics say."""
    snap = monitoring.snapshot(cap=20_000)
    truth = dict(Job.objects.filter(status="pending").values_list("queue").annotate(n=Count("id")))
    assert {q: snap.queues[q].pending for q in truth} == truth == {"mail": 15_000, "search": 500}
    assert all(not snap.queues[q].estimated for q in truth)


def test_status_check__max_latency_sees_every_queue(paused_backlogs):
    code, _, err = status("--check", "--max-latency", "2")
    assert code == 1
    assert "queue 'mail'" in err and "queue 'search'" in err
    code, _, err = status("--check", "--max-latency", "300")
    assert code == 1 and "queue 'search'" in err and "queue 'mail'" not in err
