"""Benchmarks for django-pgqueue: scripts that print figures, not timed tests.

Run one with ``python -m bench.<name>`` (or ``make bench NAME=<name>``) from the
repository root; see ``bench/README.md``.
"""
