"""The pytest plugin of django-tasks-pgqueue: the ``pgqueue`` fixture.

The distribution registers it as a ``pytest11`` entry point, so pytest loads it at
start-up wherever the package is installed (``-p no:django_pgqueue.pytest_plugin``
turns it off). Loading it imports nothing but pytest and the package's lazy top module:
the package's other modules, and Django's, are imported when a test first asks for the
fixture.
"""

from __future__ import annotations

from types import ModuleType

import pytest


@pytest.fixture
def pgqueue(db: None) -> ModuleType:
    """``django_pgqueue.testing``, whose ``assert_enqueued``, ``assert_not_enqueued``,
    ``enqueued`` and ``run_jobs`` a test calls as ``pgqueue.run_jobs()``, with
    pytest-django's database access: its ``db`` fixture, which is ``transactional_db``
    in a test marked ``django_db(transaction=True)`` or asking for that fixture.

    (``db`` is asked for here, not looked up when the fixture runs: pytest-django
    creates the test databases for the tests that ask for ``db`` when they are
    collected; a test asking only for ``pgqueue`` would otherwise run against the
    database of the settings.)"""
    # Here, not at the top: the plugin is loaded in every pytest run of a project that
    # has the package installed, Django project or not.
    from django_pgqueue import testing

    return testing
