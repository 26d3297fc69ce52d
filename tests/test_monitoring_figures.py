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


# --- item 4: throughput after a burst -------------------------------------------------

#: Jobs done in each of the last three whole minutes (the first busier than the count
#: cap of the test below) and in the last 8 seconds: a burst, not a steady rate.
BURST = (12_000, 3_400, 700)
LAST_SECONDS = 11_000


def insert_done(minutes_ago: int, jobs: int, queue: str = "burst") -> None:
    """``jobs`` done jobs finished in the minute ``minutes_ago`` before this one,
    unevenly (most in its first seconds); with ``minutes_ago`` 0, in the last 8 s."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgqueue_job (backend, queue, task, args, kwargs, priority, status,"
            " attempts, max_attempts, run_at, errors, created_at, finished_at, started_at,"
            " last_attempted_at, lease_owner)"
            " SELECT 'default', %(queue)s, 't', '[]', '{}', 0, 'done', 1, 1, f - interval '2 s',"
            " '[]', f - interval '2 s', f, f - interval '1 s', f - interval '1 s', 'w'"
            " FROM (SELECT CASE WHEN %(ago)s = 0"
            "   THEN clock_timestamp() - (g::float / %(n)s) * interval '8 s'"
            "   ELSE date_trunc('minute', clock_timestamp())"
            "        - %(ago)s * interval '1 minute' + (g::float / %(n)s) ^ 3 * interval '59 s'"
            "   END AS f FROM generate_series(1, %(n)s) AS g) AS t",
            {"queue": queue, "ago": minutes_ago, "n": jobs},
        )


def truth_per_minute() -> dict[dt.datetime, int]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT date_trunc('minute', finished_at), count(*) FROM pgqueue_job"
            " WHERE status = 'done' GROUP BY 1"
        )
        return dict(cursor.fetchall())


@pytest.fixture
def burst():
    for ago, jobs in zip((3, 2, 1), BURST, strict=True):
        insert_done(ago, jobs)
    insert_done(0, LAST_SECONDS)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE pgqueue_job")


def test_history__per_minute_bars_are_exact_or_a_marked_lower_bound(burst):
    truth = truth_per_minute()
    hist = monitoring.history(minutes=5)  # counts up to 10,000 a minute by default
    seen = {m.start: m for m in hist.minutes}
    for start, jobs in truth.items():
        if start not in seen:  # the burst's last seconds straddle a minute
            continue
        assert seen[start].finished == min(jobs, 10_000), start
        assert seen[start].lower_bound == (jobs >= 10_000), start
    assert any(m.lower_bound for m in hist.minutes)
    # A cap above every minute: each bar is the GROUP BY's count.
    exact = monitoring.history(minutes=5, count_cap=50_000)
    assert {m.start: m.finished for m in exact.minutes if m.finished} == {
        start: jobs for start, jobs in truth.items() if start >= exact.minutes[0].start
    }
    assert not any(m.estimated for m in exact.minutes)


def test_status__throughput_after_a_burst_is_never_scaled_up(burst):
    """The newest 10,000 done jobs span 8 s: they were scaled by 300 / 8 as if steady
    (the issue saw done/5m ~738,652 after 20,000 jobs). Now a capped count is a lower
    bound, at most the truth, and marked as one."""
    code, out, err = status("--json")
    assert code == 0, err
    q = json.loads(out)["queues"]["burst"]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FILTER (WHERE finished_at >= clock_timestamp() - interval '300 s'),"
            " count(*) FILTER (WHERE finished_at >= clock_timestamp() - interval '60 s')"
            " FROM pgqueue_job WHERE status = 'done'"
        )
        done_5m, last_minute = cursor.fetchone()
    assert q["done_5m"] == monitoring.DEFAULT_CAP <= done_5m
    assert q["finished_per_second"] * 60 <= last_minute + 1
    assert {"done_5m", "finished_per_second"} <= set(q["lower_bound"])
    code, table, _ = status()
    line = next(line for line in table.splitlines() if line.startswith("burst"))
    assert f"≥ {monitoring.DEFAULT_CAP:,}" in line and "~" not in line


def test_status__throughput_below_the_cap_is_exact(job_factory):
    insert_done(0, 300)
    insert_done(2, 900)
    q = monitoring.snapshot().queues["burst"]
    assert (q.done_5m, round(q.finished_per_second * 60), q.lower_bound) == (
        1_200,
        300,
        frozenset(),
    )


def test_dashboard__lower_bound_bars_are_hatched(burst, admin_client):
    from django.urls import reverse

    page = admin_client.get(reverse("admin:django_pgqueue_dashboard_changelist"))
    html = page.content.decode()
    assert page.status_code == 200
    assert 'data-lower-bound="True"' in html and "url(#pgqueue-hatch-" in html
    assert "at least 10k finished" in html
