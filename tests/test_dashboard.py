"""The admin dashboard (without a browser): who may see it, what it shows, that it is
reached from the admin index, and the SVG charts it draws."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_pgqueue.admin import charts
from django_pgqueue.models import Job

pytestmark = pytest.mark.django_db

DASHBOARD = "admin:django_pgqueue_dashboard_changelist"


@pytest.fixture
def staff(django_user_model):
    made = []

    def make(*codenames: str) -> Client:
        made.append(None)
        name = f"staff{len(made)}"
        user = django_user_model.objects.create_user(name, f"{name}@x.org", "pw", is_staff=True)
        for codename in codenames:
            user.user_permissions.add(Permission.objects.get(codename=codename))
        client = Client()
        client.force_login(user)
        return client

    return make


def test_dashboard__needs_the_job_view_permission(client, staff):
    url = reverse(DASHBOARD)
    assert client.get(url).status_code == 302  # to the login page
    assert staff().get(url).status_code == 403
    assert staff("view_job").get(url).status_code == 200


def test_dashboard__is_on_the_admin_index_for_job_viewers_only(staff, django_user_model):
    url = reverse(DASHBOARD)
    assert url in staff("view_job").get(reverse("admin:index")).content.decode()
    other = django_user_model.objects.create_user("o", "o@example.com", "pw", is_staff=True)
    other.user_permissions.add(Permission.objects.get(codename="view_deadletter"))
    client = Client()
    client.force_login(other)
    assert url not in client.get(reverse("admin:index")).content.decode()


def test_dashboard__figures_charts_and_links(admin_client, job_factory):
    for _ in range(3):
        job_factory(queue="mail")
    done = job_factory(queue="mail")
    Job.objects.filter(pk=done.pk).update(
        status="done",
        finished_at=dt.datetime.now(dt.UTC),
        last_attempted_at=dt.datetime.now(dt.UTC),
    )
    page = admin_client.get(reverse(DASHBOARD)).content.decode()
    assert 'id="pgqueue-pending">3<' in page
    jobs = reverse("admin:django_pgqueue_job_changelist")
    assert f'href="{jobs}?status__exact=pending&amp;queue=mail"' in page
    assert page.count('<svg xmlns="http://www.w3.org/2000/svg" class="pgqueue-chart"') == 3
    assert "<script" not in page.split('id="content-main"')[1]
    assert "No worker is running" in page


def test_dashboard__counts_recent_cancellations(admin_client, job_factory):
    jobs = [job_factory(queue="mail") for _ in range(3)]
    assert Job.objects.cancel([j.pk for j in jobs[:2]]).cancelled
    page = admin_client.get(reverse(DASHBOARD)).content.decode()
    jobs_url = reverse("admin:django_pgqueue_job_changelist")
    cell = re.search(r'data-figure="cancelled_5m"><a href="([^"]+)">([^<]+)<', page)
    assert cell, page
    assert cell.groups() == (f"{jobs_url}?status__exact=cancelled&amp;queue=mail", "2")


def test_dashboard__query_count_does_not_grow_with_the_table(admin_client, job_factory):
    url = reverse(DASHBOARD)
    job_factory()
    with CaptureQueriesContext(connection) as few:
        admin_client.get(url)
    for i in range(200):
        job_factory(queue=f"q{i % 5}")
    with CaptureQueriesContext(connection) as many:
        admin_client.get(url)
    assert len(many) == len(few)
    assert not [q for q in many if re.search(r"count\(\*\)\s+FROM\s+\"?pgqueue_job", q["sql"])]


def test_charts__nice_ceiling_and_labels():
    assert [charts.nice_ceiling(v) for v in (0, 1, 3, 7, 10, 11, 240, 999)] == [
        1,
        1,
        5,
        10,
        10,
        20,
        500,
        1000,
    ]
    assert [charts.count_label(v) for v in (0, 250, 1500, 2_000_000)] == ["0", "250", "1.5k", "2M"]
    assert [charts.seconds_label(v) for v in (0, 0.25, 5, 90, 7200)] == [
        "0 s",
        "250 ms",
        "5 s",
        "1.5 min",
        "2 h",
    ]


def test_charts__bars_and_lines_escape_and_scale():
    times = [dt.datetime(2030, 1, 1, 12, m, tzinfo=dt.UTC) for m in range(3)]
    svg = charts.stacked_bars(
        times, [charts.Series("<b>x</b>", [10, None, 5], "#123456")], title="T <i>"
    )
    assert "<b>" not in svg and "&lt;b&gt;x&lt;/b&gt;" in svg and "T &lt;i&gt;" in svg
    heights = [float(h) for h in re.findall(r'<rect [^>]*height="([\d.]+)"', svg)]
    assert len(heights) == 2 and heights[0] == pytest.approx(2 * heights[1])
    line = charts.lines(times, [charts.Series("wait", [1.0, None, 2.0], "#000")], title="L")
    assert line.count("<circle") == 2
    assert "<polyline" not in line  # a gap splits the line; single points get dots only


def breadcrumbs(page: str) -> str:
    """The opening tag of a page's breadcrumbs."""
    (tag,) = re.findall(r'<(?:ol|div) class="breadcrumbs">', page)
    return tag


def test_dashboard__breadcrumbs_are_drawn_like_the_admins_own(admin_client):
    """Django 6.1 styles ``ol.breadcrumbs`` (a ``div`` before): the dashboard uses the
    structure Django's own change list uses in the version installed."""
    own = breadcrumbs(
        admin_client.get(reverse("admin:django_pgqueue_job_changelist")).content.decode()
    )
    dashboard = admin_client.get(reverse(DASHBOARD)).content.decode()
    assert breadcrumbs(dashboard) == own
    assert re.search(r'aria-current="page">Dashboard<|&rsaquo; Dashboard', dashboard)


def test_charts__duration_axis_labels_are_short_and_fit():
    """A hundred seconds on the axis read "1.66667 min" and were clipped at the left."""
    assert [charts.seconds_label(v) for v in (100, 75, 50, 25, 12.5, 0.0125, 5400)] == [
        "1.7 min",
        "1.2 min",
        "50 s",
        "25 s",
        "12 s",
        "12 ms",
        "1.5 h",
    ]
    times = [dt.datetime(2030, 1, 1, 12, m, tzinfo=dt.UTC) for m in range(60)]
    svg = charts.lines(
        times, [charts.Series("wait", [100 * m / 59 for m in range(60)], "#000")], title="t"
    )
    labels = re.findall(r'<text x="[\d.]+" y="[\d.]+" text-anchor="end">([^<]*)</text>', svg)
    assert labels and all(len(label) <= charts.LABEL_CHARS for label in labels), labels
    # Room for the longest label at the chart's 11 px font (about 0.6 em a character).
    assert charts.LEFT - 6 >= charts.LABEL_CHARS * 11 * 0.6
    assert "wait 1.66667 min" in svg  # the tooltip keeps the exact figure
