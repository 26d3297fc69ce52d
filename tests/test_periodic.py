"""Periodic jobs: entries, cron ticks (DST included), exactly-once enqueue, sweepers."""

from __future__ import annotations

import datetime as dt
import json
import re
from zoneinfo import ZoneInfo

import pytest
from django.test import override_settings

from django_pgqueue import periodic
from django_pgqueue.checks import check_periodic
from django_pgqueue.exceptions import InvalidJob
from django_pgqueue.models import Job, Schedule
from django_pgqueue.taskapi import FRAMEWORK

from .conftest import wait_for

TASK = "tests.tasks.record_tick"
T0 = dt.datetime(2030, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
BERLIN = ZoneInfo("Europe/Berlin")


def entry(**overrides: object) -> dict[str, object]:
    return {"task": TASK, "cron": "* * * * *", "args": ["x"], **overrides}


def sweep(at: dt.datetime) -> list[periodic.EnqueuedTick]:
    return periodic.enqueue_due(using="default", now=at)


def run_ats() -> list[dt.datetime]:
    return list(Job.objects.order_by("run_at").values_list("run_at", flat=True))


# --- entries and cron ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (entry(task="tests.tasks.nope"), "does not import"),
        (entry(task="testproject.demo.tasks.not_a_task"), f"not a {FRAMEWORK}.Task"),
        (entry(cron="61 * * * *"), "Bad minute"),
        (entry(cron="* * * *"), "has 4 fields"),
        (entry(cron="0 * * * * *"), "has 6 fields"),
        (entry(cron="@fortnightly"), "not a known alias"),
        (entry(cron=5), "cron must be a non-empty string"),
        (entry(timezone="Mars/Olympus"), "not a known time zone"),
        (entry(args="x"), "args must be a list"),
        (entry(args=[object()]), "args"),
        (entry(kwargs=[1]), "kwargs must be a dict"),
        (entry(queue="no spaces"), "queue name"),
        (entry(priority=1000), "out of range"),
        (entry(max_attempts=0), "max_attempts"),
        (entry(enabled="yes"), "enabled must be True or False"),
        (entry(backend="nope"), "backend 'nope' is not an alias in settings.TASKS"),
        (entry(schedule="daily"), "unknown key(s) 'schedule'"),
        ({"cron": "* * * * *"}, "'task' key is missing"),
        ("0 3 * * *", "must be a dict"),
    ],
)
def test_parse_entry__bad_entry_is_rejected_with_a_reason(raw, message):
    with pytest.raises(InvalidJob, match=re.escape(message)):
        periodic.parse_entry("nightly", raw)


def test_parse_cron__aliases_mean_their_5_field_expressions():
    assert periodic.parse_cron("@hourly") == "0 * * * *"
    assert periodic.parse_cron("@DAILY") == "0 0 * * *"
    assert periodic.parse_cron("@weekly") == "0 0 * * 0"
    assert periodic.parse_cron("*/15 9-17 * * MON-FRI") == "*/15 9-17 * * MON-FRI"


def test_check_periodic__names_each_bad_entry():
    with override_settings(
        PGQUEUE_PERIODIC={
            "good": entry(),
            "bad-cron": entry(cron="every day"),
            "bad-zone": entry(timezone="Nowhere/Land"),
        }
    ):
        errors = check_periodic()
    assert [e.id for e in errors] == ["pgqueue.E030", "pgqueue.E030"]
    assert errors[0].msg.startswith("PGQUEUE_PERIODIC['bad-cron']: cron 'every day'")
    assert errors[1].msg.startswith("PGQUEUE_PERIODIC['bad-zone']: timezone 'Nowhere/Land'")
    with override_settings(PGQUEUE_PERIODIC={"good": entry()}):
        assert check_periodic() == []
    with override_settings(PGQUEUE_PERIODIC=[entry()]):
        assert "must be a dict of entries" in check_periodic()[0].msg


def test_latest_tick__at_or_before_now():
    tick = periodic.latest_tick("0 3 * * *", T0)
    assert tick == dt.datetime(2030, 1, 1, 3, 0, tzinfo=dt.UTC)
    assert periodic.latest_tick("0 12 * * *", T0) == T0  # "at or before": now itself
    assert periodic.latest_tick("0 12 * * *", T0 - dt.timedelta(seconds=1)) == T0 - dt.timedelta(
        days=1
    )


