"""The worker process: claim -> run -> complete or fail, with leases kept by a heartbeat.

One module per part, each a thread on its own database connection:

* ``loop``: :class:`Worker`, the lifecycle and the claim loop (main thread);
* ``runner``: runs one claimed job and records failures and transactional completions;
* ``completer``: records successful ordinary jobs in batches;
* ``outcomes``: reports recorded outcomes (log line, Django's task signals);
* ``heartbeat``: extends the leases this worker holds;
* ``listener``: LISTEN for wake-ups;
* ``state``: what the parts share (held jobs, lock, events, counters);
* ``connections``: connection helpers (session set-up, backoff, recycling);
* ``inline``: the runner and completer without threads, on the caller's own thread and
  connection (``testing.run_jobs``).
"""

from .loop import Worker
from .state import WorkerStats

__all__ = ["Worker", "WorkerStats"]
