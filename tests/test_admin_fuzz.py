"""The admin never answers 500: every query parameter of every page, fuzzed.

Django's change lists take any model field and lookup as a query parameter, so every
concrete field and every lookup registered for its class (read from the field at run
time) of every page of the app is fuzzed with a few hostile values, and every change
and history page with hostile primary keys (quoted as the admin quotes them).

Each page of the admin (job list, dead letters, detail, delete and history pages, the
actions and their confirmation page) is requested once per (parameter, odd value): NUL
characters, lone surrogates and broken UTF-8, huge and non-ASCII numbers, SQL and HTML
metacharacters, very long strings, bad dates. Values go into the raw query string or
form body, percent-encoded, exactly as a browser or an attacker could send them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import pytest
from django.contrib import admin
from django.contrib.admin.utils import quote as admin_quote
from django.db import models, transaction
from django.db.models import F
from django.db.models.functions import Now
from django.test import Client
from django.urls import reverse

from django_pgqueue.models import Job, Schedule, WorkerProcess

logger = logging.getLogger(__name__)

#: Odd values for any parameter (str, or bytes sent as they are: broken UTF-8).
ODD_VALUES: list[str | bytes] = [
    "",
    " ",
    "\x00",
    "a\x00b",
    "1\x00",
    "\ud800",
    "x\udfff",
    b"\xff\xfe",
    b"\xc3\x28",
    b"\xed\xa0\x80",  # a surrogate, UTF-8 encoded
    "\u00b2",  # SUPERSCRIPT TWO: isdigit() but not int()
    "\u0661\u0662",  # ARABIC-INDIC 12: isdecimal() and int()
    "\uff11\uff12",  # FULLWIDTH 12
    "\u216b",  # ROMAN NUMERAL TWELVE: isnumeric()
    "\U0001d7d9",  # MATHEMATICAL DOUBLE-STRUCK ONE
    "0",
    "-1",
    "1.5",
    "1e9",
    "nan",
    "inf",
    "0x10",
    str(2**31),
    str(2**63 - 1),
    str(2**63),
    str(-(2**63) - 1),
    "9" * 30,
    "9" * 5000,  # past Python's int-to-str digit limit
    "' OR 1=1 --",
    '"; DROP TABLE pgqueue_job; --',
    "%",
    "_",
    "\\",
    "%00",
    "<script>alert(1)</script>",
    "{{ 7|add:7 }}",
    "${7*7}",
    "&amp;&lt;",
    "\n",
    "\r\n\t",
    "\u202e\u200b\ufeff\uffff",
    "\U0001f600",
    "a" * 10_000,
    "2030-13-45",
    "0000-00-00",
    "9999-12-31 23:59:59",
    "10000-01-01",
    "-0001-01-01",
    "2030-01-01T00:00:00+99:00",
    "None",
    "null",
    "true",
    "[]",
    "{}",
    "__proto__",
    "pk",
    "-id",
    "id__gt",
    "pending",
    "dead",
]


def encode(value: str | bytes) -> str:
    """Percent-encode a value as a raw query or form component (surrogates too)."""
    if isinstance(value, bytes):
        return quote(value, safe="")
    return quote(value, safe="", errors="surrogatepass")


@dataclass
class Fuzz:
    """Requests made and the ones answered with a 500 (or that raised)."""

    client: Client
    requests: int = 0
    failures: list[str] = field(default_factory=list)

    def _record(self, what: str, send: Any) -> None:
        self.requests += 1
        try:
            # A savepoint: a request that breaks the transaction must not break the next.
            with transaction.atomic():
                response = send()
        except Exception as exc:  # noqa: BLE001 - a 500: the test client re-raises it
            self.failures.append(f"{what}: {type(exc).__name__}: {str(exc)[:200]}")
            return
        if response.status_code >= 500:
            self.failures.append(f"{what}: HTTP {response.status_code}")

    def get(self, path: str, query: str = "") -> None:
        url = f"{path}?{query}" if query else path
        self._record(f"GET {url[:160]!r}", lambda: self.client.get(url))

    def post(self, path: str, body: str) -> None:
        self._record(
            f"POST {path} {body[:160]!r}",
            lambda: self.client.post(path, body, content_type="application/x-www-form-urlencoded"),
        )


def form(**fields: str | bytes | list[str | bytes]) -> str:
    parts = []
    for name, value in fields.items():
        for item in value if isinstance(value, list) else [value]:
            parts.append(f"{encode(name)}={encode(item)}")
    return "&".join(parts)


def odd_values() -> Iterator[str | bytes]:
    yield from ODD_VALUES


#: The GET parameters each list reads: search, filters (their exact names), sorting,
#: paging, Django's own flags, and one nobody reads.
LIST_PARAMETERS = {
    "admin:django_pgqueue_job_changelist": [
        "q",
        "status__exact",
        "queue",
        "task",
        "tag",
        "created_at__gte",
        "created_at__lt",
        "created_at__isnull",
        "o",
        "p",
        "all",
        "e",
        "_to_field",
        "_popup",
        "_facets",
        "zzz",
    ],
    "admin:django_pgqueue_deadletter_changelist": [
        "q",
        "queue",
        "task",
        "tag",
        "finished_at__gte",
        "finished_at__lt",
        "finished_at__isnull",
        "o",
        "p",
        "all",
        "e",
        "_to_field",
        "_popup",
        "zzz",
    ],
}
DETAIL_PARAMETERS = ["_changelist_filters", "_to_field", "_popup"]


@pytest.fixture
def jobs(job_factory: Any) -> dict[str, Job]:
    """One job of each kind the pages show: pending, dead (with an error), done."""
    pending = job_factory(queue="fuzz", idempotency_key="k1")
    dead = job_factory(queue="fuzz")
    Job.objects.filter(pk=dead.pk).update(
        status="dead",
        attempts=F("max_attempts"),
        started_at=Now(),
        last_attempted_at=Now(),
        finished_at=Now(),
        errors=[{"exception_class_path": "builtins.ValueError", "traceback": "E: x\x01"}],
    )
    done = job_factory()
    Job.objects.filter(pk=done.pk).update(
        status="done", attempts=1, started_at=Now(), finished_at=Now(), result={"r": 1}
    )
    return {"pending": pending, "dead": dead, "done": done}


# Slow: over 4,000 requests, about two minutes on a small VM, a third of the fast suite;
# the full run (make test, CI's run on the embedded server) keeps it.
@pytest.mark.slow
@pytest.mark.django_db
# Django's date filter makes a date-and-time given without a zone aware, and warns.
@pytest.mark.filterwarnings("ignore:DateTimeField .* received a naive datetime:RuntimeWarning")
def test_admin__no_page_answers_500_to_any_odd_parameter(admin_user, jobs):
    client = Client(raise_request_exception=True)
    client.force_login(admin_user)
    fuzz = Fuzz(client)
    dead_id = str(jobs["dead"].pk)

    # The lists: each parameter alone, then all of them at once with the same value.
    for name, parameters in LIST_PARAMETERS.items():
        path = reverse(name)
        for value in odd_values():
            for parameter in parameters:
                fuzz.get(path, f"{encode(parameter)}={encode(value)}")
            fuzz.get(path, "&".join(f"{encode(p)}={encode(value)}" for p in parameters))

    # Detail, delete and history pages: odd object ids in the path, odd query
    # parameters on a real one.
    pages = [
        ("admin:django_pgqueue_job_change", str(jobs["pending"].pk)),
        ("admin:django_pgqueue_job_history", str(jobs["done"].pk)),
        ("admin:django_pgqueue_deadletter_change", dead_id),
        ("admin:django_pgqueue_deadletter_delete", dead_id),
        ("admin:django_pgqueue_deadletter_history", dead_id),
    ]
    for name, real_id in pages:
        real = reverse(name, args=[real_id])
        for value in odd_values():
            fuzz.get(real.replace(f"/{real_id}/", f"/{encode(value) or '%20'}/"))
            for parameter in DETAIL_PARAMETERS:
                fuzz.get(real, f"{parameter}={encode(value)}")

    # Actions on the dead-letter list, and the discard confirmation page: each field of
    # the action form odd in turn, the others valid.
    dead_list = reverse("admin:django_pgqueue_deadletter_changelist")
    valid = {
        "action": "requeue",
        "_selected_action": dead_id,
        "index": "0",
        "select_across": "0",
        "requeue_queue": "",
        "requeue_priority": "",
    }
    for action in ("requeue", "delete_selected"):
        for key in [*valid, "post"]:
            for value in odd_values():
                fields: dict[str, Any] = {**valid, "action": action, key: value}
                if action == "delete_selected" and key != "post":
                    fields.pop("index")  # the confirmation page, not the deletion
                fuzz.post(dead_list, form(**fields))
                # Requeued or discarded by the last request: make it dead again.
                Job.objects.filter(pk=jobs["dead"].pk).update(status="dead", attempts=3)
                if not Job.objects.filter(pk=jobs["dead"].pk).exists():
                    jobs["dead"].save(force_insert=True)
    # The detail page's own action form (prefixed) with odd options.
    dead_page = reverse("admin:django_pgqueue_deadletter_change", args=[dead_id])
    for key in ("action", "requeue_queue", "requeue_priority"):
        for value in odd_values():
            fields = {
                "CHANGE_FORM-action": "requeue",
                "CHANGE_FORM-requeue_queue": "",
                "CHANGE_FORM-requeue_priority": "",
                "_selected_action": dead_id,
                f"CHANGE_FORM-{key}": value,
            }
            fuzz.post(dead_page, form(**fields))
            Job.objects.filter(pk=jobs["dead"].pk).update(status="dead")

    logger.warning("admin fuzz: %d requests, %d errors", fuzz.requests, len(fuzz.failures))
    print(f"admin fuzz: {fuzz.requests} requests, {len(fuzz.failures)} errors")  # noqa: T201
    assert fuzz.requests > 4000
    assert not fuzz.failures, "\n".join(fuzz.failures[:40])


#: A few hostile values for any field lookup: NUL, a lone surrogate, past any integer
#: column, not a number, not an array literal, very long.
HOSTILE_VALUES: list[str | bytes] = ["a\x00b", "\ud800", str(2**70), "x", "[]", "y" * 5000]
#: Hostile primary keys, before the admin's own quoting.
HOSTILE_PKS: list[str | bytes] = [*HOSTILE_VALUES, "\x00", "_00", "../..", "a/b", ""]


def app_admins() -> list[tuple[type[models.Model], admin.ModelAdmin]]:
    """Every model of the app registered on the admin site, with its admin."""
    return [
        (model, model_admin)
        for model, model_admin in admin.site._registry.items()
        if model._meta.app_label == "django_pgqueue"
    ]


def lookup_parameters(model: type[models.Model]) -> list[str]:
    """Each concrete field's name, alone and with every lookup and transform its class
    registers (so a field changed to another class brings its own lookups)."""
    names = []
    for model_field in model._meta.concrete_fields:
        names.append(model_field.name)
        names += [f"{model_field.name}__{lookup}" for lookup in sorted(model_field.get_lookups())]
    return names


def url_names(model_admin: admin.ModelAdmin) -> set[str]:
    """The names of the pages ``model_admin`` serves (the dashboard: its list only)."""
    return {pattern.name for pattern in model_admin.get_urls() if pattern.name}


#: PGQUEUE_FULL_FUZZ=1: every hostile value with every lookup (about 13,000 requests,
#: minutes); by default each lookup gets one value, in turn, so every lookup and every
#: value is still sent (a few thousand requests).
FULL_FUZZ = os.environ.get("PGQUEUE_FULL_FUZZ") == "1"


@pytest.mark.slow
@pytest.mark.django_db
@pytest.mark.filterwarnings("ignore:DateTimeField .* received a naive datetime:RuntimeWarning")
def test_admin__every_field_lookup_and_pk_of_every_page_answers_no_500(admin_user, jobs):
    Schedule.objects.create(
        name="nightly", task="t.nightly", cron="0 3 * * *", timezone="UTC", last_tick=Now()
    )
    WorkerProcess.objects.create(
        id="web#1&x=y",
        hostname="web",
        pid=1,
        queues=["fuzz"],
        concurrency=1,
        lease_seconds=30,
        version="1",
    )
    client = Client(raise_request_exception=True)
    client.force_login(admin_user)
    fuzz = Fuzz(client)
    pages = app_admins()
    assert {m.__name__ for m, _ in pages} >= {
        "Job",
        "DeadLetter",
        "Schedule",
        "WorkerProcess",
        "Dashboard",
    }
    for model, model_admin in pages:
        opts = model._meta
        changelist = reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
        for turn, parameter in enumerate(lookup_parameters(model)):
            values = HOSTILE_VALUES if FULL_FUZZ else [HOSTILE_VALUES[turn % len(HOSTILE_VALUES)]]
            for value in values:
                fuzz.get(changelist, f"{encode(parameter)}={encode(value)}")
        names = url_names(model_admin)
        row = model._default_manager.order_by("pk").first()
        for suffix in ("change", "history", "delete"):
            name = f"{opts.app_label}_{opts.model_name}_{suffix}"
            if name not in names or row is None:
                continue
            real_pk = admin_quote(str(row.pk))
            url = reverse(f"admin:{name}", args=[real_pk])
            for pk in HOSTILE_PKS:
                quoted = admin_quote(pk) if isinstance(pk, str) else pk
                fuzz.get(url.replace(f"/{real_pk}/", f"/{encode(quoted) or '%20'}/"))

    logger.warning("admin lookup fuzz: %d requests, %d errors", fuzz.requests, len(fuzz.failures))
    print(f"admin lookup fuzz: {fuzz.requests} requests, {len(fuzz.failures)} errors")  # noqa: T201
    assert fuzz.requests > (10_000 if FULL_FUZZ else 2_000)
    assert not fuzz.failures, "\n".join(fuzz.failures[:60])
