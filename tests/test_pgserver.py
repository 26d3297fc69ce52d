"""testproject/pgserver.py: where the embedded server keeps its files."""

from __future__ import annotations

import os

from testproject import pgserver


def test_use_runtime_dir__defaults_next_to_pgdata_not_the_system_temp(monkeypatch, tmp_path):
    # The folder that replaces platformdirs' fallback (one in the system temp directory)
    # sits beside the data directory.
    assert pgserver.RUNTIME_DIR.parent == pgserver.DATA_DIR.parent
    monkeypatch.setenv("XDG_RUNTIME_DIR", "")  # so that teardown restores the original
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    monkeypatch.setattr(pgserver, "RUNTIME_DIR", tmp_path / ".pgdata-run")
    pgserver.use_runtime_dir()
    assert os.environ["XDG_RUNTIME_DIR"] == str(tmp_path / ".pgdata-run")
    assert (tmp_path / ".pgdata-run").is_dir()


def test_use_runtime_dir__keeps_a_runtime_dir_the_user_has(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    pgserver.use_runtime_dir()
    assert os.environ["XDG_RUNTIME_DIR"] == str(tmp_path)


def test_stop__says_so_when_nothing_runs(monkeypatch, tmp_path):
    monkeypatch.setattr(pgserver, "DATA_DIR", tmp_path / "nothing")
    assert pgserver.stop() == f"the embedded PostgreSQL in {tmp_path / 'nothing'} is not running"
