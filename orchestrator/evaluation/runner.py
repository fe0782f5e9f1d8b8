"""One evaluation run: the workspace's graph over a dataset, in a temporary copy.

The copy holds everything of the workspace but inbox/, out/, runs/, quarantine/ and
datasets/ (its configuration, prompts, templates, tools, kb/, data/, scripts), with the
dataset's tickets in its inbox/; `ticketgraph run --json` runs there, embedded, as a child
process (with the configured model, or `--replay`/`--record` a cassette), and what it wrote
is read back before the copy is removed. The workspace's own inbox/ and out/ are never read
or written.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from orchestrator.config.workspace import CONFIG_FILE, Workspace
from orchestrator.errors import ConfigError, GraphError
from orchestrator.evaluation import ablations
from orchestrator.evaluation.dataset import Dataset

LEFT_OUT = {"inbox", "out", "runs", "quarantine", "datasets", "__pycache__"}
# A week ago: inbox/ claims only files that have not changed for a moment.
SETTLED_S = 7 * 24 * 3600
# Ends of a run that say nothing about its answers: it stopped, crashed, or could not start.
RUN_DONE = (0, 1)


class EvalError(GraphError):
    """An evaluation run did not finish (exit code 3)."""


@dataclass(frozen=True)
class Model:
    """Where an evaluation's model requests go: a cassette replayed or recorded into, or
    the configured model (neither)."""

    replay: Path | None = None
    record: Path | None = None

    def flags(self) -> list[str]:
        """`ticketgraph run`'s flags for it."""
        if self.replay is not None:
            return ["--replay", str(self.replay.absolute())]
        if self.record is not None:
            return ["--record", str(self.record.absolute())]
        return []


@dataclass
class TicketResult:
    """What one run did with one ticket."""

    category: str | None
    status: str
    stop: str | None
    rounds: int
    cost_usd: float
    latency_s: float
    text: str
    error: str | None = None


@dataclass
class RunResult:
    """One run of the dataset: per ticket, and the run's own figures."""

    variant: str
    run_id: str
    exit_code: int
    wall_s: float
    cost_usd: float
    route_cost_usd: float
    tickets: dict[str, TicketResult] = field(default_factory=dict)


def read_config(workspace: Workspace) -> ablations.Config:
    """The workspace's ticketgraph.toml as data (empty when there is none)."""
    path = workspace.root / CONFIG_FILE
    if not path.exists():
        return {}
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc


def run(
    workspace: Workspace,
    dataset: Dataset,
    model: Model,
    variant: str = "baseline",
    config: ablations.Config | None = None,
    timeout_s: float = 3600,
) -> RunResult:
    """Run the dataset once in a temporary copy of `workspace` (with `config` as its
    ticketgraph.toml, if given) and read back what the run did."""
    with tempfile.TemporaryDirectory(prefix="ticketgraph-eval-") as tmp:
        copy = Path(tmp) / "workspace"
        _copy(workspace.root, copy, dataset, config)
        started = time.perf_counter()
        document = _run(copy, model, timeout_s)
        wall_s = time.perf_counter() - started
        return _result(copy, document, variant, wall_s)


def _copy(root: Path, copy: Path, dataset: Dataset, config: ablations.Config | None) -> None:
    def skipped(folder: str, names: list[str]) -> set[str]:
        top = Path(folder) == root
        return {n for n in names if (top and n in LEFT_OUT) or n == "__pycache__"}

    shutil.copytree(root, copy, ignore=skipped, symlinks=True)
    if config is not None:
        (copy / CONFIG_FILE).write_text(ablations.to_toml(config), encoding="utf-8")
    inbox = copy / "inbox"
    inbox.mkdir()
    settled = time.time() - SETTLED_S
    for path in dataset.tickets.values():
        target = inbox / path.name
        shutil.copyfile(path, target)
        os.utime(target, (settled, settled))


def _run(copy: Path, model: Model, timeout_s: float) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TICKETGRAPH_")}
    # The run is embedded: a shared broker's workers would not see this temporary copy.
    for kept in ("TICKETGRAPH_POOL_SIZE", "TICKETGRAPH_PROCESSES"):
        if kept in os.environ:
            env[kept] = os.environ[kept]
    command = [sys.executable, "-m", "orchestrator.cli", "run", "--json", *model.flags()]
    command += ["--workspace", str(copy), "--timeout", str(timeout_s)]
    done = subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True)
    try:
        document: dict[str, object] = json.loads(done.stdout)
    except ValueError as exc:
        if done.returncode in RUN_DONE:
            raise EvalError(f"the evaluation's run printed no JSON document: {exc}") from exc
        document = {}
    if done.returncode not in RUN_DONE:
        said = _why(document, done.stderr) or f"exit {done.returncode}"
        raise EvalError(f"the evaluation's run ended with exit {done.returncode}: {said}")
    return document


def _why(document: dict[str, object], stderr: str) -> str | None:
    """Why a run crashed: its record's error (a crashed run prints its JSON document and
    nothing on stderr), else stderr's last line."""
    record = document.get("record")
    if isinstance(record, dict) and record.get("error"):
        return str(record["error"])
    said = stderr.strip().splitlines()[-1:]
    return said[0] if said else None


def _result(copy: Path, document: dict[str, object], variant: str, wall_s: float) -> RunResult:
    record = document["record"]
    assert isinstance(record, dict)
    latency = _latencies(copy / "runs" / str(document["run_id"]) / "run.jsonl")
    result = RunResult(
        variant=variant,
        run_id=str(document["run_id"]),
        exit_code=int(str(document["exit_code"])),
        wall_s=wall_s,
        cost_usd=float(str(document["cost_usd"])),
        route_cost_usd=float(record["nodes"].get("route", {}).get("cost_usd") or 0.0),
    )
    for ticket, data in record["tickets"].items():
        out = copy / data["file"] if data.get("file") else None
        text = out.read_text(encoding="utf-8") if out is not None and out.exists() else ""
        cost = sum(float(data.get(step, {}).get("cost_usd") or 0.0) for step in ("draft", "review"))
        result.tickets[ticket] = TicketResult(
            category=data.get("category"),
            status=data["status"],
            stop=data.get("stop"),
            rounds=int(data.get("gate_rounds") or 0),
            cost_usd=cost,
            latency_s=latency.get(ticket, 0.0),
            text=text,
            error=data.get("error"),
        )
    return result


def _latencies(trace: Path) -> dict[str, float]:
    """Per ticket, seconds from its first traced event to its last."""
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    with trace.open(encoding="utf-8") as lines:
        for line in lines:
            event = json.loads(line)
            ticket = event.get("ticket")
            if not isinstance(ticket, str):
                continue
            at = datetime.fromisoformat(event["ts"].replace("Z", "+00:00")).timestamp()
            first.setdefault(ticket, at)
            last[ticket] = at
    return {t: last[t] - first[t] for t in first}
