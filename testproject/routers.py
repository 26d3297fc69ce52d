"""The test project's database router: the "second" database holds only jobs."""

from __future__ import annotations

from typing import Any


class JobsOnlyOnSecond:
    """Every app migrates on "default"; only django_pgqueue on "second" too. Reads and
    writes are left to Django (``None``): the Tasks backends name their databases."""

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool | None:
        if db == "second":
            return app_label == "django_pgqueue"
        return None
