"""checks.py and bounds.py: every numeric PGQUEUE_* setting is bounded by a system check."""

from __future__ import annotations

import math
import re
import typing

import pytest
from django.core import checks as django_checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from django_pgqueue import bounds
from django_pgqueue.checks import check_settings
from django_pgqueue.conf import Settings


def numeric_settings() -> list[str]:
    hints = typing.get_type_hints(Settings)
    return [
        name
        for name, hint in hints.items()
        if name.isupper() and set(typing.get_args(hint) or (hint,)) & {int, float}
    ]


def test_limits__every_numeric_setting_has_bounds():
    """A new numeric setting must get a range (and a check id) in bounds.SETTINGS."""
    assert numeric_settings(), "no numeric settings found"
    missing = set(numeric_settings()) - set(bounds.SETTINGS)
    assert not missing, f"add these to django_pgqueue.bounds.SETTINGS: {sorted(missing)}"
    assert set(bounds.SETTINGS) <= set(typing.get_type_hints(Settings))


def test_limits__check_ids_are_unique_and_defaults_are_in_range():
    ids = [check_id for _, _, check_id in bounds.SETTINGS.values()]
    assert len(ids) == len(set(ids))
    for name, (allowed, nullable, _) in bounds.SETTINGS.items():
        default = getattr(Settings, name)
        assert (default is None and nullable) or allowed.problem(default) is None, name


def bad_values(allowed: bounds.Bounds) -> list[object]:
    """Values each setting must refuse: past both ends, not finite, not a number."""
    values: list[object] = [allowed.high * 10 + 1, -1, math.nan, math.inf, "1", True, [1]]
    if allowed.low > 0:
        values.append(allowed.low / 2)
    if allowed.integer:
        values.append(float(allowed.low + 1))  # a float where an int is needed
        values.append(10**5000)
    else:
        values.append(1e300)
    return values


CASES = [
    pytest.param(name, value, id=f"{name}={bounds._show(value, 20)}")
    for name, (allowed, _, _) in bounds.SETTINGS.items()
    for value in bad_values(allowed)
]


@pytest.mark.parametrize(("name", "value"), CASES)
def test_checks__out_of_range_setting_is_an_error_naming_the_range(settings, name, value):
    setattr(settings, f"PGQUEUE_{name}", value)
    allowed, nullable, check_id = bounds.SETTINGS[name]
    errors = [m for m in check_settings() if m.id == check_id]
    assert len(errors) == 1, check_settings()
    (error,) = errors
    assert error.level == django_checks.ERROR
    assert error.msg.startswith(f"PGQUEUE_{name}: ")
    assert allowed.describe() in error.hint
    assert repr(getattr(Settings, name)) in error.hint  # names the default to fall back to
    assert ("or None" in error.hint) == nullable


@pytest.mark.parametrize("name", sorted(bounds.SETTINGS))
def test_checks__both_ends_of_each_range_are_accepted(settings, name):
    allowed, nullable, _ = bounds.SETTINGS[name]
    ends = [allowed.low, allowed.high] + ([None] if nullable else [])
    for value in ends:
        setattr(settings, f"PGQUEUE_{name}", int(value) if allowed.integer else value)
        errors = [m for m in check_settings() if m.level >= django_checks.ERROR]
        assert errors == [], value


def test_checks__manage_py_check_fails_on_a_bad_setting(settings):
    settings.PGQUEUE_POLL_INTERVAL = 1e-9
    message = "(pgqueue.E017) PGQUEUE_POLL_INTERVAL: 1e-09 is out of range."
    with pytest.raises(SystemCheckError, match=re.escape(message)):
        call_command("check")


@pytest.mark.slow
def test_checks__worker_and_sweeper_refuse_to_start_on_a_bad_setting(manage):
    """The test project reads PGQUEUE_RETRY_BACKOFF_BASE from the environment."""
    env = {"PGQUEUE_RETRY_BACKOFF_BASE": "-5"}
    procs = [manage("pgqueue_worker", env=env), manage("pgqueue_sweep", "--loop", env=env)]
    for proc in procs:
        assert proc.wait(60) != 0
        assert "(pgqueue.E012) PGQUEUE_RETRY_BACKOFF_BASE: -5.0 is out of range." in (
            proc.output()
        )
        assert "HINT: Use a number of seconds from 0 to 86400" in proc.output()


@pytest.mark.parametrize("value", ["yes", 1, 0, "None"])
def test_checks__framework_log_lines_is_true_false_or_none(settings, value):
    settings.PGQUEUE_FRAMEWORK_LOG_LINES = value
    (error,) = [m for m in check_settings() if m.id == "pgqueue.E061"]
    assert error.msg == f"PGQUEUE_FRAMEWORK_LOG_LINES: {value!r} is not True, False or None."
    for fine in (True, False, None):
        settings.PGQUEUE_FRAMEWORK_LOG_LINES = fine
        assert [m for m in check_settings() if m.id == "pgqueue.E061"] == []
