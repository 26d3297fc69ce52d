"""Sphinx configuration of the documentation site (``make docs``).

The pages are the Markdown files of this folder, read by MyST; the Python API reference
(``reference/api.md``) is generated from the package's docstrings by autodoc, which
imports the package, so Django is set up with the test project's settings (nothing
connects to a database). CI builds with ``-W``: every warning is an error.
"""

from __future__ import annotations

import os
import sys
from importlib.metadata import version as dist_version
from pathlib import Path

import django

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
os.environ.setdefault("DATABASE_URL", "postgres://localhost/docs")  # never connected to
django.setup()

project = "django-tasks-pgqueue"
author = "the django-tasks-pgqueue developers"
copyright = "2026, the django-tasks-pgqueue developers"  # noqa: A001 - Sphinx's name
release = dist_version("django-tasks-pgqueue")

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinxcontrib.mermaid"]
# ```mermaid fences (which GitHub also renders) become diagrams.
myst_fence_as_directive = ["mermaid"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "README.md"]
# Links to headings ("reliability.md#ordinary-tasks-idempotent-effects") resolve.
myst_heading_anchors = 4

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"show-inheritance": True}

html_theme = "furo"
html_title = f"django-tasks-pgqueue {release}"
