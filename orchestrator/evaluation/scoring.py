"""Scoring: each ticket's answer against its expectation, and a configuration's figures over
the dataset (routing accuracy and confusion, pass and needs-a-person rates, expectations met,
agreement with labels, cost and latency)."""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from orchestrator.evaluation.dataset import Dataset, Expectation
from orchestrator.evaluation.runner import RunResult, TicketResult
from orchestrator.evaluation.stats import percentile

PASS, NEEDS_HUMAN = "pass", "needs_human"
WANTED = {"pass": PASS, "needs_person": NEEDS_HUMAN}
MISSING = TicketResult(None, "missing", None, 0, 0.0, 0.0, "", "not in the run's record")


def misses(expected: Expectation, got: TicketResult) -> list[str]:
    """What of `expected` the answer `got` does not meet (empty: all of it)."""
    missed = []
    if expected.category is not None and got.category != expected.category:
        missed.append(f"category {got.category} (expected {expected.category})")
    lowered = got.text.lower()
    missed += [f"lacks {p!r}" for p in expected.contains if p.lower() not in lowered]
    missed += [f"says {p!r}" for p in expected.not_contains if p.lower() in lowered]
    wanted = WANTED.get(expected.outcome or "")
    if wanted is not None and got.status != wanted:
        missed.append(f"{got.status} (expected {wanted}{', ' + got.stop if got.stop else ''})")
    return missed


@dataclass
class TicketScore:
    """One ticket in one configuration, averaged over its repeats."""

    passed: float
    needs_person: float
    met: float
    routed_right: float | None
    agreed: float | None  # the outcome a person's label asks for, met (labels only)
    cost_usd: float
    latency_s: float
    misses: list[str] = field(default_factory=list)
    statuses: list[str] = field(default_factory=list)


def score_tickets(dataset: Dataset, runs: list[RunResult]) -> dict[str, TicketScore]:
    """Per ticket of the dataset, its figures averaged over `runs` (the repeats)."""
    scores = {}
    for ticket in dataset.tickets:
        expected = dataset.expected.get(ticket, Expectation())
        got = [run.tickets.get(ticket, MISSING) for run in runs]
        missed = [misses(expected, g) for g in got]
        routed = (
            statistics.fmean(g.category == expected.category for g in got)
            if expected.category is not None
            else None
        )
        wanted = WANTED.get(expected.outcome or "") if expected.label is not None else None
        scores[ticket] = TicketScore(
            passed=statistics.fmean(g.status == PASS for g in got),
            needs_person=statistics.fmean(g.status == NEEDS_HUMAN for g in got),
            met=statistics.fmean(not m for m in missed),
            routed_right=routed,
            agreed=None if wanted is None else statistics.fmean(g.status == wanted for g in got),
            cost_usd=statistics.fmean(g.cost_usd for g in got),
            latency_s=statistics.fmean(g.latency_s for g in got),
            misses=sorted({m for ms in missed for m in ms}),
            statuses=[g.status for g in got],
        )
    return scores


def summary(
    dataset: Dataset, runs: list[RunResult], scores: dict[str, TicketScore], route: bool = True
) -> dict[str, Any]:
    """A configuration's figures (`route`: False when routing was ablated, so its accuracy
    means nothing and the router's cost is left out)."""
    n = len(scores) or 1
    values = list(scores.values())
    spent = statistics.fmean(r.cost_usd - (0 if route else r.route_cost_usd) for r in runs)
    agreed = [s.agreed for s in values if s.agreed is not None]
    routed = [s.routed_right for s in values if s.routed_right is not None]
    return {
        "tickets": len(scores),
        "runs": len(runs),
        "routing_accuracy": statistics.fmean(routed) if route and routed else None,
        "confusion": _confusion(dataset, runs) if route else None,
        "pass_rate": sum(s.passed for s in values) / n,
        "needs_person_rate": sum(s.needs_person for s in values) / n,
        "expectations_met": sum(s.met for s in values) / n,
        "label_agreement": statistics.fmean(agreed) if agreed else None,
        "cost_per_ticket_usd": spent / n,
        "cost_usd": {
            "median": percentile([s.cost_usd for s in values], 50),
            "p95": percentile([s.cost_usd for s in values], 95),
        },
        "latency_s": {
            "median": percentile([s.latency_s for s in values], 50),
            "p95": percentile([s.latency_s for s in values], 95),
        },
        "wall_s": statistics.fmean(r.wall_s for r in runs),
        "spread": _spread(dataset, runs) if len(runs) > 1 else None,
    }


def _confusion(dataset: Dataset, runs: list[RunResult]) -> dict[str, dict[str, int]]:
    """Expected category -> the category the run gave -> how often (over every repeat)."""
    table: dict[str, Counter[str]] = {}
    for ticket, expected in dataset.expected.items():
        if expected.category is None:
            continue
        for run in runs:
            got = run.tickets.get(ticket, MISSING).category or "none"
            table.setdefault(expected.category, Counter())[got] += 1
    return {k: dict(sorted(v.items())) for k, v in sorted(table.items())}


def _spread(dataset: Dataset, runs: list[RunResult]) -> dict[str, Any]:
    """How the repeats differ: each run's pass rate, and the tickets whose status changed."""
    rates = [
        sum(run.tickets.get(t, MISSING).status == PASS for t in dataset.tickets)
        / (len(dataset.tickets) or 1)
        for run in runs
    ]
    unstable = sorted(
        t for t in dataset.tickets if len({r.tickets.get(t, MISSING).status for r in runs}) > 1
    )
    return {"pass_rate_min": min(rates), "pass_rate_max": max(rates), "unstable": unstable}
