"""The deterministic gate: plain string checks, the same answer every time, no model call.

The seed's two checks (the ticket id is in the reply; no filler phrase) plus the ones real
models need, each named in the gate report and each can be turned off (`[gate] off`), then
the workspace's own (`[gate] checks`: `check(draft_text, ticket)` returns the reasons a
draft fails; each shows as `<check name>:<reason>`):

    echo               the reply repeats its prompt or the customer's text (half or more of
                       its 5-word runs appear in the task it was given, or the prompt's own
                       labels appear in it)
    not_prose          the reply is JSON, a tool call or a code block, not a reply
    length             shorter than `min_chars` or longer than `max_chars`
    unsupported_fact   an order id or a money amount that is neither in the ticket nor in a
                       tool result of the ticket's agent runs (a reply may repeat what the
                       customer wrote; it may not invent a refund of 120.00)
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.config import declarations
from orchestrator.config.tables import CHECKS
from orchestrator.config.workspace import Workspace
from orchestrator.run.records import REPORT_SEPARATOR, RunConfig
from workers import versions

PROMPT_LABELS = ("ticket id:", "customer's text:")
ECHO_SHARE = 0.5
NGRAM = 5
ORDER_ID = re.compile(r"\b[A-Z]{1,4}-\d{3,}\b")
AMOUNT = re.compile(r"(?<![\d.,])\d{1,3}(?:[ ,.]\d{3})*[.,]\d{2}(?![\d])")
NUMBER = re.compile(r"\d+(?:[.,]\d+)?")
WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class GateResult:
    """Whether a draft passed, and the report that goes back to the rewriter."""

    passed: bool
    report: str


class Sources:
    """What a reply may draw on: the task its worker was given, and every fact it saw:
    `facts`, or `load` to read them the first time a check needs them (a reply that names
    no order id and no amount needs none)."""

    def __init__(
        self,
        task: str = "",
        facts: list[str] | None = None,
        load: Callable[[], list[str]] | None = None,
    ) -> None:
        self.task = task
        self._load = load or (lambda: facts or [])

    @functools.cached_property
    def facts(self) -> list[str]:
        """Every fact the reply may repeat (read once)."""
        return self._load()


@dataclass(frozen=True)
class TicketView:
    """What a check of a team's own sees of the ticket: its id, text and category."""

    id: str
    text: str
    category: str | None = None


Check = Callable[[str, TicketView], list[str]]
OwnCheck = tuple[str, Check]  # its name, the function


@dataclass(frozen=True)
class Rules:
    """The gate's settings (from `[gate]`)."""

    filler_phrases: list[str] = field(default_factory=list)
    off: frozenset[str] = frozenset()
    min_chars: int = 40
    max_chars: int = 4000
    own: tuple[OwnCheck, ...] = ()  # the workspace's checks, in the order declared
    ticket: TicketView | None = None


def rules_for(config: RunConfig, workspace: Workspace, ticket: TicketView) -> Rules:
    """The gate's settings for one ticket of a run (`config`), with the workspace's own
    checks imported: what review and the vote between angles both judge by."""
    own: tuple[OwnCheck, ...] = ()
    if config.checks:
        own = tuple(declarations.load(workspace, config).gate_checks(config.checks))
    return Rules(
        filler_phrases=config.filler_phrases,
        off=frozenset(config.gate_off),
        min_chars=config.min_chars,
        max_chars=config.max_chars,
        own=own,
        ticket=ticket,
    )


def seen_by(ticket_text: str, states: Iterable[Path]) -> list[str]:
    """The facts a reply may repeat: the ticket's text and every tool result the agent runs
    saved at `states` got (a state not written yet, torn or foreign is skipped)."""
    facts = [ticket_text]
    for path in states:
        try:
            messages = versions.read_json(path).get("messages", [])
        except (OSError, ValueError):
            continue
        facts += [m.get("content") or "" for m in messages if m.get("role") == "tool"]
    return facts


