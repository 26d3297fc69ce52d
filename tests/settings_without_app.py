"""The test project without ``django_pgqueue`` in INSTALLED_APPS, TASKS unchanged: the
mistake a new user makes (``DJANGO_SETTINGS_MODULE=tests.settings_without_app``)."""

from testproject.settings import *  # noqa: F403

INSTALLED_APPS = [app for app in INSTALLED_APPS if app != "django_pgqueue"]  # noqa: F405
