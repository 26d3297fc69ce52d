"""The repository's layers: tests and bench share helpers through ``testkit``, never
import each other, and ``testkit`` depends on neither."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def imported_packages(path: Path) -> set[str]:
    """Top-level names ``path`` imports (relative imports count as its own package)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add(path.parent.name if node.level else (node.module or "").split(".")[0])
    return names


@pytest.mark.parametrize(
    ("package", "refused"),
    [("bench", {"tests"}), ("testkit", {"tests", "bench"})],
)
def test_package__imports_no_layer_above_it(package: str, refused: set[str]) -> None:
    modules = sorted((REPO / package).glob("*.py"))
    assert modules, f"{package}/ has no modules"
    offenders = {
        str(path.relative_to(REPO)): sorted(imported_packages(path) & refused)
        for path in modules
        if imported_packages(path) & refused
    }
    assert offenders == {}, f"import these from testkit instead: {offenders}"


def test_tests__hold_no_shared_helper() -> None:
    # Everything in tests/ besides the test modules is pytest's or a task module of the
    # tests' own; a helper that bench wants too belongs in testkit/.
    own = {
        "__init__",
        "conftest",
        "tasks",
        "broken_at_import",
        "broken_dependency",
        "raises_at_import",
        "plain_tasks",
        "settings_only_the_app",
        "settings_without_app",
        "settings_without_postgres",
    }
    others = {
        path.stem for path in (REPO / "tests").glob("*.py") if not path.stem.startswith("test_")
    }
    assert others == own
