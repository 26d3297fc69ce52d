"""The reference is a contract, for an operator's side of it: every setting, command
option and action, and check id that docs/reference (and the rest of the docs) name
exists in the code, and the code has none the reference lacks. The Markdown is read
by ``tests/test_reference.py``'s strict parsers (see its docstring)."""

from __future__ import annotations

import argparse
import dataclasses
import re
from collections.abc import Iterable
from pathlib import Path

import pytest
from django.core.management import load_command_class
from django.core.management.base import BaseCommand

from django_pgqueue.conf import Settings
from tests.test_check_ids import check_id_places
from tests.test_reference import (
    REFERENCE,
    REPO,
    Lines,
    UnreadableDocError,
    doc_pages,
    only_table,
    read_lines,
    read_text_lines,
    sections,
    tables,
    where,
)

# --- settings -----------------------------------------------------------------------------

SETTINGS_MD = REFERENCE / "settings.md"
SETTING = re.compile(r"PGQUEUE_[A-Z0-9_]+")


def documented_settings(lines: Lines, path: Path) -> dict[str, str]:
    """Setting name -> where, from the table whose first column is "Setting"."""
    table = only_table([t for t in tables(lines, path) if t.header[0] == "Setting"], "settings")
    found = {}
    for row in table.rows:
        match = re.fullmatch(r"`(PGQUEUE_[A-Z0-9_]+)`", row.cells[0])
        if match is None:
            raise UnreadableDocError(f"{row.where}: a setting in one code span: {row.cells[0]!r}")
        found[match[1]] = row.where
    return found


def setting_problems(documented: dict[str, str], settings: type) -> list[str]:
    declared = {f"PGQUEUE_{name}" for name in vars(settings) if name.isupper()}
    return [
        *(
            f"{at}: {name} is not a field of conf.Settings"
            for name, at in documented.items()
            if name not in declared
        ),
        *(
            f"conf.Settings.{name[8:]} is not documented"
            for name in sorted(declared - set(documented))
        ),
    ]


def test_settings__reference_and_conf_agree() -> None:
    assert (
        setting_problems(documented_settings(read_lines(SETTINGS_MD), SETTINGS_MD), Settings) == []
    )


def test_settings__every_setting_the_docs_name_exists() -> None:
    declared = {f"PGQUEUE_{name}" for name in vars(Settings) if name.isupper()}
    named = {
        f"{where(path, number)}: {name}"
        for path in doc_pages()
        for number, line in read_lines(path)
        for name in SETTING.findall(line)
        if name not in declared
    }
    assert named == set()


def test_settings__a_removed_setting_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    documented = documented_settings(read_lines(SETTINGS_MD), SETTINGS_MD)
    monkeypatch.delattr(Settings, "KEEP_ERRORS")
    (problem,) = setting_problems(documented, Settings)
    assert problem.endswith("PGQUEUE_KEEP_ERRORS is not a field of conf.Settings")
    documented.pop("PGQUEUE_KEEP_ERRORS")
    documented["PGQUEUE_NOPE"] = "planted"
    monkeypatch.undo()
    assert setting_problems(documented, Settings) == [
        "planted: PGQUEUE_NOPE is not a field of conf.Settings",
        "conf.Settings.KEEP_ERRORS is not documented",
    ]


# --- commands -----------------------------------------------------------------------------

COMMANDS_MD = REFERENCE / "commands.md"
COMMANDS_DIR = REPO / "django_pgqueue" / "management" / "commands"
COMMAND_HEADING = re.compile(r"`manage\.py (?P<command>pgqueue_\w+)`")
OPTION_CELL = re.compile(
    r"`(?P<flag>-{1,2}[a-z][a-z0-9-]*)(?: (?P<value>\S+))?`(?P<repeat> \(repeatable\))?"
)
ACTION_CELL = re.compile(r"`(?P<action>[a-z]+)(?P<args>(?: [A-Z]+| \[--[a-z-]+\])*)`")


@dataclasses.dataclass(frozen=True)
class Option:
    flag: str
    takes_value: bool
    repeatable: bool
    where: str


@dataclasses.dataclass(frozen=True)
class Action:
    name: str
    positionals: tuple[str, ...]
    flags: tuple[str, ...]
    where: str


