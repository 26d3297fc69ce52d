"""states.py: the states, and every move between them read from the statements'
``moves:`` headers, checked against what each statement's SQL writes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from django_pgqueue import sql, states
from django_pgqueue.states import GONE, NEW, TRANSITIONS, Status

STATEMENTS = sql.statements()
STATUSES = {str(status) for status in Status}
HOW_IT_WORKS = Path(__file__).resolve().parent.parent / "docs/discussions/how-it-works.md"

#: A SET list's assignment of the status (not a comparison in a WHERE or a WHEN).
ASSIGNMENT = re.compile(r"(?:\bSET\s+|,\s*)(?:\w+\.)?status\s*=\s*")
#: A CASE branch that keeps a job in the state it was compared with (JOB_CANCEL's
#: running jobs stay running): no move.
KEEPS = re.compile(r"WHEN \w+\.status = '(\w+)' THEN '\1'")


def assigned_expression(text: str, start: int) -> str:
    """The expression assigned from ``start`` on: up to a comma at depth 0 or the end
    of the SET list (FROM, WHERE, RETURNING), CASE ... END and parentheses nested."""
    depth = 0
    i = start
    while i < len(text):
        if text.startswith("CASE", i):
            depth += 1
            i += 4
            continue
        if text.startswith("END", i) and depth:
            depth -= 1
            i += 3
            continue
        char = text[i]
        if char == "(":
            depth += 1
        elif char == ")":
            if depth == 0:
                break
            depth -= 1
        elif char == "," and depth == 0:
            break
        elif depth == 0 and re.match(r"\s+(FROM|WHERE|RETURNING)\b", text[i:]):
            break
        i += 1
    return text[start:i]


def written(text: str) -> set[str]:
    """The statuses a statement's SET lists assign: the literal the status is set to, or
    the results (THEN, ELSE) of the CASE it is set to, not the conditions (WHEN)."""
    body = re.sub(r"--[^\n]*", "", text)
    found: set[str] = set()
    for match in ASSIGNMENT.finditer(body):
        expression = KEEPS.sub("", assigned_expression(body, match.end()))
        results = re.findall(r"(?:\bTHEN|\bELSE|\A)\s*'(\w+)'", expression.strip())
        found |= {literal for literal in results if literal in STATUSES}
    return found


def test_states__every_move_is_between_known_states():
    for source, target in TRANSITIONS:
        assert source in STATUSES | {NEW}, source
        assert target in STATUSES | {GONE}, target
    # Every state is reached and left (dead and done wait to be pruned).
    assert {t for _, t in TRANSITIONS} >= STATUSES
    assert {s for s, _ in TRANSITIONS} >= STATUSES


@pytest.mark.parametrize("name", sorted(STATEMENTS))
def test_states__every_set_status_literal_is_a_move_of_its_statement(name):
    """Each status a statement assigns is a target of its ``moves:`` header, and each
    target of an UPDATE's moves is assigned somewhere in it: the header says what the
    SQL does, so TRANSITIONS (and the diagram made from it) says what can happen."""
    text = STATEMENTS[name][1]
    moves = sql.moves(text)
    targets = {t for ts in moves.values() for t in ts}
    assigned = written(text)
    assert assigned <= targets, f"{name} writes {sorted(assigned - targets)} its header omits"
    updated = {t for s, ts in moves.items() if s != NEW for t in ts if t != GONE}
    assert updated <= assigned, (
        f"{name}'s header names {sorted(updated - assigned)} it never writes"
    )
    body = re.sub(r"--[^\n]*", "", text)
    inserts = bool(re.search(r"\b(INSERT INTO|COPY) pgqueue_job\b(?!_)", body))
    deletes = bool(re.search(r"\bDELETE FROM pgqueue_job\b(?!_)", body))
    assert (NEW in moves) == inserts, f"{name}: an insert of jobs is a move from new"
    assert (GONE in targets) == deletes, f"{name}: a delete of jobs is a move to gone"


def test_states__the_check_catches_a_status_write_the_header_omits():
    """Planted: JOB_PROMOTE_DUE's header without its move, and a statement writing a
    status its header does not name, are both caught."""
    text = STATEMENTS["JOB_PROMOTE_DUE"][1]
    stripped = text.replace("-- moves: scheduled -> pending\n", "")
    assert written(stripped) == {"pending"} and sql.moves(stripped) == {}
    widened = text.replace("SET status = 'pending'", "SET status = 'dead'")
    assert written(widened) == {"dead"} and "dead" not in sql.moves(widened)["scheduled"]


def test_states__transitions_name_the_moves_the_issue_found_missing():
    """The debounce re-arm and the periodic rewind (pending -> scheduled) and a snooze
    (running -> scheduled) were absent from the hand-drawn diagram."""
    assert "JOB_ENQUEUE_DEBOUNCED" in TRANSITIONS["pending", "scheduled"]
    assert "SCHEDULE_SYNC" in TRANSITIONS["pending", "scheduled"]
    assert "JOB_SNOOZE" in TRANSITIONS["running", "scheduled"]


def test_states__the_docs_diagram_is_generated_from_the_transitions():
    text = HOW_IT_WORKS.read_text()
    assert "```mermaid\n" + states.diagram() + "```" in text, "run make sql"
    assert states.table() in text, "run make sql"
