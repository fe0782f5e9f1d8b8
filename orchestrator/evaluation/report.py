"""The evaluation's document as text: the baseline's figures, per ticket what it missed, and
one block per ablated layer with its paired deltas, intervals and cost delta."""

from __future__ import annotations

from typing import Any


def text(document: dict[str, Any]) -> str:
    """What `ticketgraph eval` prints without --json."""
    source = document["cassette"]
    how = f"replayed from {source}" if source and not document["recorded"] else "with the model"
    if document["recorded"]:
        how += f", recorded into {source}"
    size = f"{document['tickets']} tickets x {document['runs']} run(s)"
    lines = [f"eval {document['dataset']}: {size}, {how}"]
    lines += _figures(document)
    lines += _tickets(document["per_ticket"])
    for layer, figures in document["ablations"].items():
        lines += ["", f"--ablate {layer}:"]
        lines += _figures(figures)
        lines += _deltas(figures)
        for ticket, change in figures["changed"].items():
            before, after = change["met"]
            lines.append(
                f"  {ticket}: expectations met {before:.0%} -> {after:.0%}: "
                f"{'; '.join(change['misses']) or 'all met'}"
            )
    return "\n".join(lines) + "\n"


def _figures(f: dict[str, Any]) -> list[str]:
    accuracy, agreement = f["routing_accuracy"], f["label_agreement"]
    cost, latency = f["cost_usd"], f["latency_s"]
    needs = _pct(f["needs_person_rate"])
    lines = [
        f"  routing accuracy  {_pct(accuracy)}" + ("" if accuracy is not None else " (not routed)"),
        f"  pass rate         {_pct(f['pass_rate'])}   needs a person {needs}",
        f"  expectations met  {_pct(f['expectations_met'])}"
        + (f"   label agreement {_pct(agreement)}" if agreement is not None else ""),
        f"  cost per ticket   ${f['cost_per_ticket_usd']:.4f} (median ${cost['median']:.4f}, "
        f"p95 ${cost['p95']:.4f})",
        f"  latency per ticket  median {latency['median'] * 1000:.0f} ms, "
        f"p95 {latency['p95'] * 1000:.0f} ms",
    ]
    if f["confusion"]:
        cells = "  ".join(
            f"{want}->{got}:{n}" for want, row in f["confusion"].items() for got, n in row.items()
        )
        lines.append(f"  confusion         {cells}")
    if f["spread"]:
        spread = f["spread"]
        unstable = ", ".join(spread["unstable"]) or "none"
        low, high = _pct(spread["pass_rate_min"]), _pct(spread["pass_rate_max"])
        lines.append(
            f"  spread            pass rate {low}..{high}, tickets that changed: {unstable}"
        )
    return lines


def _tickets(per_ticket: dict[str, Any]) -> list[str]:
    missed = [(t, s) for t, s in per_ticket.items() if s["misses"]]
    if not missed:
        return ["  every ticket met its expectations"]
    return [f"  {t} misses: {'; '.join(s['misses'])}" for t, s in missed]


def _deltas(figures: dict[str, Any]) -> list[str]:
    lines = []
    for name, d in figures["deltas"].items():
        low, high = d["ci95"]
        if name == "cost_per_ticket_usd":
            shown = f"{d['delta']:+.4f} USD [{low:+.4f}, {high:+.4f}]"
        else:
            shown = f"{d['delta'] * 100:+.1f} pts [{low * 100:+.1f}, {high * 100:+.1f}]"
        lines.append(f"  paired delta {name:<20} {shown} (95% CI, n={d['n']})")
    lines.append(
        f"  cost delta per ticket, routing included: ${figures['cost_delta_per_ticket_usd']:+.4f}"
    )
    return lines


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"