@dataclasses.dataclass
class CommandDoc:
    options: list[Option] = dataclasses.field(default_factory=list)
    actions: list[Action] = dataclasses.field(default_factory=list)


def documented_commands(lines: Lines, path: Path) -> dict[str, CommandDoc]:
    """Each ``## `manage.py NAME``` section's option table ("Option" column) and action
    table ("Action" column); other tables (the worker's log lines) are not options."""
    found = {}
    for number, heading, body in sections(lines, 2):
        match = COMMAND_HEADING.fullmatch(heading)
        if match is None:
            raise UnreadableDocError(f"{where(path, number)}: not a command heading: {heading!r}")
        doc = found[match["command"]] = CommandDoc()
        for table in tables(body, path):
            for row in table.rows if table.header[0] in ("Option", "Action") else ():
                cell = row.cells[0]
                if table.header[0] == "Option":
                    option = OPTION_CELL.fullmatch(cell)
                    if option is None:
                        raise UnreadableDocError(f"{row.where}: not an option: {cell!r}")
                    doc.options.append(
                        Option(
                            option["flag"],
                            bool(option["value"]),
                            bool(option["repeat"]),
                            row.where,
                        )
                    )
                else:
                    action = ACTION_CELL.fullmatch(cell)
                    if action is None:
                        raise UnreadableDocError(f"{row.where}: not an action: {cell!r}")
                    args = action["args"].split()
                    doc.actions.append(
                        Action(
                            action["action"],
                            tuple(a for a in args if a.isupper()),
                            tuple(a.strip("[]") for a in args if a.startswith("[")),
                            row.where,
                        )
                    )
    return found


BASE_FLAGS = {
    flag
    for action in BaseCommand().create_parser("manage.py", "x")._actions
    for flag in action.option_strings
}


def parsers(command: str) -> dict[str | None, argparse.ArgumentParser]:
    """The command's parser (key None) and each of its actions' (subcommands')."""
    parser = load_command_class("django_pgqueue", command).create_parser("manage.py", command)
    found: dict[str | None, argparse.ArgumentParser] = {None: parser}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {flag: action for action in parser._actions for flag in action.option_strings}


def command_problems(command: str, doc: CommandDoc) -> list[str]:
    found = parsers(command)
    every = {flag: action for parser in found.values() for flag, action in flags(parser).items()}
    problems = []
    for option in doc.options:
        action = every.get(option.flag)
        if action is None:
            problems.append(f"{option.where}: {command} has no option {option.flag}")
            continue
        if option.takes_value != (action.nargs != 0):
            problems.append(
                f"{option.where}: {command} {option.flag} takes a value: {action.nargs != 0}"
            )
        if option.repeatable != isinstance(action, argparse._AppendAction):
            problems.append(
                f"{option.where}: {command} {option.flag} repeatable: {not option.repeatable}"
            )
    actions = {name: parser for name, parser in found.items() if name is not None}
    for documented in doc.actions:
        sub = actions.get(documented.name)
        if sub is None:
            problems.append(f"{documented.where}: {command} has no action {documented.name!r}")
            continue
        metavars = tuple(a.metavar or a.dest.upper() for a in sub._actions if not a.option_strings)
        if documented.positionals != metavars:
            problems.append(f"{documented.where}: {command} {documented.name} takes {metavars}")
        problems += [
            f"{documented.where}: {command} {documented.name} has no option {flag}"
            for flag in documented.flags
            if flag not in flags(sub)
        ]
    named = {o.flag for o in doc.options} | {f for a in doc.actions for f in a.flags}
    problems += [
        f"{command} {flag} is not documented" for flag in sorted(set(every) - BASE_FLAGS - named)
    ]
    undocumented = set(actions) - {a.name for a in doc.actions}
    problems += [f"{command}'s action {name!r} is not documented" for name in sorted(undocumented)]
    return problems


def our_commands() -> list[str]:
    return sorted(p.stem for p in COMMANDS_DIR.glob("pgqueue_*.py"))


def test_commands__every_command_has_a_section() -> None:
    assert sorted(documented_commands(read_lines(COMMANDS_MD), COMMANDS_MD)) == our_commands()


