"""What one worker's threads share: its held jobs, their lock, its counters, its events.

The claim loop, the runner threads, the completer, the heartbeat and the listener each
get the same :class:`WorkerState` instead of the same half-dozen arguments, and see it
under short attribute names through :class:`WorkerPart`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..models import Job


@dataclass
class Held:
    """A job this worker holds, and when its task started (None: not started yet)."""

    job: Job
    started: float | None = None
    lost: bool = False
    timeout: float | None = None  # the task's own timeout option, once it is loaded
    timed_out: bool = False
    completing: bool = False  # finished; waiting for the completer to record it
    # Its outcome (fail, release, inline or transactional completion) is being written:
    # a lease extension that misses it is that write's to report, not a loss.
    recording: bool = False

    @property
    def finishing(self) -> bool:
        """Its outcome is being written (by the completer or inline), so the row may
        leave ``running`` at any moment without the lease having been lost."""
        return self.completing or self.recording


@dataclass
class WorkerStats:
    """What a worker did; runner threads count concurrently, hence ``count()``."""

    claimed: int = 0
    done: int = 0
    failed: int = 0
    lost: int = 0
    released: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def count(self, name: str) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + 1)


@dataclass(frozen=True)
class WorkerState:
    """One worker's shared state. ``held`` is guarded by ``lock``; ``wakeup`` wakes the
    claim loop (a NOTIFY came, a slot freed); ``done`` tells background threads to end."""

    alias: str
    worker_id: str
    lease_seconds: float
    stats: WorkerStats = field(default_factory=WorkerStats)
    held: dict[int, Held] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    wakeup: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)


class WorkerPart:
    """Base of the classes whose methods run on a worker's threads."""

    def __init__(self, state: WorkerState) -> None:
        self.state = state
        self.alias = state.alias
        self.worker_id = state.worker_id
        self.lease_seconds = state.lease_seconds
        self.stats = state.stats
        self.held = state.held
        self.lock = state.lock
        self.wakeup = state.wakeup
        self.done = state.done
