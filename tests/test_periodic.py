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
from django_pgqueue.models import Job, JobKey, Schedule
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
        (entry(unique_for=0), "unique_for must be a number of seconds > 0"),
        (entry(unique_for="1h"), "unique_for must be a number of seconds > 0"),
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


@override_settings(PGQUEUE_PERIODIC={"e": entry(unique_for=dt.timedelta(minutes=5))})
def test_enqueue_due__unique_for_makes_one_job_a_window_and_ticks_once(db, caplog):
    """Issue 21: a periodic entry with unique_for shares one key (periodic:<name>) and
    a window: ticks inside the window of its last job (done here) enqueue nothing."""
    sweep(T0)
    caplog.set_level("INFO", logger="django_pgqueue.periodic")
    for minute in range(1, 12):
        at = T0 + dt.timedelta(minutes=minute, seconds=5)
        sweep(at)
        Job.objects.filter(status="pending").update(status="done", finished_at=at)
    assert run_ats() == [T0 + dt.timedelta(minutes=m) for m in (1, 6, 11)]
    assert set(Job.objects.values_list("idempotency_key", flat=True)) == {"periodic:e"}
    first = Job.objects.order_by("id").first()
    assert "tick 2030-01-01T12:02:00+00:00 not enqueued: the window of job" in caplog.text
    assert f"job {first.id} holds its key periodic:e" in caplog.text
    # Each tick was taken once: sweeping a minute again changes nothing.
    assert Schedule.objects.get(name="e").last_tick == T0 + dt.timedelta(minutes=11)
    assert sweep(T0 + dt.timedelta(minutes=11, seconds=30)) == []


@override_settings(PGQUEUE_PERIODIC={"e": entry(unique_for=60)})
def test_enqueue_due__unique_for_window_of_a_tick_a_live_job_kept_out_is_given_back(db):
    """A window that closed while its job is still live: the next tick opens a window,
    but the live job holds the key, so no job is made and the window is given back (as
    enqueue(unique_for=...) rolls it back); the tick after the job ended makes one."""
    sweep(T0)
    (first,) = sweep(T0 + dt.timedelta(minutes=1, seconds=5))
    assert sweep(T0 + dt.timedelta(minutes=2, seconds=10)) == []  # window closed, job live
    assert not JobKey.objects.filter(key="periodic:e").exists()  # given back
    Job.objects.update(status="done", finished_at=T0 + dt.timedelta(minutes=2, seconds=20))
    (second,) = sweep(T0 + dt.timedelta(minutes=3, seconds=5))
    assert second.job_id != first.job_id
    assert JobKey.objects.get(key="periodic:e").job_id == second.job_id


@override_settings(PGQUEUE_PERIODIC={"e": entry(unique_for=3600)})
def test_enqueue_due__unique_for_window_is_shared_with_enqueue_of_its_key(db):
    """An enqueue of the entry's key with unique_for inside the window returns the
    periodic job (whatever its state), and a periodic tick inside the window of an
    enqueued job makes none."""
    sweep(T0)
    (ticked,) = sweep(T0 + dt.timedelta(minutes=1, seconds=5))
    Job.objects.update(status="done", finished_at=T0 + dt.timedelta(minutes=1, seconds=6))
    queue = Job.objects.get(pk=ticked.job_id).queue
    again = Job.objects.enqueue(
        TASK, ["y"], queue=queue, idempotency_key="periodic:e", unique_for=3600
    )
    assert again.id == ticked.job_id
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
    every_5 = entry(cron="*/5 * * * *")
    with override_settings(PGQUEUE_PERIODIC={"e": every_5}):
        sweep(T0)
    with override_settings(PGQUEUE_PERIODIC={"e": {**every_5, "enabled": False}}):
        assert sweep(T0 + dt.timedelta(minutes=10, seconds=30)) == []
        assert Schedule.objects.get().enabled is False
        assert sweep(T0 + dt.timedelta(minutes=12)) == []  # 12:10 is now past the grace
    with override_settings(PGQUEUE_PERIODIC={"e": every_5}):
        assert sweep(T0 + dt.timedelta(minutes=13)) == []
        (ticked,) = sweep(T0 + dt.timedelta(minutes=15))
    assert ticked.tick == T0 + dt.timedelta(minutes=15)
    assert run_ats() == [T0 + dt.timedelta(minutes=15)]


