"""The admin package's layout: its modules import only downwards (``base`` at the
bottom, the pages at the top, ``__init__`` above them all), at module level only, so
no module can be half-initialised when another imports it."""

from __future__ import annotations

import ast
from pathlib import Path

from django.contrib import admin

import django_pgqueue.admin
from django_pgqueue.models import (
    Dashboard,
    DeadLetter,
    Job,
    Limit,
    Queue,
    Schedule,
    ScheduleDefinition,
    WorkerProcess,
)

PACKAGE = Path(django_pgqueue.admin.__file__).parent
#: Each module's level: a module may import only modules of a lower level.
LEVELS = {
    "base": 0,
    "charts": 0,
    "paginator": 0,
    "search": 0,
    "workflow": 0,
    "bulk_actions": 1,
    "filters": 1,
    "read_only_jobs": 1,
    "tags": 1,
    "timeline": 1,
    "dashboard": 2,
    "database_schedules": 2,
    "dead_letters": 2,
    "flow": 2,
    "jobs": 2,
    "schedules": 2,
    "workers": 2,
    "__init__": 3,
}


def package_imports(tree: ast.Module) -> list[tuple[str, bool]]:
    """(sibling module, imported at module level) for each ``from . import`` or
    ``from .x import`` in ``tree``."""
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names = [node.module] if node.module else [a.name for a in node.names]
            found += [(name.split(".")[0], id(node) in top) for name in names]
    return found


def test_admin_package__every_module_has_a_level():
    assert {p.stem for p in PACKAGE.glob("*.py")} == set(LEVELS)


def test_admin_package__imports_only_look_down_and_only_at_module_level():
    wrong = []
    for path in sorted(PACKAGE.glob("*.py")):
        tree = ast.parse(path.read_text())
        for target, at_top in package_imports(tree):
            if not at_top:
                wrong.append(f"{path.stem} imports {target} inside a block")
            elif LEVELS[target] >= LEVELS[path.stem]:
                wrong.append(f"{path.stem} imports {target}, not below it")
    assert not wrong, wrong


def test_admin_package__importing_it_registers_every_page():
    for model in (
        Job,
        DeadLetter,
        Schedule,
        ScheduleDefinition,
        WorkerProcess,
        Dashboard,
        Queue,
        Limit,
    ):
        assert admin.site.is_registered(model), model
