"""The reference is a contract: each name docs/reference documents exists in the code in
the documented shape, and each public name of the code is documented.

Read here: models.md (the ``Job.objects`` table, each model's column table), api.md
(the ``automodule`` members and the top-level names), and the imports and
``Job.objects.<name>`` the docs' examples use; ``test_reference_config.py`` reads
settings.md, commands.md and the check ids with the same parsers. They are strict: a
table row or directive they cannot read fails naming its line (``UnreadableDocError``),
so a name cannot drop out of the check by being written oddly.

A failure for a documented name means the code lost it: restore it, or deprecate it
(a ``DeprecationWarning`` for a release, and a changelog line: the changelog's
"Deprecation policy"). Deleting its line from the docs is not the fix.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps

import django_pgqueue
from django_pgqueue.manager import JobManager
from django_pgqueue.models import Job

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
REFERENCE = DOCS / "reference"

#: Lines numbered from 1, so a problem names ``file:line``.
Lines = list[tuple[int, str]]


class UnreadableDocError(AssertionError):
    """A line of the docs the parsers cannot read: a failure, never a skip."""


# --- reading Markdown ------------------------------------------------------------------


def read_lines(path: Path) -> Lines:
    return list(enumerate(path.read_text().splitlines(), 1))


def where(path: Path, number: int) -> str:
    return f"{path.relative_to(REPO)}:{number}"


def section(lines: Lines, heading: str) -> Lines:
    """The lines under ``heading`` (a whole Markdown heading line), up to the next
    heading of the same or a higher level."""
    level = len(heading) - len(heading.lstrip("#"))
    starts = [i for i, (_, line) in enumerate(lines) if line == heading]
    if len(starts) != 1:
        raise UnreadableDocError(f"expected one heading {heading!r}, found {len(starts)}")
    body = []
    for number, line in lines[starts[0] + 1 :]:
        hashes = len(line) - len(line.lstrip("#"))
        if 0 < hashes <= level and line[hashes : hashes + 1] == " ":
            break
        body.append((number, line))
    return body


def sections(lines: Lines, level: int) -> Iterator[tuple[int, str, Lines]]:
    """(line number, heading text, lines) of each heading of ``level``."""
    marker = "#" * level + " "
    heads = [(i, n, line) for i, (n, line) in enumerate(lines) if line.startswith(marker)]
    for (i, number, line), nxt in zip(heads, [*heads[1:], (len(lines), 0, "")], strict=True):
        yield number, line[len(marker) :], lines[i + 1 : nxt[0]]


@dataclasses.dataclass(frozen=True)
class Row:
    where: str
    cells: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Table:
    where: str
    header: tuple[str, ...]
    rows: tuple[Row, ...]
    #: The paragraph just above the table, joined into one line (what it belongs to).
    caption: str


def split_row(line: str, at: str) -> tuple[str, ...]:
    """The cells of a table line; ``\\|`` is a literal bar (inside code spans too)."""
    if not (line.startswith("|") and line.rstrip().endswith("|")):
        raise UnreadableDocError(f"{at}: a table line must start and end with '|': {line!r}")
    cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
    return tuple(cell.strip().replace("\\|", "|") for cell in cells)


def paragraph_above(lines: Lines, i: int) -> str:
    """The paragraph that ends just above ``lines[i]`` (after blank lines), as one line."""
    above = [text for _, text in lines[:i]]
    while above and not above[-1].strip():
        above.pop()
    start = len(above)
    while start and above[start - 1].strip():
        start -= 1
    return " ".join(above[start:])


def tables(lines: Lines, path: Path) -> list[Table]:
    """Every table in ``lines``; a row with a different number of cells than its header
    is unreadable."""
    found = []
    i = 0
    while i < len(lines):
        number, line = lines[i]
        if not line.startswith("|"):
            i += 1
            continue
        header, header_at = split_row(line, where(path, number)), where(path, number)
        rule = lines[i + 1][1] if i + 1 < len(lines) else ""
        if not re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", rule.strip()):
            raise UnreadableDocError(
                f"{where(path, number)}: a table header without its |---| line"
            )
        caption = paragraph_above(lines, i)
        rows = []
        i += 2
        while i < len(lines) and lines[i][1].startswith("|"):
            number, line = lines[i]
            cells = split_row(line, where(path, number))
            if len(cells) != len(header):
                raise UnreadableDocError(
                    f"{where(path, number)}: {len(cells)} cells under a header of "
                    f"{len(header)}: {line!r}"
                )
            rows.append(Row(where(path, number), cells))
            i += 1
        found.append(Table(header_at, header, tuple(rows), caption))
    return found


def doc_pages() -> list[Path]:
    return [REPO / "README.md", *sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)]


def only_table(found: list[Table], what: str) -> Table:
    """The one table of ``found``; none or several is unreadable (which would be meant?)."""
    if len(found) != 1:
        raise UnreadableDocError(f"expected one table of {what}, found {len(found)}")
    return found[0]


def code_spans(text: str) -> list[str]:
    return re.findall(r"`([^`]+)`", text)


# --- Job.objects: the table of methods -------------------------------------------------

MANAGER_HEADER = ("Method", "Returns", "Contract")
NAME = r"[a-z_][a-z0-9_]*"
SIGNATURE = re.compile(rf"(?P<name>{NAME})(?:\((?P<params>.*)\))?")
PARAM = re.compile(rf"(?P<stars>\*{{0,2}})(?P<name>{NAME})(?P<default>=.+)?")
#: A return type, and the fields of a record in parentheses: ``FlowClaim(jobs, ...)``.
RETURNS = re.compile(r"`(?P<type>[^`(]+)(?:\((?P<fields>[^`)]*)\))?`")
#: Parameters the table documents once for every method (its preamble): a pinned clock.
IMPLIED = {"now"}


@dataclasses.dataclass(frozen=True)
class Param:
    name: str
    #: "positional", "keyword" (keyword-only), "*args" or "**kwargs".
    kind: str


@dataclasses.dataclass(frozen=True)
class Documented:
    name: str
    #: None: documented as an attribute (``db_alias``), not called.
    params: tuple[Param, ...] | None
    returns: str
    #: The record's fields the docs name, as in ``CancelResult(cancelled, requested)``.
    fields: tuple[str, ...] | None
    where: str


def split_top_level(text: str) -> list[str]:
    """Split at the commas outside brackets and quotes: ``args=(), kwargs=None``."""
    parts, depth, quote, current = [], 0, "", ""
    for char in text:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
            continue
        current += char
    if current.strip():
        parts.append(current.strip())
    return parts


def parse_signature(text: str, at: str) -> tuple[str, tuple[Param, ...] | None]:
    match = SIGNATURE.fullmatch(text)
    if match is None:
        raise UnreadableDocError(f"{at}: not a method signature: {text!r}")
    if match["params"] is None:
        return match["name"], None
    params, keyword_only = [], False
    for part in split_top_level(match["params"]):
        if part == "*":
            keyword_only = True
            continue
        param = PARAM.fullmatch(part)
        if param is None:
            raise UnreadableDocError(f"{at}: not a parameter: {part!r} in {text!r}")
        if param["stars"] == "**":
            kind = "**kwargs"
        elif param["stars"] == "*":
            kind, keyword_only = "*args", True
        else:
            kind = "keyword" if keyword_only else "positional"
        params.append(Param(param["name"], kind))
    return match["name"], tuple(params)


def documented_methods(lines: Lines, path: Path) -> list[Documented]:
    """The rows of the ``Job.objects`` table: one or more signatures in code spans
    joined by `` / ``, and as many return types, each the first code span of its part."""
    table = only_table(tables(section(lines, "## `Job.objects`"), path), "Job.objects")
    if table.header != MANAGER_HEADER:
        raise UnreadableDocError(f"{table.where}: the header must be {MANAGER_HEADER}")
    found = []
    for row in table.rows:
        method_cell, returns_cell, _ = row.cells
        if not re.fullmatch(r"`[^`]+`(?: / `[^`]+`)*", method_cell):
            raise UnreadableDocError(f"{row.where}: signatures in code spans joined by ' / ' only")
        signatures = code_spans(method_cell)
        returns = returns_cell.split(" / ") if len(signatures) > 1 else [returns_cell]
        if len(returns) != len(signatures):
            raise UnreadableDocError(
                f"{row.where}: {len(signatures)} methods, {len(returns)} returns"
            )
        for signature, returned in zip(signatures, returns, strict=True):
            name, params = parse_signature(signature, row.where)
            match = RETURNS.match(returned)
            if match is None:
                raise UnreadableDocError(f"{row.where}: a return type must open with a code span")
            fields = match["fields"]
            found.append(
                Documented(
                    name,
                    params,
                    match["type"].strip(),
                    None if fields is None else tuple(split_top_level(fields)),
                    row.where,
                )
            )
    names = [d.name for d in found]
    if len(set(names)) != len(names):
        raise UnreadableDocError(f"{path.relative_to(REPO)}: a method documented twice: {names}")
    return found


def kind_of(param: inspect.Parameter) -> str:
    return {
        inspect.Parameter.KEYWORD_ONLY: "keyword",
        inspect.Parameter.VAR_POSITIONAL: "*args",
        inspect.Parameter.VAR_KEYWORD: "**kwargs",
    }.get(param.kind, "positional")


def bare_type(text: str) -> str:
    """A type's text without module prefixes or spaces: ``flow.LimitSpec`` is ``LimitSpec``."""
    return re.sub(r"\b(?:[a-z_][a-z0-9_]*\.)+(?=[A-Za-z_])", "", text).replace(" ", "")


