"""A site whose INSTALLED_APPS is ``["django_pgqueue"]`` alone, as the first quickstart
could leave it (``DJANGO_SETTINGS_MODULE=tests.settings_only_the_app``): no contrib app,
no middleware, no URLs (this module is its own, empty, URLconf)."""

from testproject.settings import *  # noqa: F403

INSTALLED_APPS = ["django_pgqueue"]
MIDDLEWARE: list[str] = []
ROOT_URLCONF = "tests.settings_only_the_app"
urlpatterns: list[object] = []
