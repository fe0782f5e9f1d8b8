"""`ticketgraph eval`: the dataset run K times as the workspace is, then K times without each
ablated layer; scored per ticket, summed up, and compared pairwise ticket by ticket."""

from __future__ import annotations

from typing import Any

from orchestrator.config.workspace import Workspace
from orchestrator.evaluation import ablations, runner
from orchestrator.evaluation.dataset import Dataset
from orchestrator.evaluation.runner import Model, RunResult
from orchestrator.evaluation.scoring import TicketScore, score_tickets, summary
from orchestrator.evaluation.stats import paired

# Per-ticket figures compared between a configuration and its ablation: (name in the
# document, attribute of TicketScore).
PAIRED = (
    ("pass_rate", "passed"),
    ("needs_person_rate", "needs_person"),
    ("expectations_met", "met"),
    ("cost_per_ticket_usd", "cost_usd"),
)


def evaluate(
    workspace: Workspace,
    dataset: Dataset,
    model: Model,
    repeat: int = 1,
    layers: tuple[str, ...] = (),
    timeout_s: float = 3600,
) -> dict[str, Any]:
    """The evaluation's document (what --json prints; report.py writes it as text)."""
    config = runner.read_config(workspace)
    changed = {layer: ablations.ablate(config, layer) for layer in layers}  # usage errors first
    base_runs = _runs(workspace, dataset, model, repeat, "baseline", None, timeout_s)
    base = score_tickets(dataset, base_runs)
    document = {
        "dataset": str(dataset.source),
        "cassette": str(model.replay or model.record or "") or None,
        "recorded": model.record is not None,
        **summary(dataset, base_runs, base),
        "per_ticket": _per_ticket(base),
        "ablations": {},
    }
    for layer, layer_config in changed.items():
        runs = _runs(workspace, dataset, model, repeat, layer, layer_config, timeout_s)
        scores = score_tickets(dataset, runs)
        figures = summary(dataset, runs, scores, route=layer != "route")
        figures["deltas"] = _deltas(base, scores)
        figures["cost_delta_per_ticket_usd"] = (
            figures["cost_per_ticket_usd"] - document["cost_per_ticket_usd"]
        )
        figures["changed"] = _changed(base, scores)
        document["ablations"][layer] = figures
    return document


def _runs(
    workspace: Workspace,
    dataset: Dataset,
    model: Model,
    repeat: int,
    variant: str,
    config: ablations.Config | None,
    timeout_s: float,
) -> list[RunResult]:
    return [
        runner.run(workspace, dataset, model, variant, config, timeout_s) for _ in range(repeat)
    ]


def _per_ticket(scores: dict[str, TicketScore]) -> dict[str, Any]:
    return {
        ticket: {
            "met": s.met,
            "passed": s.passed,
            "statuses": s.statuses,
            "misses": s.misses,
            "cost_usd": s.cost_usd,
            "latency_s": s.latency_s,
        }
        for ticket, s in scores.items()
    }


def _deltas(base: dict[str, TicketScore], ablated: dict[str, TicketScore]) -> dict[str, Any]:
    tickets = list(base)
    return {
        name: paired(
            [getattr(base[t], attr) for t in tickets], [getattr(ablated[t], attr) for t in tickets]
        ).as_dict()
        for name, attr in PAIRED
    }


def _changed(base: dict[str, TicketScore], ablated: dict[str, TicketScore]) -> dict[str, Any]:
    """Tickets whose expectations fared differently without the layer, and how."""
    return {
        ticket: {"met": [base[ticket].met, ablated[ticket].met], "misses": ablated[ticket].misses}
        for ticket in base
        if base[ticket].met != ablated[ticket].met
    }


def thresholds_missed(
    document: dict[str, Any],
    min_accuracy: float | None,
    min_pass: float | None,
    max_cost: float | None,
) -> list[str]:
    """The CI thresholds the baseline misses, each as a phrase (empty: none)."""
    missed = []
    accuracy = document["routing_accuracy"]
    if min_accuracy is not None and (accuracy is None or accuracy < min_accuracy):
        missed.append(f"routing accuracy {accuracy} < --min-accuracy {min_accuracy}")
    if min_pass is not None and document["pass_rate"] < min_pass:
        missed.append(f"pass rate {document['pass_rate']:.3f} < --min-pass {min_pass}")
    cost = document["cost_per_ticket_usd"]
    if max_cost is not None and cost > max_cost:
        missed.append(f"cost per ticket ${cost:.4f} > --max-cost-per-ticket ${max_cost}")
    return missed
