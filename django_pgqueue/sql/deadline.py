"""A group of statements bound to one time limit (a probe's). Run by
``django_pgqueue.deadline`` only.
"""

from __future__ import annotations

SESSION_BOUND_TRANSACTION = """
-- name: SESSION_BOUND_TRANSACTION
-- A statement_timeout for the current transaction only (behind a transaction pooler a
-- session setting would outlive it).
SELECT set_config('statement_timeout', %(statement_timeout)s, true)
"""
