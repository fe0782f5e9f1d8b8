"""Ablations: the same workspace with one layer taken out, as a changed ticketgraph.toml in
the evaluation's temporary copy (the workspace's own file is never touched).

    route       every ticket to one generic worker: each category's worker (and each
                template's) becomes the same generic prompt with every worker's tools. The
                router still answers (its prompt is unchanged, so a cassette still holds it),
                but what it says no longer matters; its cost is taken out of the figures.
    review      no rewrite loop: the gate judges the first draft ([gate] max_rounds = 0)
    evaluator   no model-based check after the gate ([evaluator] enabled = false)
    voting      no vote between a worker's angles: each worker with `angles` drafts once,
                from its first angle's prompt (steps/voting.py); the other angles' cost is
                gone, and what the vote chose no longer matters
    gate:NAME   one gate check off (echo, not_prose, length, unsupported_fact), or one of the
                workspace's own [gate] checks by its import path

`LAYERS` is the one table, and a layer is one entry, a function that changes the
configuration in place.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

from orchestrator.config.tables import CHECKS
from orchestrator.errors import UsageError

Config = dict[str, Any]
Ablate = Callable[[Config], None]

GENERIC_PROMPT = """\
You are a support agent for every kind of ticket, handling one ticket at a time.
Goal: write a complete reply in English to the ticket.
Output format: one plain-text paragraph starting with "Ticket <ticket id>:"; no bullet lists, \
no pleasantries.
Tool guidance: use the tools you have to look up what the ticket names before you state a \
fact; never invent an order, an amount or an issue number.
Task limits: only reply; do not promise refunds, dates or fixes no source gave, and do not \
write filler such as "please wait a moment".
"""
OTHER = "other"


def _route(config: Config) -> None:
    """Every category (and `other`) answered by one generic worker."""
    workers: dict[str, Any] = config.get("workers", {})
    categories = list(config.get("graph", {}).get("categories") or workers)
    tools = sorted({t for w in workers.values() for t in w.get("tools", [])})
    reads = sorted({r for w in workers.values() for r in w.get("reads", [])})
    approval = {k: v for w in workers.values() for k, v in w.get("approval", {}).items()}
    generic = {"prompt": GENERIC_PROMPT, "tools": tools, "reads": reads, "approval": approval}
    config["workers"] = {
        name: {**generic, "description": workers.get(name, {}).get("description", "")}
        for name in dict.fromkeys([*categories, OTHER])
    }
    config["templates"] = {}


def _review(config: Config) -> None:
    config.setdefault("gate", {})["max_rounds"] = 0


def _evaluator(config: Config) -> None:
    if not config.get("evaluator", {}).get("enabled"):
        raise UsageError(
            "--ablate evaluator: this workspace does not enable the evaluator "
            "([evaluator] enabled = false): there is nothing to take out"
        )
    config["evaluator"]["enabled"] = False


def _voting(config: Config) -> None:
    """Each worker with angles drafts from its first angle alone."""
    angled = {n: w for n, w in config.get("workers", {}).items() if w.get("angles")}
    if not angled:
        raise UsageError(
            "--ablate voting: no worker of this workspace declares angles "
            "([workers.<category>.angles.<name>]): there is no vote to take out"
        )
    for worker in angled.values():
        first = next(iter(worker.pop("angles").values()))
        worker.update({k: first[k] for k in ("prompt", "prompt_file") if k in first})


def _gate_check(name: str) -> Ablate:
    def ablate(config: Config) -> None:
        gate = config.setdefault("gate", {})
        if name in CHECKS:
            gate["off"] = sorted({*gate.get("off", []), name})
        elif name in gate.get("checks", []):
            gate["checks"] = [c for c in gate["checks"] if c != name]
        else:
            own = ", ".join(gate.get("checks", [])) or "none"
            raise UsageError(
                f"--ablate gate:{name}: no such gate check (built-in: {', '.join(CHECKS)}; "
                f"this workspace's own: {own})"
            )

    return ablate


LAYERS: dict[str, Ablate] = {
    "route": _route,
    "review": _review,
    "evaluator": _evaluator,
    "voting": _voting,
}


def ablate(config: Config, layer: str) -> Config:
    """A copy of `config` without `layer`; `UsageError` naming the known layers."""
    changed = copy.deepcopy(config)
    if layer.startswith("gate:"):
        _gate_check(layer.removeprefix("gate:"))(changed)
    elif layer in LAYERS:
        LAYERS[layer](changed)
    else:
        known = ", ".join([*LAYERS, "gate:NAME"])
        raise UsageError(f"--ablate {layer}: no such layer (the layers: {known})")
    return changed


# --- writing the configuration back as TOML -------------------------------------------------


def to_toml(config: Config) -> str:
    """`config` (as tomllib read it) written back as TOML: its keys, then its tables."""
    return "\n".join(_table(config, ())) + "\n"


def _table(table: Config, path: tuple[str, ...]) -> list[str]:
    lines = [f"[{'.'.join(_key(p) for p in path)}]"] if path else []
    subtables = {k: v for k, v in table.items() if isinstance(v, dict)}
    lines += [f"{_key(k)} = {_value(v)}" for k, v in table.items() if k not in subtables]
    for key, value in subtables.items():
        lines += ["", *_table(value, (*path, key))]
    return lines


def _key(key: str) -> str:
    return json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {value!r} as TOML")