def record_fields(method: Any, annotation: str) -> list[str] | None:
    """The fields of the record class ``annotation`` names (looked up in the method's
    module, else the one class of that name in the package's loaded modules, for a name
    imported only for type checking), or None when it is not a dataclass or named tuple."""
    parts = annotation.split(".")
    target = vars(inspect.getmodule(method)).get(parts[0])
    for part in parts[1:]:
        target = getattr(target, part, None)
    if target is None:
        found = {
            vars(module).get(parts[-1])
            for name, module in list(sys.modules.items())
            if name.startswith("django_pgqueue") and module is not None
        } - {None}
        target = found.pop() if len(found) == 1 else None
    if dataclasses.is_dataclass(target):
        return [field.name for field in dataclasses.fields(target)]
    return list(getattr(target, "_fields", ())) or None


def method_problems(doc: Documented, manager: type) -> list[str]:
    """How the code differs from one documented ``Job.objects`` member (empty: agrees)."""
    what = f"Job.objects.{doc.name} ({doc.where})"
    member = inspect.getattr_static(manager, doc.name, None)
    if member is None:
        return [f"{what} is documented but Job.objects has no {doc.name!r}"]
    if doc.params is None:
        ok = isinstance(member, property)
        return [] if ok else [f"{what} is documented as an attribute; the code has a method"]
    if isinstance(member, property) or not callable(member):
        return [f"{what} is documented as a method; the code has an attribute"]
    signature = inspect.signature(member)
    code = {p.name: kind_of(p) for p in list(signature.parameters.values())[1:]}  # no self
    problems = []
    for param in doc.params:
        if param.name not in code:
            problems.append(f"{what}: documented parameter {param.name!r} does not exist")
        elif code[param.name] != param.kind:
            problems.append(
                f"{what}: {param.name!r} is documented {param.kind}, the code takes it "
                f"{code[param.name]}"
            )
    documented = {param.name for param in doc.params}
    problems += [
        f"{what}: parameter {name!r} is not documented"
        for name in code
        if name not in documented | IMPLIED
    ]
    order = [p.name for p in doc.params if p.kind == "positional"]
    code_order = [name for name, kind in code.items() if kind == "positional"]
    if [n for n in code_order if n in order] != [n for n in order if n in code_order]:
        problems.append(f"{what}: positional order {order}, the code's {code_order}")
    annotation = str(signature.return_annotation)
    if bare_type(doc.returns) != bare_type(annotation):
        problems.append(f"{what}: documented to return {doc.returns}, annotated {annotation}")
    elif doc.fields is not None:
        fields = record_fields(member, annotation)
        if fields is None or set(fields) != set(doc.fields):
            problems.append(f"{what}: documented fields {list(doc.fields)}, the code's {fields}")
    return problems


