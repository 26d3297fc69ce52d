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


# --- admin --------------------------------------------------------------------------------

ADD_URL = "admin:django_pgqueue_scheduledefinition_add"
LIST_URL = "admin:django_pgqueue_scheduledefinition_changelist"


def form(**overrides: str) -> dict[str, str]:
    return {
        "name": "nightly-42",
        "task": TASK,
        "cron": "30 2 * * *",
        "timezone": "Europe/Paris",
        "args": '["x"]',
        "kwargs": '{"customer_id": 42}',
        "queue": "",
        "priority": "",
        "enabled": "on",
        "unique_for": "",
        **overrides,
    }


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        ({"cron": "every day"}, "cron", "has 2 fields"),
        ({"cron": "61 * * * *"}, "cron", "is invalid"),
        ({"timezone": "Nowhere/Land"}, "timezone", "is not a known time zone"),
        ({"task": "no.such.module.task"}, "task", "no.such.module.task"),
        ({"name": "from-settings"}, "name", "entry of PGQUEUE_PERIODIC"),
        ({"name": "nul\x00"}, "name", "Null characters are not allowed"),
        ({"cron": "* * * * *\x00"}, "cron", "Null characters are not allowed"),
        ({"args": '{"a": 1}'}, "args", "must be a list"),
        ({"args": "not json"}, "args", "Enter a valid JSON"),
        ({"priority": "1000"}, "priority", "priority"),
        ({"unique_for": "-5"}, "unique_for", "unique_for"),
    ],
)
@override_settings(PGQUEUE_PERIODIC={"from-settings": {"task": TASK, "cron": "@daily"}})
def test_admin_add_form__refuses_each_bad_input_on_its_field(
    admin_client, overrides, field, message
):
    from django.urls import reverse

    page = admin_client.post(reverse(ADD_URL), form(**overrides))
    assert page.status_code == 200
    errors = page.context["adminform"].form.errors
    assert list(errors) == [field], errors
    assert message in " ".join(errors[field])
    assert not ScheduleDefinition.objects.exists()


@pytest.mark.django_db
def test_admin__add_edit_shows_next_runs_pause_resume_run_now_delete(admin_client):
    from django.urls import reverse

    page = admin_client.post(reverse(ADD_URL), form())
    assert page.status_code == 302, page.context and page.context["adminform"].form.errors
    row = schedules.get("nightly-42")
    assert (row.cron, row.timezone, row.kwargs) == (
        "30 2 * * *",
        "Europe/Paris",
        {"customer_id": 42},
    )
    change = reverse("admin:django_pgqueue_scheduledefinition_change", args=["nightly-42"])
    body = admin_client.get(change).content.decode()
    assert body.count(" 02:30 CE") == 5  # five next runs, in Paris time (CET or CEST)
    page = admin_client.post(change, {**form(cron="every"), "name": "nightly-42"})
    assert "has 1 fields" in str(page.context["adminform"].form.errors["cron"])
    assert schedules.get("nightly-42").cron == "30 2 * * *"
    page = admin_client.post(change, form(cron="0 3 * * *"))
    assert page.status_code == 302 and schedules.get("nightly-42").cron == "0 3 * * *"

    def act(action: str) -> list[str]:
        from django.contrib.messages import get_messages

        done = admin_client.post(
            reverse(LIST_URL),
            {"action": action, "_selected_action": ["nightly-42"], "index": "0", "post": "yes"},
        )
        return [str(m) for m in get_messages(done.wsgi_request)]

    act("pause_selected")
    assert schedules.get("nightly-42").enabled is False
    act("resume_selected")
    assert schedules.get("nightly-42").enabled is True
    act("run_now_selected")
    assert list(Job.objects.values_list("task", "args")) == [(TASK, ["x"])]
    sweep(0)
    assert Schedule.objects.filter(name="nightly-42").exists()
    act("delete_selected")
    assert not ScheduleDefinition.objects.exists() and not Schedule.objects.exists()


@pytest.mark.django_db
@override_settings(PGQUEUE_PERIODIC={"from-settings": {"task": TASK, "cron": "@daily"}})
def test_admin__settings_entries_are_listed_read_only_from_settings(admin_client):
    from django.urls import reverse

    schedules.create("db-one", TASK, "@hourly")
    sweep(0)
    page = admin_client.get(reverse("admin:django_pgqueue_schedule_changelist")).content.decode()
    assert "enabled, from settings" in page and "enabled, database" in page
    detail = reverse("admin:django_pgqueue_schedule_change", args=["from-settings"])
    assert b'name="_save"' not in admin_client.get(detail).content


@pytest.mark.django_db
def test_admin__run_now_needs_its_permission(django_user_model):
    from django.contrib.auth.models import Permission
    from django.test import Client
    from django.urls import reverse

    schedules.create("r", TASK, "@hourly")
    user = django_user_model.objects.create_user(username="op", password="pw", is_staff=True)
    for codename in ("view_scheduledefinition", "change_scheduledefinition"):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client()
    client.force_login(user)
    client.post(
        reverse(LIST_URL),
        {"action": "run_now_selected", "_selected_action": ["r"], "index": "0"},
    )
    assert not Job.objects.exists()


def test_schedules__reached_from_the_package_after_a_plain_import():
    import django_pgqueue

    assert django_pgqueue.schedules.create is schedules.create
