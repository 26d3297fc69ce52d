"""Every ``TRUNCATE`` a benchmark runs on the jobs table works on a migrated database:
``pgqueue_step``'s foreign key (ON DELETE CASCADE, migration 0020) refuses a TRUNCATE
of ``pgqueue_job`` that does not name it too (bench.search and bench.monitoring_figures
did not, after the merge of durable steps)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.db import connection, transaction

BENCH = Path(__file__).resolve().parent.parent / "bench"
TRUNCATE = re.compile(r"""["'](TRUNCATE [^"']*\bpgqueue_job\b[^"']*)["']""")


class RolledBackError(Exception):
    """Leaves the test's transaction as it was."""


def truncates() -> list[tuple[str, str]]:
    found = []
    for path in sorted(BENCH.glob("*.py")):
        for statement in TRUNCATE.findall(path.read_text()):
            found.append((path.name, statement))
    return found


def test_bench_truncates__found():
    names = {name for name, _ in truncates()}
    assert {"search.py", "monitoring_figures.py", "steps.py"} <= names, names


@pytest.mark.django_db
@pytest.mark.parametrize(("name", "statement"), truncates())
def test_bench_truncates__each_runs_on_the_migrated_tables(name, statement):
    with pytest.raises(RolledBackError):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(statement)  # a foreign key refusing it raises here
            raise RolledBackError