def berlin_ticks(cron: str, start: dt.datetime, hours: int) -> list[str]:
    """The ticks a sweeper every 5 minutes enqueues over ``hours`` from ``start``, as
    Berlin wall-clock times with their offsets."""
    step = dt.timedelta(minutes=5)
    at = start.astimezone(dt.UTC)  # real time: wall-clock arithmetic would skip the fold
    seen = []
    with override_settings(PGQUEUE_PERIODIC={"e": entry(cron=cron, timezone="Europe/Berlin")}):
        for _ in range(hours * 12):
            seen.extend(t.tick for t in sweep(at))
            at += step
    return [t.astimezone(BERLIN).strftime("%H:%M%z") for t in seen]


# 2030-03-31: Berlin skips 02:00-03:00 (01:00 UTC). 2030-10-27: it repeats 02:00-03:00.
SPRING = dt.datetime(2030, 3, 30, 23, 0, tzinfo=BERLIN)
AUTUMN = dt.datetime(2030, 10, 26, 23, 0, tzinfo=BERLIN)


def test_enqueue_due__fixed_time_in_a_skipped_hour_runs_right_after_the_jump(db):
    assert berlin_ticks("30 2 * * *", SPRING, 6) == ["03:00+0200"]


def test_enqueue_due__fixed_time_in_a_repeated_hour_runs_once(db):
    assert berlin_ticks("30 2 * * *", AUTUMN, 6) == ["02:30+0200"]


def test_enqueue_due__hourly_has_no_tick_in_a_skipped_hour(db):
    assert berlin_ticks("0 * * * *", SPRING, 5) == [
        "00:00+0100",
        "01:00+0100",
        "03:00+0200",
        "04:00+0200",
    ]


def test_enqueue_due__hourly_ticks_twice_in_a_repeated_hour(db):
    assert berlin_ticks("0 * * * *", AUTUMN, 6) == [
        "00:00+0200",
        "01:00+0200",
        "02:00+0200",
        "02:00+0100",
        "03:00+0100",
    ]


# --- enqueueing ticks ---------------------------------------------------------------------


@override_settings(PGQUEUE_PERIODIC={"every-minute": entry(queue="cron", priority=7)})
def test_enqueue_due__new_entry_starts_at_its_next_tick(db):
    assert sweep(T0 + dt.timedelta(seconds=30)) == []  # first sight: baseline, no job
    row = Schedule.objects.get()
    assert (row.last_tick, row.last_job_id, row.cron) == (T0, None, "* * * * *")
    assert sweep(T0 + dt.timedelta(seconds=59)) == []
    (ticked,) = sweep(T0 + dt.timedelta(seconds=61))
    tick = T0 + dt.timedelta(minutes=1)
    assert ticked.tick == tick
    job = Job.objects.get()
    assert (job.id, job.task, job.args, job.queue, job.priority, job.status, job.run_at) == (
        ticked.job_id,
        TASK,
        ["x"],
        "cron",
        7,
        "pending",
        tick,
    )
    assert job.idempotency_key == "periodic:every-minute:2030-01-01T12:01:00+00:00"
    row.refresh_from_db()
    assert (row.last_tick, row.last_job_id) == (tick, job.id)


@override_settings(PGQUEUE_PERIODIC={"e": entry()})
def test_enqueue_due__a_tick_is_enqueued_once_even_after_its_job_finished(db):
    sweep(T0)
    at = T0 + dt.timedelta(minutes=1, seconds=5)
    assert len(sweep(at)) == 1
    Job.objects.update(status="done", finished_at=at)
    assert sweep(at) == []
    assert sweep(at + dt.timedelta(seconds=10)) == []
    assert Job.objects.count() == 1


@override_settings(PGQUEUE_PERIODIC={"e": entry()})
def test_enqueue_due__missed_ticks_give_one_job_for_the_latest(db):
    sweep(T0)
    (ticked,) = sweep(T0 + dt.timedelta(hours=5, seconds=30))
    assert ticked.tick == T0 + dt.timedelta(hours=5)
    assert run_ats() == [T0 + dt.timedelta(hours=5)]


def test_enqueue_due__removed_entry_stops(db):
    with override_settings(PGQUEUE_PERIODIC={"a": entry(), "b": entry()}):
        sweep(T0)
        assert {t.name for t in sweep(T0 + dt.timedelta(minutes=1))} == {"a", "b"}
    with override_settings(PGQUEUE_PERIODIC={"a": entry()}):
        assert {t.name for t in sweep(T0 + dt.timedelta(minutes=2))} == {"a"}
    assert Job.objects.count() == 3


