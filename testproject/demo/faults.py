"""Faults the flow control tests plant in worker processes, to show that their checks
would catch a broken guard (and one delay, to make races likely):
``PGQUEUE_DEMO_PLANT=name[,name]`` in a process's environment rewrites the named parts
of django-pgqueue's statements when the demo app loads (``DemoConfig.ready``). Each
plant names the text it replaces, and refuses to start if that text is gone (a plant
that silently did nothing would prove nothing).

A plant of the database function the limited claims call (``sql.FLOW_USAGE_FUNCTION``)
cannot rewrite it in the worker: the function lives in the database. The test installs
the rewritten function under another name first (:func:`planted_function`), and the
plant makes the worker's claims call that one."""

from __future__ import annotations

import os

from django_pgqueue import sql

#: The limited claims: every statement that enforces limits.
LIMITED = ("JOB_CLAIM_LIMITED", "JOB_CLAIM_LIMITED_HEAD", "JOB_CLAIM_LIMITED_HEAD_KEYS")
#: The function the limited claims read their budgets' use with, and the name a
#: planted copy of it is installed under.
FUNCTION = "FLOW_USAGE_FUNCTION"
FUNCTION_NAME = "pgqueue_flow_usage"
PLANTED_FUNCTION_NAME = "pgqueue_flow_usage_planted"

#: name -> its edits: (statements, text, replacement), or several of them
Edit = tuple[tuple[str, ...], str, str]
PLANTS: dict[str, Edit | tuple[Edit, ...]] = {
    # Claimers do not serialise per budget: each counts what runs while another's claim
    # of the same budget may be in flight, uncommitted (the SKIP LOCKED trap).
    "no_budget_lock": (
        LIMITED,
        "THEN pg_try_advisory_xact_lock(hashtext('django_pgqueue key')",
        "THEN true OR pg_try_advisory_xact_lock(hashtext('django_pgqueue key')",
    ),
    # A rate budget's window forgets its starts: nothing spreads them out.
    "no_rate_window": (
        ("JOB_CLAIM_LIMITED", "JOB_CLAIM_LIMITED_HEAD"),
        "AND s.at > (SELECT now FROM clock) - make_interval(secs => l.period)",
        "AND false",
    ),
    # A running job whose lease expired no longer holds its slot (before the sweeper
    # took it back: its worker may be alive and still running it).
    "expired_lease_frees_slot": (
        ("JOB_CLAIM_LIMITED", FUNCTION),
        "WHERE (r.status = 'running') IS TRUE AND r.concurrency_key > ''",
        "WHERE (r.status = 'running') IS TRUE AND r.lease_expires_at > clock_timestamp()"
        " AND r.concurrency_key > ''",
    ),
    # Not a fault: a limited claim holds its transaction open 30 ms longer once it has
    # counted its budgets and leased (its result's last row waits), as on a loaded
    # server, so racing claims overlap often (the guarded tests hold on).
    "slow_claim": (
        (
            ("JOB_CLAIM_LIMITED_HEAD", "JOB_CLAIM_LIMITED_HEAD_KEYS"),
            "(SELECT count(*) FROM head),",
            "(SELECT count(*) FROM head) + (SELECT 0 FROM pg_sleep(0.03)),",
        ),
        (
            ("JOB_CLAIM_LIMITED",),
            "WHERE EXISTS (SELECT FROM numbered) AND NOT EXISTS (SELECT FROM chosen)\n",
            "WHERE EXISTS (SELECT FROM numbered) AND NOT EXISTS (SELECT FROM chosen)\n"
            "UNION ALL\nSELECT (NULL::pgqueue_job).*, NULL, NULL, NULL\n"
            "WHERE NOT (SELECT true FROM pg_sleep(0.03))\n",
        ),
    ),
    # Workers never learn that a queue is paused.
    "ignore_pauses": (("FLOW_GET_STATE",), "WHERE paused_at IS NOT NULL", "WHERE false"),
    # Fair queues are claimed like any other.
    "unfair": (("JOB_CLAIM_FLOW", "JOB_CLAIM_LIMITED"), "%(fair)s::text[]", "'{}'::text[]"),
}


def rewritten(names: str) -> dict[str, str]:
    """The statements (and function) the plants of ``names`` (comma-separated) rewrite,
    by name, as rewritten; nothing is changed."""
    texts: dict[str, str] = {}
    for name in filter(None, names.split(",")):
        edits = PLANTS[name]
        for statements, text, replacement in [edits] if isinstance(edits[1], str) else edits:
            for statement in statements:
                current = texts.get(statement, getattr(sql, statement))
                if text not in current:
                    raise RuntimeError(f"plant {name}: {statement} no longer holds {text!r}")
                texts[statement] = current.replace(text, replacement)
    if FUNCTION in texts:  # installed under its planted name; the claims call that
        texts[FUNCTION] = texts[FUNCTION].replace(
            f"FUNCTION {FUNCTION_NAME}(", f"FUNCTION {PLANTED_FUNCTION_NAME}("
        )
        for statement in LIMITED:
            current = texts.get(statement, getattr(sql, statement))
            texts[statement] = current.replace(f"{FUNCTION_NAME}(", f"{PLANTED_FUNCTION_NAME}(")
    return texts


def planted_function(names: str) -> str | None:
    """The ``CREATE FUNCTION`` of the planted copy of the usage function the plants of
    ``names`` need installed before a worker claims (None: none)."""
    return rewritten(names).get(FUNCTION)


def plant(names: str) -> None:
    """Rewrite the statements of each plant in ``names`` (comma-separated)."""
    for statement, text in rewritten(names).items():
        if statement != FUNCTION:
            setattr(sql.module_of(statement), statement, text)


def plant_from_environment() -> None:
    plant(os.environ.get("PGQUEUE_DEMO_PLANT", ""))
