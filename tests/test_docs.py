"""The docs must not drift: the settings reference is generated from conf.Settings,
every developer command they name is a target of the Makefile, and the docs' snippets
and the project's URLs hold up."""

import ast
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from django_pgqueue.conf import Settings

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
README = REPO / "README.md"
#: A target with its one-line description: ``name: [prerequisites] ## description``.
TARGET = re.compile(r"^([a-z]+):[^=\n]*?(?:## (.+))?$", re.M)
#: A ``make TARGET`` command in code: a code line or an inline code span.
MAKE_COMMAND = re.compile(r"(?:^\s*|`)make ([a-z]+)", re.M)
DOCS_SITE = "https://django-tasks-pgqueue.readthedocs.io/"
REPOSITORY = "https://github.com/django-tasks-pgqueue/django-tasks-pgqueue"


def load_generator():
    spec = importlib.util.spec_from_file_location("gen", DOCS / "gen_settings_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_settings_reference__matches_conf():
    generator = load_generator()
    assert (DOCS / "reference" / "settings.md").read_text() == generator.render(), (
        "docs/reference/settings.md is stale: run python docs/gen_settings_reference.py"
    )


def test_settings_reference__lists_every_setting():
    names = {name for name, _, _ in load_generator().rows()}
    declared = {f"PGQUEUE_{n}" for n in vars(Settings) if n.isupper()}
    assert names == declared


def makefile_targets() -> dict[str, str | None]:
    """Each rule of the Makefile, in order, with its ``##`` description (None without)."""
    return {m[1]: m[2] for m in TARGET.finditer((REPO / "Makefile").read_text())}


def documents() -> list[Path]:
    return [
        README,
        *sorted(DOCS.rglob("*.md")),
        DOCS / "conf.py",
        *sorted((REPO / "bench").glob("*.py")),
        REPO / "bench" / "README.md",
    ]


def test_makefile__every_target_is_phony_and_described():
    targets = makefile_targets()
    assert {"help", "setup", "demo", "test", "lint", "docs", "dist", "ci"} <= set(targets)
    assert [name for name, text in targets.items() if not text] == []
    (phony,) = re.findall(r"^\.PHONY: (.+)$", (REPO / "Makefile").read_text(), re.M)
    assert phony.split() == list(targets)


@pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")
def test_make_help__is_the_default_and_lists_every_target():
    listing = subprocess.run(
        ["make", "-s"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    listed = re.findall(r"^  ([a-z]+) +(\S.*)$", listing, re.M)
    assert listed == [(name, text) for name, text in makefile_targets().items()]


def test_docs__name_only_make_targets_and_benches_that_exist():
    targets = set(makefile_targets())
    benches = {path.stem for path in (REPO / "bench").glob("*.py")}
    unknown = {}
    for path in documents():
        text = path.read_text()
        named = set(MAKE_COMMAND.findall(text)) - targets
        named |= set(re.findall(r"make bench NAME=([a-z_]+)", text)) - benches
        if named:
            unknown[str(path.relative_to(REPO))] = sorted(named)
    assert unknown == {}
    assert ".ci/dev" not in "".join(path.read_text() for path in documents())


def test_readme__fresh_machine_runs_the_makefile_and_contributing_lists_it():
    readme = README.read_text()
    fresh = readme.split("## Try it from a clone", 1)[1].split("\n## ", 1)[0]
    assert {"demo", "test"} <= set(MAKE_COMMAND.findall(fresh))
    contributing = readme.split("## Contributing", 1)[1].split("\n## ", 1)[0]
    assert set(MAKE_COMMAND.findall(contributing)) == set(makefile_targets())


def test_ci_run__runs_each_step_through_the_makefile():
    """.ci/run is CI's list of steps; each is a make target, as a developer runs it
    (make matrix is run by hand: on a 2-core VM CI has no minutes left for it)."""
    text = (REPO / ".ci" / "run").read_text()
    assert "scripts/dev.sh" not in text
    assert {"setup", "lint", "docs", "dist", "test"} <= set(MAKE_COMMAND.findall(text))


def python_blocks():
    """(file, block) for every fenced python block of the docs and the README."""
    fence = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
    for path in [DOCS.parent / "README.md", *sorted(DOCS.rglob("*.md"))]:
        if "_build" in path.parts:
            continue
        for block in fence.findall(path.read_text()):
            yield path.relative_to(DOCS.parent), block


def test_snippets__need_nothing_a_plain_project_lacks():
    """monitoring.md read the token with django-environ's env(), which the reader's
    project may not have: snippets use os.environ."""
    found = []
    for path, block in python_blocks():
        try:
            tree = ast.parse(block)
        except SyntaxError:
            continue  # a fragment with "..." in it: nothing runs it
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "env"
            ):
                found.append(f"{path}: env(...) on line {node.lineno} of a snippet")
    assert found == []
    assert any("os.environ" in block for _, block in python_blocks())


#: The options of ``django_pgqueue.task`` that Django's own ``@task`` refuses on 6.0.
PGQUEUE_OPTIONS = {"concurrency_key", "transactional", "timeout", "backoff", "max_attempts"}


def test_snippets__declare_pgqueue_options_with_the_packages_own_task():
    """Issue 28 item 9: flow-control.md declared ``@task(concurrency_key=...)`` with
    ``from django.tasks import task``, a TypeError on Django 6.0; coroutine-tasks.md
    imported the internal ``django_pgqueue.taskapi``. A snippet using this backend's
    options imports ``task`` from ``django_pgqueue``; none imports ``taskapi``."""
    found = []
    for path, block in python_blocks():
        if "django_pgqueue.taskapi" in block:
            found.append(f"{path}: imports django_pgqueue.taskapi")
        try:
            tree = ast.parse(block)
        except SyntaxError:
            continue
        frameworks = {
            alias.asname or alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module in ("django.tasks", "django_tasks")
            for alias in node.names
            if alias.name == "task"
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in frameworks
                and {k.arg for k in node.keywords} & PGQUEUE_OPTIONS
            ):
                found.append(f"{path}: Django's @task with this backend's options")
    assert found == []


def test_project_urls__point_at_the_docs_and_the_repository():
    """They were placeholders (github.com/django-pgqueue/...)."""
    urls = tomllib.loads((DOCS.parent / "pyproject.toml").read_text())["project"]["urls"]
    docs, repo = DOCS_SITE, REPOSITORY
    assert urls["Documentation"] == docs
    assert urls["Source"] == repo
    assert urls["Issues"] == f"{repo}/issues"
    assert urls["Changelog"].startswith(docs)
    assert urls["Homepage"] in (docs, repo)


#: A file of a page's runnable example: a ``{code-block} python`` captioned with the
#: file's path in the example project (``accounts/tasks.py``).
EXAMPLE_FILE = re.compile(
    r"^```\{code-block\} python\n:caption: ([\w/]+\.py)\n\n(.*?)^```", re.S | re.M
)


def example_projects() -> dict[str, dict[str, str]]:
    """Each page that has a runnable example: its files, by path."""
    found = {}
    for path in sorted(DOCS.rglob("*.md")):
        if "_build" in path.parts:
            continue
        files = dict(EXAMPLE_FILE.findall(path.read_text()))
        if files:
            found[str(path.relative_to(DOCS))] = files
    return found


def test_examples__the_testing_howto_has_its_two():
    """The testing how-to's examples are runnable ones (its captions name their files)."""
    files = example_projects()["howto/testing.md"]
    assert set(files) == {"accounts/tasks.py", "accounts/tests.py", "accounts/test_signup.py"}


@pytest.mark.slow
@pytest.mark.parametrize("page", sorted(example_projects()))
def test_examples__run_as_tests(page, tmp_path):
    """A page's example project, written out as its captions say, passes its own tests
    (every ``def test_`` of them) with pytest and pytest-django against the test
    project's settings, in a database of its own, with the package's pytest plugin."""
    files = example_projects()[page]
    for name, text in files.items():
        target = tmp_path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        (target.parent / "__init__.py").touch()
        target.write_text(text)
    tests = [name for name in files if re.fullmatch(r"(.*/)?tests?(_\w+)?\.py", name)]
    expected = sum(len(re.findall(r"^\s*def test_", files[name], re.M)) for name in tests)
    database = os.environ.get("PGQUEUE_TEST_DB") or "test_pgqueue"
    result = subprocess.run(
        [
            sys.executable,
            *("-m", "pytest", "-p", "django_pgqueue.pytest_plugin", "-p", "no:cacheprovider"),
            *("--ds", "testproject.settings", "-W", "error", "-q", *tests),
        ],
        cwd=tmp_path,
        env={
            **os.environ,
            "PYTHONPATH": str(REPO),
            "PGQUEUE_TEST_DB": f"{database}_{Path(page).stem}",
        },
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-3000:]
    assert f"{expected} passed" in result.stdout, result.stdout[-3000:]