def test_enqueue_due__changed_cron_takes_effect_at_its_next_tick(db):
    with override_settings(PGQUEUE_PERIODIC={"e": entry(cron="0 3 * * *")}):
        sweep(T0)  # baseline: 03:00 today
    # 13:00 daily: its latest tick (12:00 today) came before the change and is not due.
    with override_settings(PGQUEUE_PERIODIC={"e": entry(cron="0 12 * * *")}):
        assert sweep(T0 + dt.timedelta(minutes=30)) == []
        assert Schedule.objects.get().cron == "0 12 * * *"
        (ticked,) = sweep(T0 + dt.timedelta(days=1))
    assert ticked.tick == T0 + dt.timedelta(days=1)
    assert run_ats() == [T0 + dt.timedelta(days=1)]


def test_enqueue_due__disabled_entry_enqueues_nothing_and_resumes_at_next_tick(db):
    with override_settings(PGQUEUE_PERIODIC={"e": entry()}):
        sweep(T0)
    with override_settings(PGQUEUE_PERIODIC={"e": entry(enabled=False)}):
        assert sweep(T0 + dt.timedelta(minutes=10)) == []
        assert Schedule.objects.get().enabled is False
    with override_settings(PGQUEUE_PERIODIC={"e": entry()}):
        assert sweep(T0 + dt.timedelta(minutes=10, seconds=30)) == []
        (ticked,) = sweep(T0 + dt.timedelta(minutes=11))
    assert ticked.tick == T0 + dt.timedelta(minutes=11)


@override_settings(PGQUEUE_PERIODIC={"e": entry(), "bad": entry(cron="nope")})
def test_enqueue_due__bad_entry_is_skipped_and_logged(db, caplog):
    sweep(T0)
    assert [t.name for t in sweep(T0 + dt.timedelta(minutes=1))] == ["e"]
    assert "periodic entry 'bad' skipped: cron 'nope'" in caplog.text
    assert "periodic e: enqueued tick 2030-01-01T12:01:00+00:00 as job" in caplog.text


@pytest.mark.concurrency
@override_settings(PGQUEUE_PERIODIC={"e": entry()})
def test_enqueue_due__row_locked_by_another_sweeper_is_skipped_without_waiting(
    transactional_db, other_connection
):
    sweep(T0)
    other = other_connection()
    tick_at = T0 + dt.timedelta(minutes=1)
    with other.transaction():
        other.execute("SELECT 1 FROM pgqueue_schedule WHERE name = 'e' FOR UPDATE")
        assert sweep(tick_at) == []  # SKIP LOCKED: no wait, no job
    assert len(sweep(tick_at)) == 1
    assert sweep(tick_at) == []
    assert run_ats() == [tick_at]


@pytest.mark.concurrency
@override_settings(PGQUEUE_PERIODIC={"e": entry()})
def test_schedule_enqueue_tick__second_statement_after_a_commit_changes_nothing(
    transactional_db, other_connection
):
    """Two sweepers racing on one tick: the one that waited re-checks the last tick."""
    from django_pgqueue import sql

    sweep(T0)
    tick = T0 + dt.timedelta(minutes=1)
    params = {
        "names": ["e"],
        "crons": ["* * * * *"],
        "timezones": ["UTC"],
        "ticks": [tick],
        "keys": [None],
        "backends": ["default"],
        "queues": ["default"],
        "tasks": [TASK],
        "args": ["[]"],
        "kwargs": ["{}"],
        "priorities": [0],
        "max_attempts": [1],
        "channel": "pgqueue_job",
        "now": tick,
    }
    first, second = other_connection(), other_connection()
    with first.transaction():
        assert len(first.execute(sql.SCHEDULE_ENQUEUE_TICKS, params).fetchall()) == 1
        assert second.execute(sql.SCHEDULE_ENQUEUE_TICKS, params).fetchall() == []
    assert second.execute(sql.SCHEDULE_ENQUEUE_TICKS, params).fetchall() == []
    second.commit()
    assert Job.objects.count() == 1


@override_settings(PGQUEUE_PERIODIC={"e": entry()})
def test_current_job__run_at_is_the_tick(run_worker):
    sweep(T0)
    sweep(T0 + dt.timedelta(minutes=1, seconds=20))
    run_worker()
    job = Job.objects.get()
    assert job.status == "done"
    assert job.result == (T0 + dt.timedelta(minutes=1)).isoformat()


# --- real sweeper processes ---------------------------------------------------------------


def sweeper_env(**entries: dict[str, object]) -> dict[str, str]:
    return {"PGQUEUE_PERIODIC": json.dumps(entries)}


