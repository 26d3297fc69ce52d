"""The test project without ``django.contrib.postgres`` in INSTALLED_APPS, as a site set
up by the quickstart has it (``DJANGO_SETTINGS_MODULE=tests.settings_without_postgres``):
django-pgqueue must need no other app."""

from testproject.settings import *  # noqa: F403

INSTALLED_APPS = [app for app in INSTALLED_APPS if app != "django.contrib.postgres"]  # noqa: F405