def check(
    ticket_id: str,
    draft: str,
    filler_phrases: list[str],
    sources: Sources | None = None,
    rules: Rules | None = None,
) -> GateResult:
    """Every problem of `draft`, in a fixed order; it passes when there is none."""
    rules = rules or Rules(filler_phrases=filler_phrases)
    problems = []
    if ticket_id not in draft:
        problems.append("missing_ticket_id")
    lowered = draft.lower()
    problems += [f"filler_word:{p}" for p in filler_phrases if p.lower() in lowered]
    on = [c for c in CHECKS if c not in rules.off]
    if "echo" in on and sources is not None and _echoes(draft, sources.task):
        problems.append("echo")
    if "not_prose" in on and _not_prose(draft):
        problems.append("not_prose")
    if "length" in on:
        size = len(draft.strip())
        if size < rules.min_chars:
            problems.append(f"too_short:{size}<{rules.min_chars}")
        elif size > rules.max_chars:
            problems.append(f"too_long:{size}>{rules.max_chars}")
    if "unsupported_fact" in on and sources is not None:
        problems += [f"unsupported_fact:{f}" for f in _unsupported(ticket_id, draft, sources)]
    ticket = rules.ticket or TicketView(ticket_id, "")
    for name, own in rules.own:
        problems += [f"{name}:{reason}" for reason in _own(own, draft, ticket)]
    return GateResult(passed=not problems, report=REPORT_SEPARATOR.join(problems))


def _own(
    check: Callable[[str, TicketView], list[str]], draft: str, ticket: TicketView
) -> list[str]:
    """A team's check's reasons; one that raises fails the draft with what it raised (the
    draft is not sent on a check nobody could run)."""
    try:
        return [str(reason) for reason in check(draft, ticket) or []]
    except Exception as exc:  # the team's code: anything can happen in it
        return [f"the check raised {type(exc).__name__}: {exc}"]


def _echoes(draft: str, task: str) -> bool:
    lowered = draft.lower()
    if any(label in lowered for label in PROMPT_LABELS):
        return True
    grams = _ngrams(draft)
    if not grams or not task:
        return False
    seen = set(_ngrams(task))
    return sum(g in seen for g in grams) / len(grams) >= ECHO_SHARE


def _ngrams(text: str) -> list[tuple[str, ...]]:
    words = WORD.findall(text.lower())
    return [tuple(words[i : i + NGRAM]) for i in range(len(words) - NGRAM + 1)]


def _not_prose(draft: str) -> bool:
    text = draft.strip()
    if "<tool_call>" in text or text.startswith("```"):
        return True
    if text[:1] in "{[":
        try:
            json.loads(text)
        except ValueError:
            return False
        return True
    return False


def _unsupported(ticket_id: str, draft: str, sources: Sources) -> list[str]:
    named = {i for i in ORDER_ID.findall(draft) if i != ticket_id}
    amounts = AMOUNT.findall(draft)
    if not named and not amounts:  # nothing to look up: the facts are not read
        return []
    known = "\n".join(sources.facts)
    ids = {i for i in named if i not in known}
    numbers = set(_numbers(NUMBER.findall(known)))
    amounts = [a for a in amounts if _cents(a) not in numbers]
    return sorted(ids) + sorted(set(amounts))


def _cents(amount: str) -> int:
    """399.00, 399,00 and 1.399,00 as cents."""
    digits = re.sub(r"[^\d]", "", amount)
    return int(digits)


def _numbers(found: Iterable[str]) -> Iterable[int]:
    """Every number of the sources as cents: 39900 (cents already) and 399 / 399.00 (units)."""
    for raw in found:
        whole = raw.replace(",", ".")
        try:
            value = float(whole)
        except ValueError:
            continue
        if value.is_integer():
            yield int(value)  # a field in cents, e.g. amount_cents: 39900
        yield round(value * 100)  # units, e.g. 399 or 399.00