@pytest.mark.parametrize(
    ("change", "late", "enqueued"),
    [
        ({"cron": "30 * * * *"}, 59, True),
        ({"cron": "30 * * * *"}, 61, False),
        ({"timezone": "Asia/Kolkata"}, 59, True),  # 0 * * * * there is :30 UTC
        ({"timezone": "Asia/Kolkata"}, 61, False),
        ({"enabled": True}, 59, True),
        ({"enabled": True}, 61, False),
    ],
)
def test_enqueue_due__changed_definition_skips_only_ticks_older_than_the_grace(
    db, change, late, enqueued
):
    """A change takes effect at its next tick: a latest tick of the new definition older
    than CHANGE_GRACE came before the change and is skipped; a fresher one is due."""
    before = entry(cron="0 * * * *", timezone="UTC", enabled="enabled" not in change)
    with override_settings(PGQUEUE_PERIODIC={"e": before}):
        sweep(T0)
    new_tick = T0 + dt.timedelta(minutes=30 if "enabled" not in change else 60)
    assert periodic.CHANGE_GRACE == dt.timedelta(seconds=60)
    with override_settings(PGQUEUE_PERIODIC={"e": {**before, **change}}):
        ticked = sweep(new_tick + dt.timedelta(seconds=late))
        assert [t.tick for t in ticked] == ([new_tick] if enqueued else [])
        assert Schedule.objects.get().last_tick == new_tick
        assert sweep(new_tick + dt.timedelta(seconds=90)) == []  # never twice


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (entry(cron="*/10 * * * *"), entry(cron="*/15 * * * *")),
        (
            entry(cron="0 * * * *", timezone="UTC"),
            entry(cron="0 * * * *", timezone="Asia/Kolkata"),
        ),
        (entry(cron="*/5 * * * *"), entry(cron="*/5 * * * *", enabled=False)),
    ],
    ids=["another-cron", "another-time-zone", "enabled-and-disabled"],
)
def test_enqueue_due__two_sweepers_with_two_definitions_keep_ticking(db, first, second):
    """A rolling deploy: two sweepers, each every 30 s, disagree on one entry for five
    hours. Neither starves the other: every fresh tick of an enabled definition is
    enqueued once, in order."""
    step = dt.timedelta(seconds=30)
    start, hours = T0 + dt.timedelta(seconds=1), 5
    at = start
    while at < start + dt.timedelta(hours=hours):
        with override_settings(PGQUEUE_PERIODIC={"e": second}):
            sweep(at)  # right after each tick (start is 1 s past one): first to see it
        with override_settings(PGQUEUE_PERIODIC={"e": first}):
            sweep(at + step / 2)
        at += step
    last = at - step / 2
    baseline = periodic.parse_entry("e", second).latest_tick(start)  # the new row's
    assert baseline is not None
    expected: set[dt.datetime] = set()
    for raw in (first, second):
        if raw.get("enabled", True):
            parsed = periodic.parse_entry("e", raw)
            tick = parsed.next_tick(baseline)
            while tick is not None and tick <= last:
                expected.add(tick)
                tick = parsed.next_tick(tick)
    ticks = run_ats()
    assert len(ticks) == len(set(ticks))  # one job per instant
    assert len(expected) >= hours  # each enabled definition ticks at least hourly
    assert set(ticks) == expected


# --- the database clock steps -------------------------------------------------------------


@override_settings(
    PGQUEUE_PERIODIC={"minutely": entry(), "hourly": entry(cron="0 * * * *", timezone="UTC")}
)
def test_sweeper__clock_stepping_forward_then_back_runs_no_tick_early_and_keeps_ticking(db):
    """The database clock jumps an hour ahead for one pass, then comes back. The jump is
    missed time (one job per entry, for its latest tick: no burst); once back, those
    jobs wait for their time (scheduled), and the entries tick on the corrected clock
    instead of waiting an hour for it to catch up. No instant gets two jobs."""
    from django_pgqueue import sweeper

    def sweep_at(at: dt.datetime) -> int:
        # A sweeper's pass with the whole database clock pinned: Sweeper(now=...) pins
        # only the periodic part, sweeper.sweep(now=...) the maintenance passes too.
        sweeper.sweep(using="default", now=at)
        ticks = periodic.enqueue_due(using="default", now=at)
        early = Job.objects.filter(status="pending", run_at__gt=at)
        assert list(early.values_list("run_at", flat=True)) == [], f"pending early at {at}"
        return len(ticks)

    sweep_at(T0 + dt.timedelta(seconds=30))
    assert sweep_at(T0 + dt.timedelta(minutes=1, seconds=30)) == 1
    assert sweep_at(T0 + dt.timedelta(hours=1, minutes=2, seconds=30)) == 2  # the jump
    assert sweep_at(T0 + dt.timedelta(minutes=2, seconds=40)) == 0  # back
    for minute in range(3, 64):
        assert sweep_at(T0 + dt.timedelta(minutes=minute, seconds=30)) == (
            0 if minute == 62 else 1  # 13:02 is the job the jump enqueued
        )
    minutely = sorted(
        Job.objects.filter(idempotency_key__startswith="periodic:minutely:").values_list(
            "run_at", flat=True
        )
    )
    assert minutely == [T0 + dt.timedelta(minutes=m) for m in [1, *range(3, 64)]]
    hourly = list(
        Job.objects.filter(idempotency_key__startswith="periodic:hourly:").values_list(
            "run_at", "status"
        )
    )
    assert hourly == [(T0 + dt.timedelta(hours=1), "pending")]  # promoted at its time


