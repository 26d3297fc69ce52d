"""Every SQL statement django-pgqueue runs at run time, one module per family of state
changes, each run by one module of the package (``RUNNERS``).

Rules kept by every statement here:

* Each is a named constant whose text starts with its header, inside the SQL (so a
  statement pasted into psql, or seen in ``pg_stat_activity``, says what it is):
  ``-- name: JOB_CLAIM``, at most three lines on why it is shaped so, and on each
  statement that writes a job's status one ``-- moves: from -> to | to`` line per source
  state (``new``: a row inserted; ``gone``: a row deleted). ``states.TRANSITIONS`` is
  read from those lines, and the state diagram of the docs from it.
* Values are psycopg named parameters (``%(name)s``); nothing is built with f-strings.
  Fragments (``common.py``, ``resolve.py`` and a family's own ``_NAME`` constants) are
  constant text joined when the module is imported, never values.
* Time is the database's: ``coalesce(%(now)s::timestamptz, clock_timestamp())`` so that
  tests may pin the clock and production never trusts a worker's clock.
  ``clock_timestamp()`` rather than ``now()`` because ``now()`` is frozen at transaction
  start and may be stale after waiting on a lock.
* Every state change is one statement, so it is atomic without an explicit transaction.
* Worker writes are *fenced* on ``(id, status = 'running', lease_owner, attempts,
  last_attempted_at)`` (``common.FENCE``): a worker whose lease was taken back updates
  zero rows instead of overwriting a newer attempt. The claim time is part of the fence
  because a requeue resets attempts, so the same worker may claim the job again at the
  same attempt. It is compared as the session's wall-clock ``timestamp``: with
  ``USE_TZ = False`` Django hands back naive local times, which would be ambiguous as
  ``timestamptz`` in the repeated hour of a DST change.
* Multi-row maintenance uses ``FOR UPDATE SKIP LOCKED`` with a ``LIMIT`` so it never
  waits on, or deadlocks with, workers, and never runs unbounded.

Table names are hard-coded; ``tests/test_sql.py`` checks them against the models. Each
family's statements are in alphabetical order, after its fragments. ``rendered.sql``
beside this file holds every statement whole, as it runs (``make sql`` writes it; a test
fails when it is stale).
"""

from __future__ import annotations

import importlib
import re
from types import ModuleType

#: Each family of statements and the one module of the package that runs them (a test
#: checks that no other module imports the family).
RUNNERS: dict[str, str] = {
    "clock": "django_pgqueue.db",
    "enqueue": "django_pgqueue.enqueue",
    "bulk": "django_pgqueue.bulk",
    "claim": "django_pgqueue.claim",
    "flow": "django_pgqueue.flow",
    "flow_control": "django_pgqueue.flow",
    "finish": "django_pgqueue.finish",
    "lifecycle": "django_pgqueue.lifecycle",
    "operate": "django_pgqueue.operate",
    "workflow": "django_pgqueue.workflows",
    "sweep": "django_pgqueue.sweeper",
    "periodic": "django_pgqueue.periodic",
    "read": "django_pgqueue.monitoring",
    "session": "django_pgqueue.worker.connections",
    "deadline": "django_pgqueue.deadline",
    "presence": "django_pgqueue.worker.presence",
    "migration": "django_pgqueue.migration_ops",
    "steps": "django_pgqueue.steps",
    "wait": "django_pgqueue.hub",
}

#: The modules of fragments shared by several families (no statement of their own).
FRAGMENTS = ("common", "resolve")

#: The first line of a statement's header.
NAME_LINE = re.compile(r"\A\s*-- name: (?P<name>[A-Z][A-Z0-9_]*)\n")
#: A ``moves:`` line of a header: one source state, its targets.
MOVES_LINE = re.compile(
    r"^-- moves: (?P<source>[a-z]+) -> (?P<targets>[a-z]+(?: \| [a-z]+)*)$", re.M
)


def family(name: str) -> ModuleType:
    """The module of family ``name`` (``sql.family("claim")``)."""
    return importlib.import_module(f"{__name__}.{name}")


def statements() -> dict[str, tuple[str, str]]:
    """Every statement: name -> (family, text), families in ``RUNNERS`` order, each
    family's statements in the order of its module."""
    found: dict[str, tuple[str, str]] = {}
    for fam in RUNNERS:
        for name, value in vars(family(fam)).items():
            if isinstance(value, str) and NAME_LINE.match(value):
                found[name] = (fam, value)
    return found


def module_of(name: str) -> ModuleType:
    """The family module that defines statement ``name``: where a test or a planted
    fault replaces it (``monkeypatch.setattr(sql.module_of(name), name, text)``), since
    its runner reads it from there."""
    return family(statements()[name][0])


def header(text: str) -> list[str]:
    """The header lines of a statement (its leading ``--`` lines, without the dashes)."""
    lines = []
    for line in text.lstrip("\n").splitlines():
        if not line.startswith("--"):
            break
        lines.append(line[2:].strip())
    return lines


def moves(text: str) -> dict[str, tuple[str, ...]]:
    """The ``moves:`` lines of a statement's header: source state -> target states."""
    head = "\n".join(f"-- {line}" for line in header(text))
    return {m["source"]: tuple(m["targets"].split(" | ")) for m in MOVES_LINE.finditer(head)}


def render() -> str:
    """Every statement whole, as it runs, family by family: ``rendered.sql``."""
    parts = [
        "-- Every statement of django_pgqueue/sql/, whole, as it runs: generated by\n"
        "-- `make sql` from the family modules (do not edit; a test fails when it is stale).\n"
    ]
    current = None
    for _name, (fam, text) in statements().items():
        if fam != current:
            current = fam
            parts.append(f"\n-- {'=' * 77}\n-- family {fam}: run by {RUNNERS[fam]}\n")
        parts.append("\n" + text.strip("\n") + ";\n")
    return "".join(parts)


def __getattr__(name: str) -> str:
    """A statement by name (``sql.JOB_CLAIM``), for tests and benches. The package's own
    modules import their family instead (``from .sql import claim as sql``): a test keeps
    each family to its runner."""
    found = statements().get(name)
    if found is None:
        raise AttributeError(f"module {__name__!r} has no statement {name!r}")
    return found[1]
