"""The installed distribution: its name, version and what its commands say about it."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import metadata, version
from pathlib import Path

import django
import pytest
from django.core.management import load_command_class

import django_pgqueue

DISTRIBUTION = "django-tasks-pgqueue"
REPO = Path(__file__).resolve().parent.parent
COMMANDS = sorted(
    path.stem
    for path in (Path(django_pgqueue.__file__).parent / "management" / "commands").glob("*.py")
    if path.stem != "__init__"
)


def test_version__comes_from_the_distribution():
    assert django_pgqueue.__version__ == version(DISTRIBUTION)
    assert metadata(DISTRIBUTION)["Name"] == DISTRIBUTION


def test_commands__there_are_some():
    assert {"pgqueue_worker", "pgqueue_sweep"} <= set(COMMANDS)


@pytest.mark.parametrize("name", COMMANDS)
def test_command__version_prints_this_packages_version(name, capsys):
    command = load_command_class("django_pgqueue", name)
    parser = command.create_parser("manage.py", name)
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["--version"])
    assert exit_.value.code == 0
    printed = capsys.readouterr().out.strip()
    assert printed == version(DISTRIBUTION)
    assert printed != django.get_version()


def test_templates__use_no_tag_that_django_5_2_lacks():
    # {% csp_nonce_attr %} is Django 6.1's; the csp_nonce context variable works on all.
    templates = Path(django_pgqueue.__file__).parent / "templates"
    offenders = [
        str(path.relative_to(templates))
        for path in sorted(templates.rglob("*.html"))
        if "csp_nonce_attr" in path.read_text()
    ]
    assert offenders == [], f"use {{% if csp_nonce %}} instead of csp_nonce_attr: {offenders}"


def test_package__public_names_are_imported_on_first_use():
    """``import django_pgqueue`` loads no Django (pytest imports it to load the plugin in
    every run); each name of ``__all__`` is there once asked for."""
    code = (
        "import sys, django_pgqueue as p\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'psycopg')))\n"
        "names = {n: getattr(p, n) for n in p.__all__}\n"
        "print(sorted(n for n in p.__all__ if n not in dir(p)))\n"
        "print(all(getattr(sys.modules[v.__module__], n, None) is v"
        " for n, v in names.items() if hasattr(v, '__module__')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout.splitlines()
    assert out == ["[]", "[]", "True"]
    assert sorted(django_pgqueue.__all__) == sorted(django_pgqueue._EXPORTS)
    # Issue 28 item 9: what a cooperative task raises is a top-level name, as Snooze is.
    from django_pgqueue.exceptions import JobCancelled

    assert django_pgqueue.JobCancelled is JobCancelled
    with pytest.raises(AttributeError, match="has no attribute 'nothing_here'"):
        django_pgqueue.nothing_here  # noqa: B018 - the access is the test