@pytest.mark.parametrize(
    ("task", "message"),
    [
        ("tests.raises_at_import.some_task", "raised at import: RuntimeError: settings for"),
        ("tests.broken_at_import.some_task", "raised at import: SystemExit: broken at import"),
    ],
)
def test_check_periodic__task_module_raising_at_import_is_e030_not_a_crash(task, message):
    with override_settings(PGQUEUE_PERIODIC={"good": entry(), "stale": entry(task=task)}):
        (error,) = check_periodic()
        assert (error.id, error.level) == ("pgqueue.E030", 40)
        assert error.msg.startswith(f"PGQUEUE_PERIODIC['stale']: task {task!r} {message}")
        valid, _ = periodic.entries()
        assert [e.name for e in valid] == ["good"]


@pytest.mark.parametrize(
    ("name", "overrides", "message"),
    [
        ("nul\x00", {}, "the name 'nul\\x00' contains a NUL character"),
        ("sur\ud800", {}, "the name 'sur\\ud800' contains a lone surrogate"),
        (
            "e",
            {"task": "tests.tasks.record_tick\x00"},
            "task 'tests.tasks.record_tick\\x00' contains a NUL",
        ),
        ("e", {"task": "tests.\udcff.x"}, "contains a lone surrogate"),
        ("e", {"cron": "* * * * *\x00"}, "cron '* * * * *\\x00' contains a NUL"),
        (
            "e",
            {"cron": "* * * * " + ",".join(["1"] * 200)},
            "cron is 407 characters, over the limit of 255",
        ),
        ("e", {"timezone": "UTC\x00"}, "timezone 'UTC\\x00' contains a NUL"),
        ("e", {"timezone": "Europe/\ud800"}, "contains a lone surrogate"),
    ],
)
def test_parse_entry__text_postgresql_cannot_store_is_rejected(name, overrides, message):
    with pytest.raises(InvalidJob, match=re.escape(message)):
        periodic.parse_entry(name, entry(**overrides))


@override_settings(
    PGQUEUE_PERIODIC={
        "ok": entry(),
        "nul\x00": entry(),
        "sur\ud800": entry(),
        "bad-zone": entry(timezone="UTC\x00"),
    }
)
def test_enqueue_due__unstorable_entries_are_reported_and_skipped_the_rest_tick(db, caplog):
    errors = check_periodic()
    assert sorted(e.obj for e in errors) == [
        "PGQUEUE_PERIODIC['bad-zone']",
        "PGQUEUE_PERIODIC['nul\\x00']",
        "PGQUEUE_PERIODIC['sur\\ud800']",
    ]
    sweep(T0)
    assert [t.name for t in sweep(T0 + dt.timedelta(minutes=1))] == ["ok"]
    assert list(Schedule.objects.values_list("name", flat=True)) == ["ok"]
    assert "periodic entry 'nul\\x00' skipped: the name" in caplog.text


@override_settings(
    PGQUEUE_PERIODIC={"e": entry(), "stale": entry(task="tests.raises_at_import.some_task")}
)
def test_sweeper__bad_entry_is_logged_at_error_once_not_every_pass(db, caplog):
    from django_pgqueue.sweeper import Sweeper

    sweeper = Sweeper(now=T0, now_step=60)
    for _ in range(4):
        sweeper.run_once()
    skipped = [r for r in caplog.records if "periodic entry 'stale' skipped" in r.getMessage()]
    assert [r.levelname for r in skipped] == ["ERROR"]
    assert "RuntimeError: settings for the old reports app are gone" in skipped[0].getMessage()
    assert Job.objects.count() == 3  # the good entry ticked at each pass after the first
    stale = entry(task="tests.tasks.nope")  # another problem: said again, once
    with override_settings(PGQUEUE_PERIODIC={"e": entry(), "stale": stale}):
        sweeper.run_once()
        sweeper.run_once()
    skipped = [r for r in caplog.records if "periodic entry 'stale' skipped" in r.getMessage()]
    assert len(skipped) == 2 and "does not import" in skipped[1].getMessage()


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
        "concurrency_keys": [""],
        "unique_fors": [None],
        "tags": ["[]"],
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
        # In the entry's time zone, named, with its offset (issue 28 item 11).
        shown = re.fullmatch(r"(\S+ \d\d:00:00) \S+ \(UTC([+-]\d\d:\d\d)\)", next_tick)
        assert shown is not None, next_tick
        when = dt.datetime.fromisoformat(f"{shown[1]}{shown[2]}")
        assert when > dt.datetime.now(dt.UTC)
        detail = admin_client.get(reverse("admin:django_pgqueue_schedule_change", args=["gone"]))
        assert detail.status_code == 200
        assert b'name="_save"' not in detail.content  # read-only
    assert admin_client.post(reverse("admin:django_pgqueue_schedule_add"), {}).status_code == 403


