"""The test project with the logging most projects configure: a console handler on the
root logger at INFO, and nothing else (Django's defaults below it). ``TASKS_LOG_FILE``
in the environment adds a file handler on the framework's logger (``django.tasks``), as
a project that collects Django's task lines in a file of their own has it."""

import os

import django

from testproject.settings import *  # noqa: F403

FRAMEWORK = "django.tasks" if django.VERSION >= (6, 0) else "django_tasks"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": "INFO"},
    "loggers": {},
}
if os.environ.get("TASKS_LOG_FILE"):
    LOGGING["handlers"]["tasks"] = {  # type: ignore[index]
        "class": "logging.FileHandler",
        "filename": os.environ["TASKS_LOG_FILE"],
        "formatter": "plain",
    }
    LOGGING["loggers"] = {FRAMEWORK: {"handlers": ["tasks"], "level": "INFO"}}
