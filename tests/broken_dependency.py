"""A task module whose dependency is missing on this host (a bad deploy): importing it
raises ModuleNotFoundError for the dependency, not for the module itself."""

import no_such_dependency_of_pgqueue_tests  # noqa: F401

from django_pgqueue.taskapi import task


@task()
def uses_dependency() -> None: ...
