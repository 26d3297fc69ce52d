"""The chaos suite's view of processes through ``/proc``: a supervisor's children, and
workers left running after their supervisor died (orphans).

Every process the harness starts carries ``PGQUEUE_CHAOS_RUN=<token>`` in its
environment, and so does everything they fork: a worker process is one of the run's
whatever became of its parent. An orphan is such a ``pgqueue_worker`` process (alive,
not a zombie) whose parent is neither the harness nor a supervisor the harness knows
to be alive: its supervisor was SIGKILLed and it was re-parented.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

PROC = Path("/proc")
#: The environment variable that marks a run's processes, and its value's prefix.
MARKER = "PGQUEUE_CHAOS_RUN"


def children(pid: int) -> set[int]:
    """The pids of ``pid``'s live children (empty once it is gone)."""
    found: set[int] = set()
    try:
        tasks = list((PROC / str(pid) / "task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            found.update(int(p) for p in (task / "children").read_text().split())
        except OSError:
            continue
    return found


def status(pid: int) -> dict[str, str]:
    """The fields of ``/proc/<pid>/status`` (empty once it is gone)."""
    try:
        text = (PROC / str(pid) / "status").read_text()
    except OSError:
        return {}
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def run_workers(token: str) -> dict[int, int]:
    """The live ``pgqueue_worker`` processes of the run ``token``: pid -> parent pid."""
    wanted = f"{MARKER}={token}".encode()
    found: dict[int, int] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if b"pgqueue_worker" not in (entry / "cmdline").read_bytes():
                continue
            if wanted not in (entry / "environ").read_bytes().split(b"\0"):
                continue
        except OSError:
            continue  # gone meanwhile, or not ours to read
        fields = status(int(entry.name))
        if not fields or fields.get("State", "").startswith(("Z", "X")):
            continue
        found[int(entry.name)] = int(fields["PPid"])
    return found


def orphans(token: str, parents: Iterable[int]) -> set[int]:
    """The run's worker processes whose parent is not one of ``parents`` (the harness
    and the supervisors it knows to be alive)."""
    known = set(parents)
    return {pid for pid, ppid in run_workers(token).items() if ppid not in known}


def kill(pids: Iterable[int], signum: int) -> None:
    """Signal each of ``pids`` (gone ones are skipped)."""
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass
