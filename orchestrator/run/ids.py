"""Ticket and run ids: the one rule every path built from an id goes through.

An id becomes a file name (out/<id>.txt, runs/<run>/records/<id>.json, agents/<id>.<step>.json),
so it must be a plain name: never a separator, never `..`. Ids are checked when a ticket is
claimed, and again wherever one is read back (a state file, a message on the broker) and
turned into a path, so an edited state file cannot write outside the workspace.
"""

from __future__ import annotations

import re
from pathlib import Path

from orchestrator.errors import RunStateError
from orchestrator.run.workspace import Workspace

TICKET_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
ID_RULE = "1-64 ASCII letters, digits, '-', '_' or '.', starting with a letter or digit, no '..'"


def is_ticket_id(value: str) -> bool:
    """True if `value` may name a ticket (and so a file)."""
    return bool(TICKET_ID.match(value)) and ".." not in value


def ticket(value: str) -> str:
    """`value` if it is a ticket id; `RunStateError` otherwise."""
    if not is_ticket_id(value):
        raise RunStateError(
            f"{value!r} is not a ticket id ({ID_RULE}); refusing to use it as a path"
        )
    return value


def is_run_id(value: str) -> bool:
    """True if `value` may name a run (and so its folder)."""
    return bool(RUN_ID.match(value)) and ".." not in value


def run(value: str) -> str:
    """`value` if it is a run id; `RunStateError` otherwise."""
    if not is_run_id(value):
        raise RunStateError(f"{value!r} is not a run id (see runs/ for the ids)")
    return value


def agent_of(state_path: Path) -> tuple[str, str]:
    """(owner, step) of an agent's state file, `agents/<owner>.<step>.json`: a step's name
    holds no dot (draft, review-1, draft-<angle>), a ticket id may (`T.1`)."""
    owner, _, step = state_path.name.removesuffix(".json").rpartition(".")
    return owner, step


def out_name(ticket_id: str) -> str:
    """`out/<ticket>.txt`: where a ticket's reply is published, relative to the workspace
    (a record's `file`, the trace's), for a checked ticket id."""
    return f"out/{ticket(ticket_id)}.txt"


def out_file(workspace: Workspace, ticket_id: str) -> Path:
    """out/<ticket>.txt of a workspace, for a checked ticket id."""
    return workspace.root / out_name(ticket_id)
