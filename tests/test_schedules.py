"""Schedules kept in the database (``django_pgqueue.schedules``): created, paused,
resumed, changed and deleted at run time, each change taking effect at the next tick,
each tick enqueued once (two real sweeper processes racing on a pinned clock), and
bad input refused naming the field with nothing saved."""

from __future__ import annotations

import datetime as dt

import pytest
from django.test import override_settings

from django_pgqueue import periodic, schedules
from django_pgqueue.models import Job, Schedule, ScheduleDefinition

TASK = "tests.tasks.record_tick"
T0 = dt.datetime(2030, 1, 1, 12, 0, 0, tzinfo=dt.UTC)


def at(minutes: int) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes)


def sweep(minutes: int) -> list[periodic.EnqueuedTick]:
    return periodic.enqueue_due(using="default", now=at(minutes))


def run_ats() -> list[dt.datetime]:
    return list(Job.objects.order_by("run_at").values_list("run_at", flat=True))


def life_cycle(sweep_at) -> None:
    """The same story for the in-process and the process test: created, ticking,
    paused, resumed, changed, deleted."""
    schedules.create("db", TASK, "* * * * *", args=["x"], queue="cron")
    sweep_at(0)  # first seen: no job for a past tick
    sweep_at(1)
    sweep_at(2)
    schedules.pause("db")
    sweep_at(3)
    schedules.resume("db")
    sweep_at(4)
    schedules.update("db", cron="*/5 * * * *")
    sweep_at(5)
    sweep_at(6)
    schedules.delete("db")
    sweep_at(10)


EXPECTED = [at(1), at(2), at(4), at(5)]


@pytest.mark.django_db
def test_schedules__life_cycle_gives_exactly_the_expected_ticks():
    life_cycle(lambda minutes: (sweep(minutes), sweep(minutes)))
    assert run_ats() == EXPECTED
    assert {(q, tuple(a)) for q, a in Job.objects.values_list("queue", "args")} == {
        ("cron", ("x",))
    }
    assert not ScheduleDefinition.objects.exists() and not Schedule.objects.exists()


@pytest.mark.django_db
def test_schedules__unique_for_and_dst_hold_as_for_settings_entries():
    schedules.create("u", TASK, "* * * * *", unique_for=dt.timedelta(minutes=3))
    for minute in range(0, 8):
        sweep(minute)
        Job.objects.update(status="done")  # a live job would hold the key past its window
    assert run_ats() == [at(1), at(4), at(7)]  # one job a window
    Job.objects.all().delete()
    schedules.delete("u")
    schedules.create("berlin", TASK, "30 2 * * *", timezone="Europe/Berlin")
    jump = dt.datetime(2030, 3, 31, 0, 59, tzinfo=dt.UTC)  # 01:59 CET, 02:00 is skipped
    periodic.enqueue_due(using="default", now=jump)
    periodic.enqueue_due(using="default", now=jump + dt.timedelta(minutes=2))
    assert run_ats() == [dt.datetime(2030, 3, 31, 1, 0, tzinfo=dt.UTC)]  # 03:00 CEST


@pytest.mark.django_db
def test_schedules__run_now_enqueues_one_job_and_leaves_the_schedule():
    schedules.create("r", TASK, "0 0 1 1 *", args=["now"], priority=5)
    job = schedules.run_now("r")
    assert (job.task, job.args, job.priority, job.status) == (TASK, ["now"], 5, "pending")
    assert schedules.get("r").cron == "0 0 1 1 *"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("given", "field", "message"),
    [
        ({"cron": "every day"}, "cron", "has 2 fields"),
        ({"cron": "61 * * * *"}, "cron", "is invalid"),
        ({"cron": "* * * *\x00 *"}, "cron", "NUL"),
        ({"timezone": "Nowhere/Land"}, "timezone", "is not a known time zone"),
        ({"timezone": "Europe/Paris\x00"}, "timezone", "NUL"),
        ({"task": "no.such.module.task"}, "task", "no.such.module.task"),
        ({"task": "tests.raises_at_import.some_task"}, "task", "raised at import"),
        ({"task": "tests\x00.tasks"}, "task", "NUL"),
        ({"name": "bad\x00name"}, "name", "NUL"),
        ({"name": ""}, "name", "non-empty"),
        ({"name": "n" * 201}, "name", "over the limit of 200"),
        ({"name": "from-settings"}, "name", "entry of PGQUEUE_PERIODIC"),
        ({"args": "x"}, "args", "must be a list"),
        ({"kwargs": {"a": "\x00"}}, "kwargs", "NUL"),
        ({"priority": 1000}, "priority", "priority"),
        ({"queue": "no spaces"}, "queue", "queue"),
        ({"unique_for": -1}, "unique_for", "unique_for"),
    ],
)
@override_settings(PGQUEUE_PERIODIC={"from-settings": {"task": TASK, "cron": "@daily"}})
def test_schedules__bad_input_is_refused_naming_the_field_nothing_saved(given, field, message):
    values = {"name": "n", "task": TASK, "cron": "* * * * *", **given}
    with pytest.raises(schedules.ScheduleError) as caught:
        schedules.create(values.pop("name"), values.pop("task"), values.pop("cron"), **values)
    assert list(caught.value.errors) == [field]
    assert message in caught.value.errors[field]
    assert not ScheduleDefinition.objects.exists()
    schedules.create("ok", TASK, "* * * * *")
    if field != "name":
        with pytest.raises(schedules.ScheduleError, match=field):
            schedules.update("ok", **{field: given[field]})
        assert schedules.get("ok").cron == "* * * * *" and schedules.get("ok").task == TASK


@pytest.mark.django_db
def test_schedules__unknown_names_and_fields_are_refused():
    with pytest.raises(schedules.ScheduleError, match="no database schedule is named 'x'"):
        schedules.pause("x")
    schedules.create("a", TASK, "* * * * *")
    with pytest.raises(schedules.ScheduleError, match="a database schedule named 'a' exists"):
        schedules.create("a", TASK, "* * * * *")
    with pytest.raises(schedules.ScheduleError, match="unknown field"):
        schedules.update("a", name="b")


@pytest.mark.django_db
def test_schedules__a_settings_entry_added_later_shadows_the_database_one(caplog):
    schedules.create("same", TASK, "* * * * *", args=["db"])
    with override_settings(PGQUEUE_PERIODIC={"same": {"task": TASK, "cron": "* * * * *"}}):
        sweep(0)
        sweep(1)
    assert list(Job.objects.values_list("args", flat=True)) == [[]]  # the settings' job
    assert "shadowed by the PGQUEUE_PERIODIC entry" in caplog.text


@pytest.mark.slow
def test_pgqueue_sweep__two_sweeper_processes_tick_a_database_schedule_once(
    transactional_db, manage
):
    """Two real ``pgqueue_sweep`` processes at each pinned instant, racing; the
    schedule changed between instants from this process."""

    def sweep_at(minutes: int) -> None:
        args = ("pgqueue_sweep", "--now", at(minutes).isoformat())
        procs = [manage(*args) for _ in range(2)]
        for proc in procs:
            assert proc.wait() == 0, proc.output()

    life_cycle(sweep_at)
    assert run_ats() == EXPECTED
