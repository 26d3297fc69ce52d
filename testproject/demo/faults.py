"""Faults the flow control tests plant in worker processes, to show that their checks
would catch a broken guard (and one delay, to make races likely):
``PGQUEUE_DEMO_PLANT=name[,name]`` in a process's environment rewrites the named parts
of django-pgqueue's statements when the demo app loads (``DemoConfig.ready``). Each
plant names the text it replaces, and refuses to start if that text is gone (a plant
that silently did nothing would prove nothing)."""

from __future__ import annotations

import os

from django_pgqueue import sql

#: name -> (statements, text, replacement)
PLANTS: dict[str, tuple[tuple[str, ...], str, str]] = {
    # Claimers do not serialise per budget: each counts what runs in a snapshot that
    # may miss another's claim in flight (the SKIP LOCKED trap).
    "no_budget_lock": (
        ("JOB_CLAIM_LIMITED",),
        "THEN pg_try_advisory_xact_lock(hashtext('django_pgqueue key')",
        "THEN true OR pg_try_advisory_xact_lock(hashtext('django_pgqueue key')",
    ),
    # A rate budget's window forgets its starts: nothing spreads them out.
    "no_rate_window": (
        ("JOB_CLAIM_LIMITED", "JOB_CLAIM_LIMITED_LEASE"),
        "AND s.at > (SELECT now FROM clock) - make_interval(secs => l.period)",
        "AND false",
    ),
    # A running job whose lease expired no longer holds its slot (before the sweeper
    # took it back: its worker may be alive and still running it).
    "expired_lease_frees_slot": (
        ("JOB_CLAIM_LIMITED", "JOB_CLAIM_LIMITED_LEASE"),
        "WHERE r.status = 'running' AND r.concurrency_key > ''",
        "WHERE r.status = 'running' AND r.lease_expires_at > clock_timestamp()"
        " AND r.concurrency_key > ''",
    ),
    # Not a fault: the limited claim's lease holds its transaction open 30 ms longer, as
    # a loaded server would, so racing claims overlap often (the guarded test holds on).
    "slow_claim": (
        ("JOB_CLAIM_LIMITED_LEASE",),
        "WHERE j.id = ANY (ARRAY(SELECT id FROM candidate))",
        "WHERE j.id = ANY (ARRAY(SELECT id FROM candidate)) AND (SELECT true FROM pg_sleep(0.03))",
    ),
    # Workers never learn that a queue is paused.
    "ignore_pauses": (("FLOW_GET_STATE",), "WHERE paused_at IS NOT NULL", "WHERE false"),
    # Fair queues are claimed like any other.
    "unfair": (("JOB_CLAIM_FLOW", "JOB_CLAIM_LIMITED"), "%(fair)s::text[]", "'{}'::text[]"),
}


def plant(names: str) -> None:
    """Rewrite the statements of each plant in ``names`` (comma-separated)."""
    for name in filter(None, names.split(",")):
        statements, text, replacement = PLANTS[name]
        for statement in statements:
            current = getattr(sql, statement)
            if text not in current:
                raise RuntimeError(f"plant {name}: {statement} no longer holds {text!r}")
            setattr(sql, statement, current.replace(text, replacement))


def plant_from_environment() -> None:
    plant(os.environ.get("PGQUEUE_DEMO_PLANT", ""))
