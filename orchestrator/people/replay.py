"""Calibrating the deterministic gate against people's verdicts, offline: the gate (and the
workspace's own checks) run again over every labelled reply, with no model call, and are
counted against what the person did with it:

    false alarm   a reply a person let go out as written ("sent", "audit_good") that the
                  gate fails: a wasted rewrite, a needless hand-off
    miss          a reply the gate passes that a person rewrote, closed or marked bad
                  ("edited", "closed", "audit_bad"): what went out wrong

For each check: how many replies it fails, of them how many a person accepted (its false
alarms) and how many a person rejected (caught). Today's rules (the workspace's
ticketgraph.toml) and a candidate's (another file) side by side.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.config import declarations, tables
from orchestrator.config.tables import WorkspaceConfig
from orchestrator.people import labels, reply
from orchestrator.people.labels import ACCEPTED, REJECTED, Label
from orchestrator.steps import gate, prompts

if TYPE_CHECKING:
    from orchestrator.config.workspace import Workspace


@dataclass
class CheckCounts:
    """One check over the labelled replies."""

    failed: int = 0
    false_alarms: int = 0
    caught: int = 0


@dataclass
class Counts:
    """One set of rules over the labelled replies."""

    labelled: int = 0
    false_alarms: int = 0
    misses: int = 0
    by_check: dict[str, CheckCounts] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The `--json` form."""
        return {
            "labelled": self.labelled,
            "false_alarms": self.false_alarms,
            "misses": self.misses,
            "by_check": {name: dict(vars(c)) for name, c in sorted(self.by_check.items())},
        }


def rules_of(workspace: Workspace, config: WorkspaceConfig) -> gate.Rules:
    """The gate's rules a configuration gives (its own checks imported from `workspace`)."""
    own: tuple[gate.OwnCheck, ...] = ()
    if config.gate.checks:
        found = declarations.declared(workspace, {}, config.gate.checks)
        own = tuple(found.gate_checks(config.gate.checks))
    return gate.Rules(
        filler_phrases=config.gate.filler_phrases,
        off=frozenset(config.gate.off),
        min_chars=config.gate.min_chars,
        max_chars=config.gate.max_chars,
        own=own,
    )


def failures(label: Label, rules: gate.Rules) -> set[str]:
    """The checks the gate fails the label's reply on today (their names: `filler_word`,
    `missing_ticket_id`, a check of the team's own...)."""
    ticket = gate.TicketView(label.ticket, label.ticket_text, label.category)
    sources = gate.Sources(
        task=prompts.draft_input(label.ticket, label.ticket_text),
        facts=[label.ticket_text, *label.facts],
    )
    bound = gate.Rules(**{**vars(rules), "ticket": ticket})
    result = gate.check(label.ticket, label.draft, rules.filler_phrases, sources, bound)
    return {problem.split(":", 1)[0] for problem in reply.split(result.report)}


def count(found: list[Label], rules: gate.Rules) -> Counts:
    """False alarms and misses of `rules` over the labels, in total and by check."""
    counts = Counts(labelled=len(found))
    for label in found:
        failed = failures(label, rules)
        accepted, rejected = label.verdict in ACCEPTED, label.verdict in REJECTED
        counts.false_alarms += bool(failed) and accepted
        counts.misses += not failed and rejected
        for name in failed:
            check = counts.by_check.setdefault(name, CheckCounts())
            check.failed += 1
            check.false_alarms += accepted
            check.caught += rejected
    return counts


def replay(workspace: Workspace, candidate: Path | None) -> dict[str, Counts]:
    """Today's rules (and the candidate file's) over every label of the workspace."""

    found = list(labels.read(workspace))
    current = rules_of(workspace, workspace.config())
    result = {"current": count(found, current)}
    if candidate is not None:
        rules = rules_of(workspace, tables.read(candidate))
        result["candidate"] = count(found, rules)
    return result


def text(result: dict[str, Counts]) -> str:
    """The counts for a person: totals, then each check, the sets of rules side by side."""
    sides = list(result)
    current = result["current"]
    lines = [f"gate replay over {current.labelled} labelled replies (no model call)"]
    lines.append(f"{'':<24}" + "".join(f"{side:<14}" for side in sides))
    for name, what in (("false_alarms", "false alarms"), ("misses", "misses")):
        lines.append(f"{what:<24}" + "".join(f"{getattr(result[s], name):<14}" for s in sides))
    names = sorted({n for s in sides for n in result[s].by_check})
    if names:
        lines.append("by check (fails / of them false alarms / caught):")
    for name in names:
        cells = [result[s].by_check.get(name, CheckCounts()) for s in sides]
        shown = "".join(f"{f'{c.failed} / {c.false_alarms} / {c.caught}':<14}" for c in cells)
        lines.append(f"  {name:<22}{shown}")
    return "\n".join(lines) + "\n"
