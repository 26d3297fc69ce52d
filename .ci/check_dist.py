"""Check the built sdist and wheel in dist/: contents and metadata (after ``twine check``).

Run by ``make dist``; exits non-zero, naming every problem, if

- the wheel lacks a file the app needs at run time (migrations, templates, py.typed, the
  license) or the pytest plugin's entry point, or carries something that is not the app
  (tests, the test project);
- the sdist lacks what it takes to run the tests and build the docs from it;
- the metadata has the wrong name, license or version classifiers;
- the README (the index page's description) has a relative link, which breaks there.
"""

from __future__ import annotations

import re
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DIST = ROOT / "dist"
NAME = "django-tasks-pgqueue"

WHEEL_NEEDS = [
    "django_pgqueue/__init__.py",
    "django_pgqueue/py.typed",
    "django_pgqueue/sql/__init__.py",
    "django_pgqueue/sql/claim.py",
    "django_pgqueue/sql/rendered.sql",
    "django_pgqueue/taskapi.py",
    "django_pgqueue/admin/__init__.py",
    "django_pgqueue/admin/dashboard.py",
    "django_pgqueue/migrations/0001_initial.py",
    "django_pgqueue/management/commands/pgqueue_worker.py",
    "django_pgqueue/templates/admin/django_pgqueue/job/change_list.html",
]
WHEEL_REFUSES = ("tests/", "testkit/", "testproject/", "bench/", "docs/", ".ci/", "scripts/")
SDIST_NEEDS = [
    "LICENSE",
    "README.md",
    "pyproject.toml",
    "MANIFEST.in",
    "django_pgqueue/migrations/0001_initial.py",
    "tests/conftest.py",
    "testproject/settings.py",
    "testproject/manage.py",
    "docs/conf.py",
    "docs/index.md",
    "testkit/oracle.py",
    "Makefile",
    "scripts/dev.sh",
    ".ci/run",
]
#: The pytest plugin's entry point, as entry_points.txt lists it.
PYTEST_PLUGIN = "[pytest11]\ndjango_pgqueue.pytest_plugin = django_pgqueue.pytest_plugin\n"
CLASSIFIERS = [
    "Framework :: Django :: 5.2",
    "Framework :: Django :: 6.0",
    "Framework :: Django :: 6.1",
    "Programming Language :: Python :: 3.12",
    "Programming Language :: Python :: 3.13",
]
#: A Markdown link or image whose target has no scheme and is not an in-page anchor.
RELATIVE_LINK = re.compile(r"!?\[[^\]]*\]\((?![a-z][a-z0-9+.-]*:|#)([^)\s]+)\)")
#: A reference-style link definition ("[docs]: target") whose target has no scheme.
RELATIVE_DEFINITION = re.compile(r"^\s*\[[^\]]+\]:\s*(?![a-z][a-z0-9+.-]*:|#)(\S+)", re.M)


def only(pattern: str) -> Path:
    found = sorted(DIST.glob(pattern))
    if len(found) != 1:
        sys.exit(f"expected one {pattern} in {DIST}, found {[p.name for p in found]}")
    return found[0]


def main() -> int:
    problems: list[str] = []
    wheel, sdist = only("*.whl"), only("*.tar.gz")

    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(zf.read(f"{dist_info}/METADATA").decode())
        entry_points = (
            zf.read(f"{dist_info}/entry_points.txt").decode()
            if f"{dist_info}/entry_points.txt" in names
            else ""
        )
    problems += [f"wheel lacks {n}" for n in WHEEL_NEEDS if n not in names]
    if f"{dist_info}/licenses/LICENSE" not in names:
        problems.append("wheel lacks its LICENSE (dist-info/licenses/LICENSE)")
    problems += [f"wheel carries {n}" for n in sorted(names) if n.startswith(WHEEL_REFUSES)]
    if PYTEST_PLUGIN not in entry_points:
        problems.append("wheel lacks the pytest11 entry point of the pgqueue fixture")

    with tarfile.open(sdist) as tf:
        prefix = tf.getnames()[0].split("/")[0]
        members = {n.removeprefix(prefix + "/") for n in tf.getnames()}
    problems += [f"sdist lacks {n}" for n in SDIST_NEEDS if n not in members]
    problems += [f"sdist carries {n}" for n in sorted(members) if "__pycache__" in n]

    if meta["Name"] != NAME:
        problems.append(f"metadata Name is {meta['Name']!r}, not {NAME!r}")
    if meta["License-Expression"] != "BSD-3-Clause":
        problems.append(f"License-Expression is {meta['License-Expression']!r}")
    classifiers = meta.get_all("Classifier") or []
    problems += [f"classifier missing: {c}" for c in CLASSIFIERS if c not in classifiers]
    if not any(c.startswith("Development Status ::") for c in classifiers):
        problems.append("no Development Status classifier")
    urls = meta.get_all("Project-URL") or []
    if not any(u.startswith("Documentation,") for u in urls):
        problems.append("no Documentation project URL")
    if meta["Description-Content-Type"] != "text/markdown":
        problems.append(f"README content type is {meta['Description-Content-Type']!r}")
    body = meta.get_payload()
    relative = RELATIVE_LINK.findall(body) + RELATIVE_DEFINITION.findall(body)
    problems += [f"README has a relative link: {target}" for target in relative]

    for problem in problems:
        print(f"check_dist: {problem}", file=sys.stderr)
    if not problems:
        print(f"check_dist: {wheel.name} ({len(names)} files) and {sdist.name} are complete")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
