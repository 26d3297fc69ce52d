"""taskapi: the one module that imports the Tasks framework (Django 6.x or the backport)."""

from __future__ import annotations

import ast
from pathlib import Path

import django
import pytest

from django_pgqueue import taskapi
from django_pgqueue.tasks import PgQueueTask

ROOT = Path(__file__).resolve().parent.parent
#: Everything that runs on Django 5.2 too: the package, its tests, the test project, bench.
CHECKED = ("django_pgqueue", "tests", "testproject", "bench")
FRAMEWORK_MODULES = ("django.tasks", "django_tasks")


def framework_imports(path: Path, root: Path = ROOT) -> list[str]:
    """The ``import``/``from ... import`` lines of ``path`` that name the framework."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            if any(name == m or name.startswith(m + ".") for m in FRAMEWORK_MODULES):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {name}")
    return found


def test_taskapi__is_the_only_module_that_imports_the_framework():
    offenders = [
        line
        for folder in CHECKED
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path != ROOT / "django_pgqueue" / "taskapi.py"
        for line in framework_imports(path)
    ]
    assert offenders == [], (
        "import the Tasks framework from django_pgqueue.taskapi, which picks django.tasks "
        "(Django >= 6.0) or the django_tasks backport (Django 5.2):\n" + "\n".join(offenders)
    )


def test_taskapi__guard_sees_each_spelling(tmp_path):
    # The check above would pass vacuously if it missed a form of import.
    module = tmp_path / "m.py"
    module.write_text(
        "import django.tasks\nfrom django.tasks.signals import task_started\n"
        "import django_tasks as dt\nfrom django_tasks import task\nfrom . import tasks\n"
    )
    assert [line.split(": ")[1] for line in framework_imports(module, tmp_path)] == [
        "django.tasks",
        "django.tasks.signals",
        "django_tasks",
        "django_tasks",
    ]


def test_taskapi__framework_matches_the_django_version():
    assert taskapi.BUILTIN is (django.VERSION >= (6, 0))
    assert taskapi.Task.__module__.startswith(taskapi.FRAMEWORK)
    assert taskapi.InvalidTask.__module__ == f"{taskapi.FRAMEWORK}.exceptions"


def test_task__passes_backend_options_to_the_task_class():
    def job() -> None: ...

    job.__qualname__ = "job"  # the framework refuses functions defined in another's body
    made = taskapi.task(transactional=True, timeout=5, max_attempts=2, priority=3)(job)
    assert isinstance(made, PgQueueTask)
    assert (made.transactional, made.timeout, made.max_attempts, made.priority) == (
        True,
        5,
        2,
        3,
    )
    assert made.run_after is None
    assert isinstance(taskapi.task(job), PgQueueTask)


def test_task__refuses_run_after():
    with pytest.raises(TypeError, match=r"use task\.using\(run_after=\.\.\.\)"):
        taskapi.task(run_after=None)