def undocumented_members(documented: Iterable[str], manager: type) -> list[str]:
    """Public methods and properties the manager itself defines that the table lacks
    (Django's own ``Manager`` API is Django's to document)."""
    return sorted(
        name
        for name, member in vars(manager).items()
        if not name.startswith("_")
        and (callable(member) or isinstance(member, property))
        and name not in set(documented)
    )


MODELS_MD = REFERENCE / "models.md"
DOCUMENTED_METHODS = documented_methods(read_lines(MODELS_MD), MODELS_MD)

#: Documented members whose code disagrees with the reference, each an expected failure
#: until fixed (then its strict xfail fails, and its line goes). Restored on main:
#: ``sweep``, ``rescue_expired``, ``promote_due``, ``prune_finished``,
#: ``prune_lost_workers`` (removed in e530346 without a deprecation).
EXPECTED_DRIFT: dict[str, str] = {}


def expected_drift(name: str) -> list[pytest.MarkDecorator]:
    reason = EXPECTED_DRIFT.get(name)
    return [pytest.mark.xfail(strict=True, reason=reason)] if reason else []


@pytest.mark.parametrize(
    "documented",
    [pytest.param(doc, id=doc.name, marks=expected_drift(doc.name)) for doc in DOCUMENTED_METHODS],
)
def test_manager__documented_member_matches_the_code(documented: Documented) -> None:
    assert method_problems(documented, JobManager) == []


def test_manager__every_public_member_is_documented() -> None:
    names = [doc.name for doc in DOCUMENTED_METHODS]
    assert undocumented_members(names, JobManager) == []


def test_manager__expected_drift_names_only_documented_members() -> None:
    """An xfail for a name the table does not document would never run: keep the two
    lists in step."""
    assert set(EXPECTED_DRIFT) <= {doc.name for doc in DOCUMENTED_METHODS}


def planted_table(*rows: str) -> Lines:
    text = "\n".join(["## `Job.objects`", "", "| Method | Returns | Contract |", "|---|---|---|"])
    return read_text_lines("\n".join([text, *rows]))


def read_text_lines(text: str) -> Lines:
    return list(enumerate(text.splitlines(), 1))


def test_manager__a_removed_method_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    (complete,) = [doc for doc in DOCUMENTED_METHODS if doc.name == "complete"]
    assert method_problems(complete, JobManager) == []
    monkeypatch.delattr(JobManager, "complete")
    (problem,) = method_problems(complete, JobManager)
    assert "Job.objects has no 'complete'" in problem
    assert "docs/reference/models.md:" in problem


def test_manager__a_documented_method_that_does_not_exist_is_reported() -> None:
    lines = planted_table("| `frobnicate(job, *, hard=False)` | `bool` | Planted. |")
    (doc,) = documented_methods(lines, MODELS_MD)
    assert method_problems(doc, JobManager) == [
        "Job.objects.frobnicate (docs/reference/models.md:5) is documented but Job.objects "
        "has no 'frobnicate'"
    ]


