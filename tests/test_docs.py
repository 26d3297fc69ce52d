"""The settings reference is generated from conf.Settings and must not drift; the
docs' snippets and the project's URLs hold up."""

import ast
import importlib.util
import re
import tomllib
from pathlib import Path

from django_pgqueue.conf import Settings

DOCS = Path(__file__).resolve().parent.parent / "docs"
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


def test_project_urls__point_at_the_docs_and_the_repository():
    """They were placeholders (github.com/django-pgqueue/...)."""
    urls = tomllib.loads((DOCS.parent / "pyproject.toml").read_text())["project"]["urls"]
    docs, repo = DOCS_SITE, REPOSITORY
    assert urls["Documentation"] == docs
    assert urls["Source"] == repo
    assert urls["Issues"] == f"{repo}/issues"
    assert urls["Changelog"].startswith(docs)
    assert urls["Homepage"] in (docs, repo)
