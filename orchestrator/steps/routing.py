"""The router's reply, read leniently and decided strictly.

Models format a list however they like: `- T-1001: billing`, `**T-1002**: bug`,
`1. T-1004 - Billing.`, `` `T-1005` → bug ``. Each line is normalised (bullets and numbering,
markdown emphasis, quotes and backticks, the label's case and trailing punctuation, the
separators `:`, `-`, `–`, `—`, `→`, `->`, `=`) before it is matched, and still only claimed
ids count. The label is the first word after the id: a known category there counts whatever
follows it, as a person reads `T-1001: billing: charges`, `T-1001: billing (charges…)` or
`T-1001 — Billing, refunds` (small models copy the categories' descriptions after the label);
an unknown word counts alone or before a separator (`T-1006: complaint: angry`), and prose
(`T-1006: I think billing`) is asked about again rather than guessed at.
Every ticket records how its category was decided:

    matched   the router named an allowed category
    clamped   the router named something else (kept as `raw`); the ticket becomes other
    missing   the router named no category for it (no category): it is asked about again
              in smaller batches, down to one ticket a call, and if still missing needs a
              human (stop `unrouted`), never a template

Ids the router named that this run did not claim are reported once, as `unclaimed`, with
the number of lines about them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

OTHER = "other"
# The label `ticketgraph scenarios init` writes for a ticket, until someone picks its category.
TO_FILL = "CATEGORY"

_BULLET = re.compile(r"^\s*(?:[-*+•]|\d+[.)])\s+")
_DECOR = re.compile(r"[*_`\"'“”‘’]")
_LINE = re.compile(r"^\s*(\S+?)\s*(?::|->|→|=|\s[-–—]\s)\s*(.+?)\s*$")
# The label: a first word (letters, digits, `_`, `-`), and whether more follows it.
_LABEL = re.compile(r"[(\[<]?([\w-]+)(.*)$")
_TRAILING = ".,;:!"
# What may follow a label the router made up: punctuation only, or a separator before a
# description (`complaint: angry`, `complaint (angry)`); a word after it makes it prose.
_AFTER_LABEL = re.compile(r"[.,;:!)\]>]*$|\s*(?:[:(\[,;/]|[-–—]\s)")


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
    unclaimed_lines: int = 0  # lines about the unclaimed ids, ignored


def parse(text: str, claimed: list[str], allowed: list[str]) -> Routes:
    """Decide a category for every claimed ticket from the router's reply."""
    ids = set(claimed)
    # Compared as the lines are, without markdown's decoration (`account_access` too).
    allowed_by_lower = {_DECOR.sub("", a).lower(): a for a in allowed}
    named: dict[str, str] = {}
    unclaimed: list[str] = []
    ignored = 0
    for line in text.splitlines():
        found = _split(line, allowed_by_lower)
        if found is None:
            continue
        ticket_id, label = found
        if ticket_id not in ids:
            if _looks_like_an_id(ticket_id):
                ignored += 1
                if ticket_id not in unclaimed:
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
    return Routes(decisions, unclaimed, ignored)


def _split(line: str, known: dict[str, str]) -> tuple[str, str] | None:
    """(id, label) of one line, or None if it is not a routing line: its label is the first
    word after the id if that is a `known` category (lower case) or is not followed by
    more words."""
    cleaned = _DECOR.sub("", _BULLET.sub("", line))
    match = _LINE.match(cleaned)
    if match is None:
        return None
    ticket_id = match[1].strip(_TRAILING)
    label = _LABEL.match(match[2])
    if not ticket_id or label is None:
        return None
    word = label[1]
    if word.lower() in known or _AFTER_LABEL.match(label[2]):
        return ticket_id, word
    return None


def _looks_like_an_id(value: str) -> bool:
    return any(c.isdigit() for c in value)