@pytest.mark.parametrize(
    ("signature", "returns", "expected"),
    [
        ("complete(job, worker_id, result=None)", "`bool`", "'result' is documented positional"),
        ("complete(job, worker_id, *, result=None, retries=1)", "`bool`", "'retries' does not"),
        ("complete(job, *, result=None)", "`bool`", "'worker_id' is not documented"),
        ("complete(worker_id, job, *, result=None)", "`bool`", "positional order"),
        ("complete(job, worker_id, *, result=None)", "`str`", "documented to return str"),
        ("cancel(ids)", "`CancelResult(cancelled)`", "documented fields ['cancelled']"),
        ("db_alias()", "`str`", "documented as a method"),
    ],
)
def test_manager__a_changed_signature_is_reported(signature: str, returns: str, expected: str):
    (doc,) = documented_methods(planted_table(f"| `{signature}` | {returns} | x |"), MODELS_MD)
    problems = method_problems(doc, JobManager)
    assert len(problems) == 1 and expected in problems[0], problems


@pytest.mark.parametrize(
    "row",
    [
        "| claim(worker_id) | `list[Job]` | no code span |",
        "| `claim(worker_id, *, limit` | `list[Job]` | unbalanced |",
        "| `claim(worker_id, limit: int)` | `list[Job]` | an annotation |",
        "| `claim(worker_id)` and `fail(job)` | `x` / `y` | prose between |",
        "| `pause_queue(name)` / `resume_queue(name)` | `None` | two methods, one return |",
        "| `claim(worker_id)` | list[Job] | no code span |",
        "| `claim(worker_id)` | `list[Job]` |",
    ],
)
def test_manager__a_row_it_cannot_read_fails_naming_its_line(row: str) -> None:
    with pytest.raises(UnreadableDocError, match=r"models\.md:5"):
        documented_methods(planted_table(row), MODELS_MD)


# --- the models' columns -----------------------------------------------------------------

COLUMN_HEADER = ("Column", "Type", "Meaning")
MODEL_CAPTION = re.compile(r"`django_pgqueue\.models\.(?P<model>\w+)`, table `(?P<table>\w+)`")


def column_problems(lines: Lines, path: Path) -> list[str]:
    """Each column table (captioned with its model and table) lists exactly the model's
    columns; every model of the app has one."""
    problems, seen = [], set()
    for table in tables(lines, path):
        if table.header != COLUMN_HEADER:
            continue
        caption = MODEL_CAPTION.match(table.caption)
        if caption is None:
            raise UnreadableDocError(
                f"{table.where}: a column table needs its model and table named just above it"
            )
        model = apps.get_app_config("django_pgqueue").models.get(caption["model"].lower())
        if model is None:
            problems.append(f"{table.where}: no model {caption['model']!r}")
            continue
        seen.add(model)
        if model._meta.db_table != caption["table"]:
            problems.append(f"{table.where}: {model.__name__}'s table is {model._meta.db_table}")
        documented: set[str] = set()
        for row in table.rows:
            if not re.fullmatch(r"`\w+`(?:, `\w+`)*", row.cells[0]):
                raise UnreadableDocError(f"{row.where}: columns in code spans joined by ', ' only")
            documented |= set(code_spans(row.cells[0]))
        columns = {field.column for field in model._meta.concrete_fields}
        problems += [
            f"{table.where}: {model.__name__}.{c} does not exist"
            for c in sorted(documented - columns)
        ]
        problems += [
            f"{table.where}: {model.__name__}.{c} is not documented"
            for c in sorted(columns - documented)
        ]
    models = {m for m in apps.get_app_config("django_pgqueue").get_models() if not m._meta.proxy}
    problems += [
        f"{path.relative_to(REPO)}: no column table for {m.__name__}"
        for m in sorted(models - seen, key=str)
    ]
    return problems


def test_models__every_column_is_documented_and_exists() -> None:
    assert column_problems(read_lines(MODELS_MD), MODELS_MD) == []


