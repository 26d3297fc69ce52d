"""The range every numeric command-line flag and ``PGQUEUE_*`` setting must be in.

One table for both: a flag's argparse ``type=`` function and the settings' system check
(``checks.py``) read the same :class:`Bounds`, and the reference docs print them. The
ranges keep a worker out of the values that crash or wedge it: a lease of ``1e300``
seconds overflows the heartbeat's timer, ``1e-9`` expires before any heartbeat can
extend it, ``99999999999`` runner threads are a thread storm that ignores SIGTERM, and
a poll interval of ``1e-9`` is a busy loop. No Django import here: the docs generator
reads this module without a configured project.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Any

DAY = 86400


@dataclass(frozen=True)
class Bounds:
    """An inclusive range of ints (``integer``) or finite numbers, in ``unit``."""

    low: float
    high: float
    integer: bool = False
    unit: str = ""

    def describe(self) -> str:
        """The range in words, as error messages and the docs give it."""
        kind = "an integer" if self.integer else "a number"
        unit = f" of {self.unit}" if self.unit else ""
        return f"{kind}{unit} from {_number(self.low)} to {_number(self.high)}"

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is out of range, naming it (None: it is fine). Never raises."""
        reason = self._reason(value)
        return None if reason is None else f"{_show(value)} {reason}"

    def _reason(self, value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"is not {'an integer' if self.integer else 'a number'}"
        if self.integer and not isinstance(value, int):
            return "is not an integer"
        if isinstance(value, float) and not math.isfinite(value):
            return "is not a finite number"
        if not self.low <= value <= self.high:
            return "is out of range"
        return None

    def parse(self, text: str) -> int | float:
        """argparse ``type=``: the flag's value, or ``ArgumentTypeError`` naming the range."""
        value: int | float | None
        try:
            value = int(text) if self.integer else float(text)
        except ValueError:  # also a string of more digits than int() may read
            value = None
        reason = self._reason(value)
        if reason is not None:
            raise argparse.ArgumentTypeError(f"{_show(text)} {reason}: use {self.describe()}")
        assert value is not None
        return value


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


def _show(value: Any, limit: int = 40) -> str:
    try:
        text = repr(value)
    except ValueError:  # an int beyond Python's int-to-str digit limit
        text = f"an int of {value.bit_length()} bits"
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- shared by a flag and a setting -----------------------------------------------

#: A lease shorter than a second expires under an ordinary GC pause or slow query; one
#: day is far beyond any heartbeat interval (it extends a third of a lease at a time).
LEASE_SECONDS = Bounds(1, DAY, unit="seconds")
#: Each runner is a thread with its own database connection.
CONCURRENCY = Bounds(1, 1000, integer=True)
#: Worker processes under one supervisor (each holds concurrency + 4 connections).
PROCESSES = Bounds(1, 256, integer=True)
#: Coroutine jobs on a worker's event loop: each a few kilobytes while it waits.
ASYNC_CONCURRENCY = Bounds(0, 100_000, integer=True)
#: Jobs claimed per statement (and held locally, leased, when above the concurrency).
BATCH_SIZE = Bounds(1, 10_000, integer=True)
#: Below 10 ms polling is a busy loop; NOTIFY wakes a worker sooner anyway.
POLL_INTERVAL = Bounds(0.01, 3600, unit="seconds")
GRACE_SECONDS = Bounds(0, DAY, unit="seconds")
#: A supervisor's wait for its children at shutdown; at least a second to drain at all.
STOP_SECONDS = Bounds(1, DAY, unit="seconds")
MAX_JOBS = Bounds(1, 1_000_000_000, integer=True)
#: ``pgqueue_worker --max-memory``, in MB of resident memory.
MAX_MEMORY = Bounds(1, 10_000_000, integer=True)
SWEEP_INTERVAL = Bounds(0.1, DAY, unit="seconds")
#: The least ``PGQUEUE_MAX_RESULT_BYTES`` may be.
MIN_RESULT_BYTES = 1000

#: ``PGQUEUE_<NAME>`` -> (its bounds, whether None is allowed, its check id). Every
#: numeric attribute of ``conf.Settings`` is here (a test enforces it); ids are stable.
SETTINGS: dict[str, tuple[Bounds, bool, str]] = {
    "LEASE_SECONDS": (LEASE_SECONDS, False, "pgqueue.E010"),
    # The per-job limit is stored in an integer column.
    "MAX_ATTEMPTS": (Bounds(1, 2**31 - 1, integer=True), False, "pgqueue.E011"),
    "RETRY_BACKOFF_BASE": (Bounds(0, DAY, unit="seconds"), False, "pgqueue.E012"),
    "RETRY_BACKOFF_MAX": (Bounds(0, 30 * DAY, unit="seconds"), False, "pgqueue.E013"),
    "RETENTION_SECONDS": (Bounds(0, 3650 * DAY, unit="seconds"), False, "pgqueue.E014"),
    "CANCELLED_RETENTION_SECONDS": (
        Bounds(0, 3650 * DAY, unit="seconds"),
        True,
        "pgqueue.E041",
    ),
    "DEAD_RETENTION_SECONDS": (Bounds(0, 3650 * DAY, unit="seconds"), True, "pgqueue.E042"),
    "SWEEP_BATCH_SIZE": (Bounds(1, 100_000, integer=True), False, "pgqueue.E015"),
    # At least 1: a dead job keeps the error that killed it.
    "KEEP_ERRORS": (Bounds(1, 1000, integer=True), False, "pgqueue.E016"),
    "POLL_INTERVAL": (POLL_INTERVAL, False, "pgqueue.E017"),
    # jsonb holds at most 255 MB per value; a job is a row, not a file store.
    "MAX_PAYLOAD_BYTES": (Bounds(1, 100_000_000, integer=True), False, "pgqueue.E018"),
    # jsonb stores a value in up to six times its JSON text and refuses a container
    # over 256 MB: results up to 40 MB always fit. (The floor spares small results a
    # settings lookup: see validation.result_json.)
    "MAX_RESULT_BYTES": (
        Bounds(MIN_RESULT_BYTES, 40_000_000, integer=True),
        False,
        "pgqueue.E028",
    ),
    "JOB_TIMEOUT_SECONDS": (Bounds(0.1, 30 * DAY, unit="seconds"), True, "pgqueue.E019"),
    "SOFT_TIME_LIMIT": (Bounds(0.1, 30 * DAY, unit="seconds"), True, "pgqueue.E070"),
    "TIME_LIMIT": (Bounds(0.1, 30 * DAY, unit="seconds"), True, "pgqueue.E071"),
    "SHUTDOWN_GRACE_SECONDS": (GRACE_SECONDS, True, "pgqueue.E020"),
    "SUPERVISOR_STOP_SECONDS": (STOP_SECONDS, False, "pgqueue.E026"),
    "BURST_CONNECT_TIMEOUT": (Bounds(0, DAY, unit="seconds"), False, "pgqueue.E027"),
    "COMPLETION_FLUSH_INTERVAL": (Bounds(0, 3600, unit="seconds"), False, "pgqueue.E021"),
    "COMPLETION_BATCH_SIZE": (Bounds(1, 10_000, integer=True), False, "pgqueue.E022"),
    # 0: every claim from the head of the claim index (as before claims resumed).
    "CLAIM_RESCAN_SECONDS": (Bounds(0, 3600, unit="seconds"), False, "pgqueue.E023"),
    "LOST_WORKER_SECONDS": (Bounds(0, 365 * DAY, unit="seconds"), False, "pgqueue.E040"),
    # Each listed queue costs about ten series per scrape.
    "METRICS_MAX_QUEUES": (Bounds(0, 100_000, integer=True), False, "pgqueue.E024"),
    # Stored in an integer column; 0: a task may not snooze at all.
    "MAX_SNOOZES": (Bounds(0, 2**31 - 1, integer=True), False, "pgqueue.E029"),
    # Progress is written every few seconds: a row, not a file store.
    "MAX_PROGRESS_BYTES": (Bounds(1, 10_000_000, integer=True), False, "pgqueue.E031"),
    "ASYNC_CONCURRENCY": (ASYNC_CONCURRENCY, False, "pgqueue.E060"),
    # Each a thread and a database connection.
    "ASYNC_THREADS": (Bounds(1, 256, integer=True), False, "pgqueue.E062"),
}


def setting_range(name: str) -> str:
    """The allowed values of ``PGQUEUE_<name>`` in words (for the docs)."""
    bounds, nullable, _ = SETTINGS[name]
    return bounds.describe() + (", or None" if nullable else "")