@override_settings(
    PGQUEUE_PERIODIC={
        f"e{i}": entry(cron="*/5 * * * *" if i % 2 else "* * * * *") for i in range(20)
    }
)
def test_enqueue_due__four_statements_a_pass_however_many_entries(db, django_assert_num_queries):
    sweep(T0)
    with django_assert_num_queries(4):  # database schedules, clock, sync, enqueue
        ticked = sweep(T0 + dt.timedelta(minutes=5))
    assert sorted(t.name for t in ticked) == sorted(f"e{i}" for i in range(20))
    with django_assert_num_queries(4):
        ticked = sweep(T0 + dt.timedelta(minutes=6))
    assert sorted(t.name for t in ticked) == sorted(f"e{i}" for i in range(0, 20, 2))
    assert Job.objects.count() == 30


STALE_ENTRIES = {
    "good": entry(),
    "stale": entry(task="tests.raises_at_import.some_task"),
    "nul\x00": entry(),
    "sur\ud800": entry(),
}


@pytest.mark.slow
def test_check__stale_entries_are_e030_errors_naming_the_exception(transactional_db, manage):
    proc = manage("check", env=sweeper_env(**STALE_ENTRIES))
    assert proc.wait() == 1, proc.output()
    output = proc.output()
    assert "Traceback" not in output
    assert "(pgqueue.E030) PGQUEUE_PERIODIC['stale']: task 'tests.raises_at_import." in output
    assert "RuntimeError: settings for the old reports app are gone" in output
    assert "PGQUEUE_PERIODIC['nul\\x00']: the name" in output
    assert "PGQUEUE_PERIODIC['sur\\ud800']: the name" in output


@pytest.mark.slow
def test_pgqueue_worker__stale_entries_are_warnings_and_the_worker_runs(
    transactional_db, manage, job_factory
):
    job = job_factory()
    proc = manage("pgqueue_worker", "--burst", env=sweeper_env(**STALE_ENTRIES))
    assert proc.wait() == 0, proc.output()
    assert "WARNINGS:" in proc.output() and "(pgqueue.E030)" in proc.output()
    assert Job.objects.get(id=job.id).status == "done"


@pytest.mark.slow
def test_pgqueue_sweep__stale_entries_are_skipped_logged_once_and_the_rest_tick(
    transactional_db, manage
):
    args = ("pgqueue_sweep", "--loop", "--interval", "0.1", "--now", T0.isoformat())
    proc = manage(*args, "--now-step", "60", env=sweeper_env(**STALE_ENTRIES))

    def ticked() -> bool:
        assert proc.popen.poll() is None, proc.output()  # the sweeper died: say why
        return Job.objects.count() >= 5

    wait_for(ticked, timeout=60)
    proc.signal(15)
    assert proc.wait() == 0, proc.output()
    output = proc.output()
    assert "SIGTERM received: finishing the current sweep pass, then exiting" in output
    assert "(pgqueue.E030)" in output  # the start-up check, as a warning
    for name in ("'stale'", "'nul\\x00'", "'sur\\ud800'"):
        skipped = [
            line for line in output.splitlines() if f"periodic entry {name} skipped" in line
        ]
        assert len(skipped) == 1 and " ERROR " in skipped[0], output
    assert "sweep failed" not in output
    assert set(Job.objects.values_list("idempotency_key", flat=True)) == {
        f"periodic:good:{tick.isoformat()}" for tick in run_ats()
    }


@override_settings(
    PGQUEUE_PERIODIC={"tagged": {"task": "tests.tasks.tagged", "cron": "* * * * *", "args": [1]}}
)
def test_enqueue_due__a_tagged_task_job_carries_its_tags(db):
    """@task(tags=...) on every path: a periodic entry's job (settings or database
    schedule: the same statement) carries its task's tags, as one enqueued does."""
    sweep(T0)
    (ticked,) = sweep(T0 + dt.timedelta(minutes=1, seconds=5))
    assert Job.objects.get(pk=ticked.job_id).tags == ["billing", "nightly"]
