"""Re-record the demo's cassette (datasets/demo/cassette.json) from the scripted provider:

    python -m orchestrator.evaluation.demo_cassette

A fresh demo workspace in a temporary folder is evaluated on its dataset with every layer
the cassette must answer for (the workspace as it is, without routing, without review),
recording into the packaged file. `tests/evaluation/test_demo_cassette.py` fails when the
shipped file no longer matches what this records (a prompt, a script or a ticket changed).
"""

from __future__ import annotations

import sys
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

from orchestrator.config.workspace import Workspace, init
from orchestrator.evaluation import dataset, evaluate, runner

LAYERS = ("route", "review")
SHIPPED = "demo/datasets/demo/cassette.json"


def shipped() -> Path:
    """The packaged cassette's path."""
    return Path(str(resources.files("orchestrator").joinpath(SHIPPED)))


def record(into: Path) -> None:
    """Record the demo dataset's exchanges into `into` (a new file)."""
    with tempfile.TemporaryDirectory(prefix="ticketgraph-cassette-") as tmp:
        root = Path(tmp) / "demo"
        init(root, "demo")
        workspace = Workspace(root)
        data = dataset.load(root / "datasets" / "demo", workspace)
        evaluate.evaluate(workspace, data, runner.Model(record=into), 1, LAYERS)


def answers(cassette: Path) -> dict[str, list[Any]]:
    """What a cassette answers, by request key: each reply's message and usage (a reply's
    id and timestamp differ from one recording to the next)."""
    from workers.provider.cassette import load_cassette

    held: dict[str, list[Any]] = {}
    for exchange in load_cassette(cassette).exchanges:
        reply = exchange.response
        kept = [c.get("message") for c in reply.get("choices", [])], reply.get("usage")
        held.setdefault(exchange.key, []).append(kept)
    return held


def main() -> int:
    """Re-record the packaged cassette."""
    target = shipped()
    fresh = target.with_suffix(".new.json")
    fresh.unlink(missing_ok=True)
    record(fresh)
    fresh.replace(target)
    print(f"recorded {len(answers(target))} requests into {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
