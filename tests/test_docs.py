"""The settings reference is generated from conf.Settings and must not drift."""

import importlib.util
from pathlib import Path

from django_pgqueue.conf import Settings

DOCS = Path(__file__).resolve().parent.parent / "docs"


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
