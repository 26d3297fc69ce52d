"""The chaos suite, CI length: about a minute of SIGKILLs, SIGSTOPs, terminated
backends and two PostgreSQL restarts on the suite's own server; nothing may be lost.

The full run (20,000 jobs) is ``python -m bench.chaos``; see docs/reliability.md.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from .conftest import REPO


@pytest.mark.slow
def test_chaos__nothing_lost_stuck_or_duplicated_transactionally() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.chaos",
            "--jobs",
            "2000",
            "--duration",
            "30",
            "--drain-seconds",
            "60",
            "--seed",
            "7",
        ],  # fmt: skip
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("jobs=")]
    assert lines, f"no summary line; stderr:\n{proc.stderr[-4000:]}"
    summary = dict(re.findall(r"(\w+)=(\S+)", lines[-1]))
    assert proc.returncode == 0, f"{lines[-1]}\n{proc.stderr[-4000:]}"
    for name in ("lost", "stuck", "dup_tx", "i1", "i2", "i4", "i5", "dead_unexpected"):
        assert summary[name] == "0", lines[-1]
    assert summary["pg_restarts"] == "2"
    assert int(summary["kills"]) > 0
    assert int(summary["terminated"]) > 0
    assert int(summary["done"]) + int(summary["dead"]) == 2000
    assert summary["dead"] == "10"  # exactly the poison pills
