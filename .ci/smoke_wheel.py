"""Smoke test of an installed wheel, run with ``python -I`` in a fresh venv that holds
nothing but the wheel and its dependencies (``make dist``).

It imports the package from site-packages (not the source tree), sets Django up with the
app and its backend, runs the system checks, loads every command and prints what was
installed. No database is needed (nothing connects).
"""

from __future__ import annotations

import io
import sys
from importlib.metadata import version
from pathlib import Path

import django
from django.conf import settings

settings.configure(
    INSTALLED_APPS=[
        "django.contrib.admin",
        "django.contrib.auth",
        "django.contrib.contenttypes",
        "django.contrib.messages",
        "django.contrib.sessions",
        "django_pgqueue",
    ],
    DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "smoke"}},
    TASKS={"default": {"BACKEND": "django_pgqueue.backend.PgQueueBackend"}},
    TEMPLATES=[
        {
            "BACKEND": "django.template.backends.django.DjangoTemplates",
            "APP_DIRS": True,
            "OPTIONS": {
                "context_processors": [
                    "django.template.context_processors.request",
                    "django.contrib.auth.context_processors.auth",
                    "django.contrib.messages.context_processors.messages",
                ]
            },
        }
    ],
    MIDDLEWARE=[
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "django.contrib.messages.middleware.MessageMiddleware",
    ],
    SECRET_KEY="smoke",
    USE_TZ=True,
)
django.setup()

from django.core.management import call_command, load_command_class  # noqa: E402

import django_pgqueue  # noqa: E402
from django_pgqueue import taskapi  # noqa: E402
from django_pgqueue.backend import PgQueueBackend  # noqa: E402

installed = Path(django_pgqueue.__file__).resolve()
assert "site-packages" in installed.parts, f"imported from {installed}, not the wheel"
assert django_pgqueue.__version__ == version("django-tasks-pgqueue")
assert isinstance(taskapi.task_backends["default"], PgQueueBackend)
call_command("check", stdout=io.StringIO())
for name in ("pgqueue_worker", "pgqueue_sweep"):
    assert load_command_class("django_pgqueue", name).get_version() == django_pgqueue.__version__
print(
    f"smoke: django-tasks-pgqueue {django_pgqueue.__version__} from {installed.parent} "
    f"works on Django {django.get_version()} with {taskapi.FRAMEWORK}, "
    f"Python {sys.version.split()[0]}"
)
