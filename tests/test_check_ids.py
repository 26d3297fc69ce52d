"""Every system check id the package defines is used for one meaning only: ids are
stable names operators silence or alert on (parallel work once gave one id two meanings)."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

from django_pgqueue import bounds

PACKAGE = Path(__file__).resolve().parent.parent / "django_pgqueue"
ID = re.compile(r"""id=(?:f?["'])(pgqueue\.[EW]\d{3})["']""")


def check_id_places() -> dict[str, list[str]]:
    """Each check id the package defines -> where (``file:line``, or ``bounds.SETTINGS``
    for a setting's range check); tests/test_reference.py reads it too."""
    places: dict[str, list[str]] = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for check_id in ID.findall(line):
                places[check_id].append(f"{path.name}:{number}")
    for _bounds, _nullable, check_id in bounds.SETTINGS.values():
        places[check_id].append("bounds.SETTINGS")
    return dict(places)


def test_check_ids__each_id_has_one_meaning():
    places = check_id_places()
    assert places, "no check ids found: the pattern no longer matches the code"
    shared = {check_id: where for check_id, where in places.items() if len(where) > 1}
    assert not shared, f"check ids with more than one meaning: {shared}"