def test_models__a_planted_column_is_reported() -> None:
    lines = read_text_lines(
        "`django_pgqueue.models.Job`, table `pgqueue_job`.\n\n"
        "| Column | Type | Meaning |\n|---|---|---|\n| `id`, `colour` | text | Planted. |"
    )
    problems = column_problems(lines, MODELS_MD)
    assert "docs/reference/models.md:3: Job.colour does not exist" in problems
    assert "docs/reference/models.md:3: Job.queue is not documented" in problems


# --- the Python API ------------------------------------------------------------------------

API_MD = REFERENCE / "api.md"
DIRECTIVE = re.compile(r"\.\. (?P<kind>automodule|autoclass|autofunction):: (?P<target>[\w.]+)")
DIRECTIVE_OPTION = re.compile(r"   :(?P<name>[a-z-]+):(?: (?P<value>.+))?")
OPTIONS = {"members", "undoc-members", "show-inheritance", "no-index"}


@dataclasses.dataclass(frozen=True)
class Directive:
    kind: str
    target: str
    #: The ``:members:`` list; None: all of them (or, for a class or function, itself).
    members: tuple[str, ...] | None
    where: str


def api_directives(lines: Lines, path: Path) -> list[Directive]:
    found: list[Directive] = []
    for number, line in lines:
        if line.startswith(".. "):
            match = DIRECTIVE.fullmatch(line)
            if match is None:
                raise UnreadableDocError(
                    f"{where(path, number)}: not an autodoc directive: {line!r}"
                )
            found.append(Directive(match["kind"], match["target"], None, where(path, number)))
        elif line.startswith("   :") and found:
            option = DIRECTIVE_OPTION.fullmatch(line)
            if option is None or option["name"] not in OPTIONS:
                raise UnreadableDocError(f"{where(path, number)}: not a known option: {line!r}")
            if option["name"] == "members" and option["value"]:
                members = tuple(name.strip() for name in option["value"].split(","))
                found[-1] = dataclasses.replace(found[-1], members=members)
    return found


