"""Tickets in inbox/: `<id>.txt` (the text) or `<id>.json` ({"id"?, "text"}), sorted by id."""

from __future__ import annotations

import json
import re
from pathlib import Path

from pydantic import BaseModel

from orchestrator.errors import InboxError

TICKET_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class Ticket(BaseModel):
    """One ticket: its id, its text and the file it came from."""

    id: str
    text: str
    source: str


def load(inbox: Path) -> list[Ticket]:
    """Every ticket in `inbox`, sorted by id; a bad file is an `InboxError` naming it."""
    if not inbox.is_dir():
        raise InboxError(f"no inbox folder at {inbox}")
    tickets = [_read(path) for path in sorted(inbox.iterdir()) if path.suffix in (".txt", ".json")]
    seen: dict[str, str] = {}
    for ticket in tickets:
        if ticket.id in seen:
            raise InboxError(
                f"ticket id {ticket.id} appears twice: {seen[ticket.id]} and {ticket.source}"
            )
        seen[ticket.id] = ticket.source
    return sorted(tickets, key=lambda t: t.id)


def _read(path: Path) -> Ticket:
    try:
        raw = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InboxError(f"cannot read ticket {path}: {exc}") from exc
    if path.suffix == ".json":
        ticket_id, text = _from_json(path, raw)
    else:
        ticket_id, text = path.stem, raw.strip()
    if not TICKET_ID.match(ticket_id):
        raise InboxError(f"{path}: ticket id {ticket_id!r} must be letters, digits, '-', '_', '.'")
    if not text:
        raise InboxError(f"{path}: the ticket has no text")
    return Ticket(id=ticket_id, text=text, source=str(path.resolve()))


def _from_json(path: Path, raw: str) -> tuple[str, str]:
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InboxError(f"{path}: not valid JSON: {exc.msg} (line {exc.lineno})") from exc
    if not isinstance(data, dict) or not isinstance(data.get("text"), str):
        raise InboxError(f'{path}: expected an object with a "text" string')
    return str(data.get("id") or path.stem), data["text"].strip()