@pytest.mark.slow
def test_pgqueue_sweep__two_sweepers_enqueue_each_of_100_ticks_once(transactional_db, manage):
    """Two looping sweepers over the same pinned clock, 30 s further at each pass (two
    passes per one-minute tick in each process, racing the other process)."""
    env = sweeper_env(e=entry())
    args = ("pgqueue_sweep", "--loop", "--interval", "0.1", "--now", T0.isoformat())
    sweepers = [manage(*args, "--now-step", "30", env=env) for _ in range(2)]
    last = T0 + dt.timedelta(minutes=100)

    def finished() -> bool:
        for proc in sweepers:
            assert proc.popen.poll() is None, proc.output()  # a sweeper died: say why
        return Job.objects.filter(run_at=last).exists()

    wait_for(finished, timeout=180)
    for proc in sweepers:
        proc.signal(2)
        assert proc.wait() == 0, proc.output()
    ticks = run_ats()
    expected = [T0 + dt.timedelta(minutes=i) for i in range(1, len(ticks) + 1)]
    assert len(ticks) >= 100
    assert ticks == expected  # every tick, in order, none twice
    logged = [
        line
        for proc in sweepers
        for line in proc.output().splitlines()
        if "periodic e: enqueued tick" in line
    ]
    assert len(logged) == len(ticks)  # one line per enqueued tick, across both


@pytest.mark.slow
def test_pgqueue_sweep__restart_after_missed_ticks_enqueues_one(transactional_db, manage):
    env = sweeper_env(e=entry(cron="*/5 * * * *"))
    first = manage("pgqueue_sweep", "--now", T0.isoformat(), env=env)
    assert first.wait() == 0, first.output()
    assert "periodic=0" in first.output()
    later = T0 + dt.timedelta(hours=3, minutes=2)
    second = manage("pgqueue_sweep", "--now", later.isoformat(), env=env)
    assert second.wait() == 0, second.output()
    assert "periodic=1" in second.output()
    assert "periodic e: enqueued tick 2030-01-01T15:00:00+00:00 as job" in second.output()
    assert run_ats() == [T0 + dt.timedelta(hours=3)]


@pytest.mark.slow
def test_pgqueue_sweep__now_step_without_now_is_refused(transactional_db, manage):
    proc = manage("pgqueue_sweep", "--now-step", "5")
    assert proc.wait() != 0
    assert "--now-step needs --now" in proc.output()


# --- admin --------------------------------------------------------------------------------


def test_schedule_admin__lists_cron_next_tick_and_last_job_read_only(admin_client):
    from django.urls import reverse

    with override_settings(PGQUEUE_PERIODIC={"<b>e</b>": entry(), "gone": entry()}):
        sweep(T0)
        (ticked, _) = sweep(T0 + dt.timedelta(minutes=1))
    with override_settings(PGQUEUE_PERIODIC={"<b>e</b>": entry(cron="@hourly")}):
        page = admin_client.get(reverse("admin:django_pgqueue_schedule_changelist"))
        assert page.status_code == 200
        html = page.content.decode()
        assert "&lt;b&gt;e&lt;/b&gt;" in html and "<b>e</b>" not in html  # escaped
        assert "removed from settings" in html  # "gone"
        job_url = reverse("admin:django_pgqueue_job_change", args=[ticked.job_id])
        assert f'<a href="{job_url}">job {ticked.job_id}</a>' in html
        row = page.context["cl"].result_list[0]
        model_admin = page.context["cl"].model_admin
        next_tick = model_admin.next_tick(row)
        assert next_tick.minute == 0 and next_tick > dt.datetime.now(dt.UTC)
        detail = admin_client.get(reverse("admin:django_pgqueue_schedule_change", args=["gone"]))
        assert detail.status_code == 200
        assert b'name="_save"' not in detail.content  # read-only
    assert admin_client.post(reverse("admin:django_pgqueue_schedule_add"), {}).status_code == 403


@override_settings(
    PGQUEUE_PERIODIC={
        f"e{i}": entry(cron="*/5 * * * *" if i % 2 else "* * * * *") for i in range(20)
    }
)
def test_enqueue_due__three_statements_a_pass_however_many_entries(db, django_assert_num_queries):
    sweep(T0)
    with django_assert_num_queries(3):  # clock, sync, enqueue
        ticked = sweep(T0 + dt.timedelta(minutes=5))
    assert sorted(t.name for t in ticked) == sorted(f"e{i}" for i in range(20))
    with django_assert_num_queries(3):
        ticked = sweep(T0 + dt.timedelta(minutes=6))
    assert sorted(t.name for t in ticked) == sorted(f"e{i}" for i in range(0, 20, 2))
    assert Job.objects.count() == 30