def resolve(dotted: str) -> Any:
    """The module or attribute ``dotted`` names (raises if there is none)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for part in parts[cut:]:
            target = getattr(target, part)
        return target
    raise ModuleNotFoundError(dotted)


def directive_problems(directives: Iterable[Directive]) -> list[str]:
    problems = []
    for directive in directives:
        try:
            target = resolve(directive.target)
        except (ImportError, AttributeError):
            problems.append(f"{directive.where}: {directive.target} does not exist")
            continue
        problems += [
            f"{directive.where}: {directive.target}.{name} does not exist"
            for name in directive.members or ()
            if not hasattr(target, name)
        ]
    return problems


def rendered_by(directives: Iterable[Directive], name: str, obj: Any) -> bool:
    """Whether autodoc renders ``obj`` (exported as ``name``) on the page."""
    module = getattr(obj, "__module__", None)
    for directive in directives:
        if directive.kind == "automodule" and directive.target == module:
            if (
                directive.members is None
                and inspect.getdoc(obj)
                or name in (directive.members or ())
            ):
                return True
        elif directive.target == f"{module}.{name}":
            return True
    return False


def top_level_problems(lines: Lines, path: Path, exported: list[str]) -> list[str]:
    """The api page's list of top-level names (the code spans of the list items of its
    "The top-level names" section) is ``django_pgqueue.__all__``, and each is rendered."""
    items: list[tuple[int, str]] = []
    for number, line in section(lines, "## The top-level names"):
        if line.startswith("- "):
            items.append((number, line))
        elif line.startswith("  ") and items:  # the item goes on
            items[-1] = (items[-1][0], f"{items[-1][1]} {line}")
    listed = set()
    for number, item in items:
        names = [span for span in code_spans(item) if span.isidentifier()]
        if not names:
            raise UnreadableDocError(f"{where(path, number)}: a list item naming no name")
        listed |= set(names)
    directives = api_directives(lines, path)
    return [
        *(
            f"{path.relative_to(REPO)}: {n} is listed but not in __all__"
            for n in sorted(listed - set(exported))
        ),
        *(
            f"{path.relative_to(REPO)}: __all__'s {n} is not listed"
            for n in sorted(set(exported) - listed)
        ),
        *(
            f"{path.relative_to(REPO)}: __all__'s {n} is rendered by no directive"
            for n in sorted(set(exported) & listed)
            if not rendered_by(directives, n, getattr(django_pgqueue, n))
        ),
    ]


def test_api__every_directive_names_what_exists() -> None:
    directives = api_directives(read_lines(API_MD), API_MD)
    assert len(directives) > 10
    assert directive_problems(directives) == []


def test_api__the_top_level_names_are_all_and_each_is_rendered() -> None:
    assert top_level_problems(read_lines(API_MD), API_MD, django_pgqueue.__all__) == []


def test_api__a_planted_name_and_a_lost_one_are_reported() -> None:
    lines = read_lines(API_MD)
    exported = [name for name in django_pgqueue.__all__ if name != "task"] + ["frobnicate"]
    assert top_level_problems(lines, API_MD, exported) == [
        "docs/reference/api.md: task is listed but not in __all__",
        "docs/reference/api.md: __all__'s frobnicate is not listed",
    ]
    planted = Directive("automodule", "django_pgqueue.bulk", ("enqueue_many", "gone"), "p:1")
    assert directive_problems([planted]) == ["p:1: django_pgqueue.bulk.gone does not exist"]


IMPORT = re.compile(r"^\s*from (?P<module>django_pgqueue(?:\.\w+)*) import (?P<names>.+)$")


def doc_imports(paths: Iterable[Path]) -> list[tuple[str, str, str]]:
    """(where, module, name) of each ``from django_pgqueue... import name`` in the docs."""
    found = []
    for path in paths:
        for number, line in read_lines(path):
            match = IMPORT.match(line)
            if match is None:
                continue
            names = match["names"].split("#")[0].strip()
            if names.startswith("("):
                raise UnreadableDocError(f"{where(path, number)}: write the import on one line")
            for name in names.split(","):
                found.append((where(path, number), match["module"], name.split(" as ")[0].strip()))
    return found


def import_problems(imports: Iterable[tuple[str, str, str]], exported: list[str]) -> list[str]:
    problems = []
    for at, module, name in imports:
        if module == "django_pgqueue":
            submodule = importlib.util.find_spec(f"django_pgqueue.{name}") is not None
            if name not in exported and not submodule:
                problems.append(f"{at}: django_pgqueue.{name} is not in __all__")
        elif not hasattr(importlib.import_module(module), name):
            problems.append(f"{at}: {module}.{name} does not exist")
    return problems


def test_api__every_import_the_docs_show_works_and_top_level_ones_are_in_all() -> None:
    imports = doc_imports(doc_pages())
    assert len(imports) > 10
    assert import_problems(imports, django_pgqueue.__all__) == []


def test_api__a_planted_import_is_reported() -> None:
    planted = [("p:1", "django_pgqueue", "sweep"), ("p:2", "django_pgqueue.models", "Jobs")]
    assert import_problems(planted, django_pgqueue.__all__) == [
        "p:1: django_pgqueue.sweep is not in __all__",
        "p:2: django_pgqueue.models.Jobs does not exist",
    ]


MENTION = re.compile(r"Job\.objects(?:\.db_manager\([^)]*\)|\.using\([^)]*\))?\.(\w+)")


def test_manager__every_member_the_docs_mention_exists() -> None:
    """``Job.objects.<name>`` anywhere in the docs; names in the table are the table
    test's (with its expected failures)."""
    tabled = {doc.name for doc in DOCUMENTED_METHODS}
    missing = [
        f"{where(path, number)}: Job.objects.{name}"
        for path in doc_pages()
        for number, line in read_lines(path)
        for name in MENTION.findall(line)
        if name not in tabled and not hasattr(Job.objects, name)
    ]
    assert missing == []
