"""The package's import graph: layers that only look down.

Read from the source (``ast``), so it holds for every module whether or not a test
imports it: no import circle (Django's models/manager pair, which Django itself ties,
is the one allowed), and no import of a package module placed inside a function, where
it would only hide a circle from the module's top.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "django_pgqueue"
#: Django's own pair: a model names its manager, the manager names its model only in
#: annotations (under TYPE_CHECKING). Annotation-only imports count everywhere else.
ALLOWED_CIRCLES: list[set[str]] = [{"django_pgqueue.manager", "django_pgqueue.models"}]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        found[module_name(path)] = path
    return found


def resolve(current: str, is_package: bool, node: ast.ImportFrom, known: set[str]) -> list[str]:
    """The package modules a ``from ... import ...`` depends on: each name that is a
    module (``from . import sql``), and the module itself for every other name."""
    if node.level:
        base = current.split(".") if is_package else current.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join([*base, node.module] if node.module else base)
    else:
        target = node.module or ""
    submodules = [f"{target}.{alias.name}" for alias in node.names]
    named = [m for m in submodules if m in known]
    return named if len(named) == len(submodules) else [target, *named]


def imports() -> tuple[dict[str, set[str]], list[str]]:
    """Module-level imports between package modules, and every nested import of one."""
    known = modules()
    graph: dict[str, set[str]] = {name: set() for name in known}
    nested: list[str] = []
    for name, path in known.items():
        tree = ast.parse(path.read_text())
        is_package = path.name == "__init__.py"

        def visit(node: ast.AST, depth: int, *, name: str = name, is_package: bool = is_package):
            for child in ast.iter_child_nodes(node):
                inner = depth + isinstance(
                    child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
                )
                targets: list[str] = []
                if isinstance(child, ast.ImportFrom):
                    targets = resolve(name, is_package, child, set(known))
                elif isinstance(child, ast.Import):
                    targets = [alias.name for alias in child.names]
                hits = {t for t in targets if t in known and t != name}
                # Django's way of registering checks: AppConfig.ready() imports them.
                in_ready = name == "django_pgqueue.apps" and getattr(node, "name", "") == "ready"
                # pytest loads its plugin in every run where the package is installed:
                # the fixture imports the testing module when a test asks for it.
                in_fixture = name == "django_pgqueue.pytest_plugin"
                if hits and inner and not (in_ready or in_fixture):
                    nested.append(f"{name}:{child.lineno} imports {sorted(hits)}")
                elif hits:
                    graph[name] |= hits
                visit(child, inner)

        visit(tree, 0)
    return graph, nested


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def strong(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                strong(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in graph:
        if node not in index:
            strong(node)
    return found


def test_layers__no_import_circle():
    graph, _ = imports()
    assert [c for c in circles(graph) if c not in ALLOWED_CIRCLES] == []


def test_layers__no_package_import_inside_a_function():
    _, nested = imports()
    assert nested == []


def test_layers__nothing_imports_the_backend():
    graph, _ = imports()
    importers = sorted(
        name for name, targets in graph.items() if "django_pgqueue.backend" in targets
    )
    assert importers == []


def test_layers__the_check_sees_a_planted_circle(tmp_path, monkeypatch):
    """The circle finder finds one: two modules importing each other."""
    assert circles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [{"a", "b"}]


#: Modules that run statements themselves rather than through db.py, and why: bulk
#: streams COPY (its own jobs', and a workflow's) on the transaction's cursor, deadline
#: binds each statement of a block, the worker's connections check and reset a runner's
#: raw session and LISTEN on the listener's connection of its own, outside Django's.
OWN_EXECUTE = {
    "django_pgqueue.bulk",
    "django_pgqueue.deadline",
    "django_pgqueue.hub",
    "django_pgqueue.worker.connections",
}


def test_layers__sql_runs_through_db_or_a_named_exception():
    """Every statement is a constant of sql.py, run by db.py or one of OWN_EXECUTE."""
    running: set[str] = set()
    for name, path in modules().items():
        if name == "django_pgqueue.db" or name.startswith("django_pgqueue.sql"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("execute", "executemany", "copy")
                and node.args
            ):
                continue
            statement = ast.unparse(node.args[0])
            if statement in ("job", "request.POST"):  # JobRunner.execute(job)
                continue
            running.add(name)
            # A sql.py constant, or a helper's parameter that callers pass one in.
            assert "sql." in statement or statement == "query", f"{name}:{node.lineno}"
    assert running == OWN_EXECUTE


def sql_imports() -> dict[str, set[str]]:
    """For each module outside ``sql/``, the SQL modules it imports (module-level)."""
    graph, _ = imports()
    return {
        name: {t for t in targets if t.startswith("django_pgqueue.sql")}
        for name, targets in graph.items()
        if not name.startswith("django_pgqueue.sql")
    }


def readers(found: dict[str, set[str]]) -> dict[str, set[str]]:
    """Each SQL module and the modules outside ``sql/`` that import it."""
    by_family: dict[str, set[str]] = {}
    for name, targets in found.items():
        for target in targets:
            by_family.setdefault(target, set()).add(name)
    return by_family


#: The one module outside sql/ that may read each fragment module: the modules of a
#: family read its fragments through their statements. Workflows owns what a released
#: dependant's NOTIFY says (RELEASE_NOTIFY_PREFIX), which the listener reads from it.
FRAGMENT_READERS = {"django_pgqueue.sql.resolve": {"django_pgqueue.workflows"}}
#: The one module that reads the package as a whole: the states, for every statement's
#: moves (TRANSITIONS).
REGISTRY_READERS = {"django_pgqueue.states"}


def test_layers__each_sql_family_is_read_by_its_one_runner():
    """``sql/<family>.py`` is imported by the module ``sql.RUNNERS`` names and no other,
    so a family's statements run from one place; no module reads the statements through
    the package (``sql.JOB_CLAIM``, for tests and benches) but the states'."""
    from django_pgqueue import sql

    found = readers(sql_imports())
    for family, runner in sql.RUNNERS.items():
        assert found.pop(f"django_pgqueue.sql.{family}", set()) == {runner}, family
    for fragments, allowed in FRAGMENT_READERS.items():
        assert found.pop(fragments, set()) <= allowed, fragments
    assert found.pop("django_pgqueue.sql", set()) == REGISTRY_READERS
    assert found == {}, f"SQL modules read from outside their family: {found}"


def test_layers__the_runner_check_sees_a_planted_second_reader():
    """Planted: a second module importing a family's statements is caught."""
    planted = {**sql_imports(), "django_pgqueue.admin.jobs": {"django_pgqueue.sql.claim"}}
    assert readers(planted)["django_pgqueue.sql.claim"] == {
        "django_pgqueue.claim",
        "django_pgqueue.admin.jobs",
    }