@pytest.mark.parametrize("command", our_commands())
def test_commands__options_and_parser_agree(command: str) -> None:
    doc = documented_commands(read_lines(COMMANDS_MD), COMMANDS_MD).get(command, CommandDoc())
    assert command_problems(command, doc) == []


def test_commands__a_planted_option_and_a_missing_one_are_reported() -> None:
    sweep = CommandDoc(
        options=[
            Option("--interval", True, False, "m:1"),
            Option("--backend", True, False, "m:2"),
            Option("--now", True, False, "m:3"),
            Option("--now-step", True, False, "m:4"),
        ]
    )
    assert command_problems("pgqueue_sweep", sweep) == ["pgqueue_sweep --loop is not documented"]
    sweep.options += [
        Option("--nope", True, False, "m:5"),
        Option("--interval", False, True, "m:6"),
    ]
    assert command_problems("pgqueue_sweep", sweep) == [
        "m:5: pgqueue_sweep has no option --nope",
        "m:6: pgqueue_sweep --interval takes a value: True",
        "m:6: pgqueue_sweep --interval repeatable: False",
        "pgqueue_sweep --loop is not documented",
    ]
    queue = CommandDoc(
        options=[Option("--backend", True, False, "q:1")],
        actions=[Action("pause", (), (), "q:2"), Action("resume", ("NAME",), (), "q:3")],
    )
    queue.actions.append(Action("drain", (), (), "q:4"))
    assert command_problems("pgqueue_queue", queue) == [
        "q:2: pgqueue_queue pause takes ('NAME',)",
        "q:4: pgqueue_queue has no action 'drain'",
        "pgqueue_queue --json is not documented",
        "pgqueue_queue's action 'list' is not documented",
    ]


def test_commands__a_row_it_cannot_read_fails_naming_its_line() -> None:
    lines = read_text_lines(
        "## `manage.py pgqueue_sweep`\n\n| Option | Meaning |\n|---|---|\n| --loop | x |"
    )
    with pytest.raises(UnreadableDocError, match=r"commands\.md:5: not an option"):
        documented_commands(lines, COMMANDS_MD)


# --- check ids -----------------------------------------------------------------------------

#: ``pgqueue.E010``, or a bare ``E064`` (as in "checks `pgqueue.E063`, `E064`"); not
#: another app's id such as ``postgres.E005``.
CHECK_ID = re.compile(r"\bpgqueue\.([EW]\d{3})\b|(?<![\w.])([EW]0\d\d)\b")


def mentioned_check_ids(paths: Iterable[Path]) -> dict[str, str]:
    """Check id (``pgqueue.E010``) -> where the docs first name it."""
    found: dict[str, str] = {}
    for path in paths:
        for number, line in read_lines(path):
            for dotted, bare in CHECK_ID.findall(line):
                found.setdefault(f"pgqueue.{dotted or bare}", where(path, number))
    return found


def check_id_problems(mentioned: dict[str, str], reference: dict[str, str]) -> list[str]:
    defined = set(check_id_places())
    return [
        *(
            f"{at}: {check_id} is not a check of the code"
            for check_id, at in sorted(mentioned.items())
            if check_id not in defined
        ),
        *(
            f"{check_id} is not documented in docs/reference/"
            for check_id in sorted(defined - set(reference))
        ),
    ]


def test_checks__every_id_the_docs_name_is_registered_and_every_id_is_documented() -> None:
    reference = mentioned_check_ids(sorted(REFERENCE.glob("*.md")))
    assert check_id_problems(mentioned_check_ids(doc_pages()), reference) == []


def test_checks__a_planted_id_is_reported() -> None:
    reference = dict.fromkeys(check_id_places(), "documented")
    mentioned = {"pgqueue.E999": "planted", "pgqueue.E010": "fine"}
    reference.pop("pgqueue.E010")
    assert check_id_problems(mentioned, reference) == [
        "planted: pgqueue.E999 is not a check of the code",
        "pgqueue.E010 is not documented in docs/reference/",
    ]


def test_checks__the_pattern_reads_both_forms_and_no_other_app() -> None:
    line = "checks `pgqueue.E063`, `E064`; Django's postgres.E005; pgqueue.W010."
    ids = [dotted or bare for dotted, bare in CHECK_ID.findall(line)]
    assert ids == ["E063", "E064", "W010"]
