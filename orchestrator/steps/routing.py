"""The router's reply, read leniently and decided strictly.

Models format a list however they like: `- T-1001: billing`, `**T-1002**: bug`,
`1. T-1004 - Billing.`, `` `T-1005` → bug ``. Each line is normalised (bullets and numbering,
markdown emphasis, quotes and backticks, the label's case and trailing punctuation, the
separators `:`, `-`, `–`, `—`, `→`, `->`, `=`) before it is matched, and still only claimed
ids count. Every ticket records how its category was decided:

    matched   the router named an allowed category
    clamped   the router named something else (kept as `raw`); the ticket becomes other
    missing   the router named no category for it (no category): it is asked about once
              more, and if still missing needs a human (stop `unrouted`), never a template

Ids the router named that this run did not claim are reported once, as `unclaimed`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

OTHER = "other"
# The label `ticketgraph scenarios init` writes for a ticket, until someone picks its category.
TO_FILL = "CATEGORY"

_BULLET = re.compile(r"^\s*(?:[-*+•]|\d+[.)])\s+")
_DECOR = re.compile(r"[*_`\"'“”‘’]")
_LINE = re.compile(r"^\s*(\S+?)\s*(?::|->|→|=|\s[-–—]\s)\s*(\S+)\s*$")
_TRAILING = ".,;:!"


@dataclass(frozen=True)
class Decision:
    """One ticket's category and how it was decided."""

    category: str | None  # None: missing
    how: str  # matched, clamped or missing
    raw: str | None = None


@dataclass(frozen=True)
class Routes:
    """The router's reply, decided."""

    decisions: dict[str, Decision]
    unclaimed: list[str]


def parse(text: str, claimed: list[str], allowed: list[str]) -> Routes:
    """Decide a category for every claimed ticket from the router's reply."""
    ids = set(claimed)
    allowed_by_lower = {a.lower(): a for a in allowed}
    named: dict[str, str] = {}
    unclaimed: list[str] = []
    for line in text.splitlines():
        found = _split(line)
        if found is None:
            continue
        ticket_id, label = found
        if ticket_id not in ids:
            if ticket_id not in unclaimed and _looks_like_an_id(ticket_id):
                unclaimed.append(ticket_id)
            continue
        named.setdefault(ticket_id, label)  # the first line about a ticket decides it
    decisions = {}
    for ticket_id in claimed:
        raw = named.get(ticket_id)
        if raw is None:
            decisions[ticket_id] = Decision(None, "missing")
        elif raw.lower() in allowed_by_lower:
            decisions[ticket_id] = Decision(allowed_by_lower[raw.lower()], "matched")
        else:
            decisions[ticket_id] = Decision(OTHER, "clamped", raw)
    return Routes(decisions, unclaimed)


def _split(line: str) -> tuple[str, str] | None:
    """(id, label) of one line, or None if it is not a routing line."""
    cleaned = _DECOR.sub("", _BULLET.sub("", line))
    match = _LINE.match(cleaned)
    if match is None:
        return None
    ticket_id = match[1].strip(_TRAILING)
    label = match[2].strip(_TRAILING)
    if not ticket_id or not label:
        return None
    return ticket_id, label


def _looks_like_an_id(value: str) -> bool:
    return any(c.isdigit() for c in value)
