"""System checks with stable ids (pgqueue.E0xx errors, pgqueue.W0xx warnings)."""

from __future__ import annotations

from typing import Any

from django.core import checks

from .conf import settings


# Not tagged "database": Django skips database-tagged checks unless an alias is given,
# so `manage.py check` and every command's startup check would never see these.
@checks.register("pgqueue")
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    messages: list[checks.CheckMessage] = []
    lease = settings.LEASE_SECONDS
    if not isinstance(lease, int | float) or lease <= 0:
        messages.append(
            checks.Error(
                f"PGQUEUE_LEASE_SECONDS must be a positive number, not {lease!r}.",
                hint="Use a lease longer than your heartbeat interval, e.g. 300.",
                id="pgqueue.E010",
            )
        )
    attempts = settings.MAX_ATTEMPTS
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        messages.append(
            checks.Error(
                f"PGQUEUE_MAX_ATTEMPTS must be an int >= 1, not {attempts!r}.",
                hint="Set it to 1 for no retries.",
                id="pgqueue.E011",
            )
        )
    timeout = settings.JOB_TIMEOUT_SECONDS
    if isinstance(lease, int | float) and timeout is not None and timeout < lease / 10:
        messages.append(
            checks.Warning(
                "PGQUEUE_JOB_TIMEOUT_SECONDS is much shorter than the lease.",
                hint="A hung job is only recovered after its lease also expires.",
                id="pgqueue.W001",
            )
        )
    return messages


@checks.register("pgqueue")
def check_periodic(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """One error per bad ``PGQUEUE_PERIODIC`` entry, naming it (the sweeper skips it)."""
    from .periodic import entries

    _, errors = entries()
    return [
        checks.Error(
            f"PGQUEUE_PERIODIC[{name!r}]: {message}" if name else message,
            hint="Fix or remove the entry; see the periodic jobs how-to for its keys.",
            obj=f"PGQUEUE_PERIODIC[{name!r}]" if name else "PGQUEUE_PERIODIC",
            id="pgqueue.E020",
        )
        for name, message in errors.items()
    ]
