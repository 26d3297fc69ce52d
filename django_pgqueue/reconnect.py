"""Waiting out a database fault: the pause between reconnect attempts, and dropping a
connection so that the next query reconnects.

Shared by every loop that talks to the database on its own (the worker's parts, the
supervisor, the sweeper).
"""

from __future__ import annotations

import random

from django.db import DatabaseError, connections

#: Longest wait between reconnection attempts after a database error.
MAX_BACKOFF = 30.0


def backoff_delay(failures: int) -> float:
    """Exponential backoff with jitter for reconnect loops: 0.5 s, 1 s, 2 s ... 30 s."""
    return min(MAX_BACKOFF, 0.5 * 2 ** min(failures - 1, 10)) * random.uniform(0.8, 1.2)


def close_connection(alias: str) -> None:
    """Drop this thread's connection so the next query reconnects."""
    try:
        connections[alias].close()
    except DatabaseError:
        pass
