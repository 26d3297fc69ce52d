"""The database's clock, read once by a caller that stamps many rows with it (COPY cannot
evaluate an expression per row) or that computes from it (periodic ticks, monitoring).
Run by ``django_pgqueue.db`` only (``db.clock``).
"""

from __future__ import annotations

CLOCK_NOW = """
-- name: CLOCK_NOW
-- The database's now, or the pinned one; read once where many rows or ticks use it.
SELECT coalesce(%(now)s::timestamptz, clock_timestamp())
"""
