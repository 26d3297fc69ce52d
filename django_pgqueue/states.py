"""The states of a job, named once.

``Job.Status`` is :class:`Status`; code that needs the states without the models (the
manager, the sweeper, monitoring) imports them from here. Django's ``TaskResultStatus``
is mapped from them in ``framework.py`` only. The SQL of ``sql/`` spells them as
literals, which the table's CHECK constraint keeps in step with this list, and says in
each statement's header which moves it makes: :data:`TRANSITIONS` is read from there.
"""

from __future__ import annotations

from django.db import models

from . import sql


class Status(models.TextChoices):
    """A job's state (see the state machine in docs/discussions/how-it-works.md)."""

    PENDING = "pending", "Pending"
    SCHEDULED = "scheduled", "Scheduled"
    RUNNING = "running", "Running"
    DONE = "done", "Done"
    DEAD = "dead", "Dead"
    CANCELLED = "cancelled", "Cancelled"
    #: Waits for the jobs it depends on (``depends_on``, chains, groups) to finish;
    #: released to pending (or scheduled) by the statement that finishes the last one.
    WAITING = "waiting", "Waiting"


#: States in which a job is still "live": an idempotency key is unique among these.
LIVE_STATUSES = (Status.PENDING, Status.SCHEDULED, Status.RUNNING, Status.WAITING)
#: States a job ends in (done is pruned after retention; dead waits for an operator).
FINISHED_STATUSES = (Status.DONE, Status.DEAD, Status.CANCELLED)


#: What a ``moves:`` header calls a row being inserted, and a row being deleted.
NEW = "new"
GONE = "gone"


def _read_transitions() -> dict[tuple[str, str], tuple[str, ...]]:
    """Every move the statements make, from their ``moves:`` headers."""
    found: dict[tuple[str, str], list[str]] = {}
    for name, (_family, text) in sql.statements().items():
        for source, targets in sql.moves(text).items():
            for target in targets:
                found.setdefault((source, target), []).append(name)
    return {edge: tuple(sorted(names)) for edge, names in sorted(found.items())}


#: Every move of a job's status the SQL makes: ``(from, to)`` -> the statements that make
#: it, read from the statements' own ``-- moves:`` headers (``new``: the job inserted;
#: ``gone``: its row deleted), so the list cannot drift from what runs. The state
#: diagram of docs/discussions/how-it-works.md is generated from it (``make sql``).
TRANSITIONS: dict[tuple[str, str], tuple[str, ...]] = _read_transitions()


def diagram() -> str:
    """The state diagram (mermaid) of :data:`TRANSITIONS`, each edge labelled with the
    families of the statements that make it."""
    families = {name: family for name, (family, _text) in sql.statements().items()}
    lines = ["stateDiagram-v2"]
    for (source, target), names in TRANSITIONS.items():
        label = ", ".join(sorted({families[name] for name in names}))
        start = "[*]" if source == NEW else source
        end = "[*]" if target == GONE else target
        lines.append(f"    {start} --> {end}: {label}")
    return "\n".join(lines) + "\n"


def table() -> str:
    """:data:`TRANSITIONS` as a Markdown table: each move and the statements making it."""
    rows = ["| from | to | statements |", "|---|---|---|"]
    for (source, target), names in TRANSITIONS.items():
        rows.append(f"| {source} | {target} | {', '.join(f'`{n}`' for n in names)} |")
    return "\n".join(rows) + "\n"
