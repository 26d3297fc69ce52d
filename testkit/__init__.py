"""Helpers that the tests and the benchmarks share: neither imports the other.

* :mod:`testkit.oracle`: the chaos suite's fault plants, sampled invariants and verdict;
* :mod:`testkit.private_server`: a throw-away PostgreSQL server that may be restarted;
* :mod:`testkit.private_bouncer`: a private PgBouncer in transaction pooling mode;
* :mod:`testkit.browser`: a headless Chromium for the admin's browser tests.

Not part of the wheel (only ``django_pgqueue`` is); the sdist carries it with the tests.
"""
