"""Settings of the test project: PostgreSQL only, configured from the environment."""

from pathlib import Path

import environ

from testproject.pgserver import database_url

BASE_DIR = Path(__file__).resolve().parent
env = environ.Env()

SECRET_KEY = env("SECRET_KEY", default="testproject-not-secret")
DEBUG = env.bool("DEBUG", default=False)
ALLOWED_HOSTS = ["*"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_pgqueue",
    "testproject.demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "testproject.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DATABASES = {"default": env.db_url_config(database_url())}
DATABASES["default"]["ENGINE"] = "django.db.backends.postgresql"
# Parallel test runs on one server need distinct test databases.
DATABASES["default"]["TEST"] = {"NAME": env("PGQUEUE_TEST_DB", default=None)}
# DATABASE_POOLED=1: DATABASE_URL points at a transaction pooler (PgBouncer); Django's
# marker for that also tells django-pgqueue to keep no session state there.
if env.bool("DATABASE_POOLED", default=False):
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
# A second jobs database on the same server, for the "second" Tasks backend: named after
# the first (so a worker subprocess given the test database's URL finds the second
# test database too); the router keeps every other app out of it.
DATABASES["second"] = {
    **DATABASES["default"],
    "NAME": f"{DATABASES['default']['NAME']}_second",
    "TEST": {
        "NAME": f"{DATABASES['default']['TEST']['NAME'] or 'test_' + DATABASES['default']['NAME']}"
        "_second"
    },
}
DATABASE_ROUTERS = ["testproject.routers.JobsOnlyOnSecond"]

# A few queue settings may come from the environment (the demo shortens backoff).
PGQUEUE_RETRY_BACKOFF_BASE = env.float("PGQUEUE_RETRY_BACKOFF_BASE", default=2.0)
PGQUEUE_RETRY_BACKOFF_MAX = env.float("PGQUEUE_RETRY_BACKOFF_MAX", default=3600.0)
PGQUEUE_COMPLETION_FLUSH_INTERVAL = env.float("PGQUEUE_COMPLETION_FLUSH_INTERVAL", default=0.01)
# Periodic entries as JSON (the tests start sweepers with their own).
PGQUEUE_PERIODIC = env.json("PGQUEUE_PERIODIC", default=None)
PGQUEUE_CLAIM_RESCAN_SECONDS = env.float("PGQUEUE_CLAIM_RESCAN_SECONDS", default=5.0)
PGQUEUE_BURST_CONNECT_TIMEOUT = env.float("PGQUEUE_BURST_CONNECT_TIMEOUT", default=60.0)
# Flow control as JSON (the flow tests start workers with their own).
PGQUEUE_LIMITS = env.json("PGQUEUE_LIMITS", default=None)
PGQUEUE_FAIR_QUEUES = env.json("PGQUEUE_FAIR_QUEUES", default=None)

# PGQUEUE_LISTEN_DATABASE: a DSN of a direct connection for the worker's LISTEN, as a
# deployment behind PgBouncer sets it ("none": poll only).
LISTEN_DATABASE = env("PGQUEUE_LISTEN_DATABASE", default="")
TASKS = {
    "default": {
        "BACKEND": "django_pgqueue.backend.PgQueueBackend",
        "OPTIONS": {"LISTEN_DATABASE": None if LISTEN_DATABASE == "none" else LISTEN_DATABASE}
        if LISTEN_DATABASE
        else {},
    },
    "second": {
        "BACKEND": "django_pgqueue.backend.PgQueueBackend",
        "OPTIONS": {"DATABASE": "second"},
    },
}

# Django 6.1's mailers (5.2 and 6.0 ignore the setting; tests get the locmem backend):
# the examples of the testing how-to send mail, which 6.1 warns about without it.
MAILERS = {"default": {"BACKEND": "django.core.mail.backends.console.EmailBackend"}}

USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "django_pgqueue": {
            "handlers": ["console"],
            "level": env("PGQUEUE_LOG_LEVEL", default="INFO"),
        },
    },
}
