"""One measured run of ticketgraph (`ticketgraph run` as a subprocess) or of the LangGraph peer.

Our run's own wall time is the span of its trace: from the first event's `ts` in run.jsonl
(route's node_start) to the last (report's node_end), millisecond resolution. The node span
(earliest node `started` to the latest `started + ms` in run-state.json) is kept beside it.
The LangGraph peer's own wall runs from its first model request to its report being written.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from bench.services import REPO, child_env, ticketgraph
from bench.watch import BLOCK_BYTES, Watched, run_watched

EXIT_NEEDS_HUMAN = 1  # every workload here has tickets that end needing a human


@dataclass
class OurRun:
    """A finished `ticketgraph run`: the process figures and the run folder's."""

    process: Watched
    folder: Path | None
    span_s: float | None = None
    node_ms: dict[str, int] = field(default_factory=dict)
    node_span_s: float | None = None
    calls: dict[str, int] = field(default_factory=dict)
    tokens: int = 0
    tickets: int = 0
    folder_bytes: int = 0
    problem: str = ""

    @property
    def ok(self) -> bool:
        """Whether the run gave the expected verdict (see `check`)."""
        return not self.problem

    @property
    def cpu_ms_per_ticket(self) -> float | None:
        """CPU of the command and of every process it reaped, per ticket, in ms (None for a
        run that went wrong)."""
        return 1000 * self.process.cpu_s / self.tickets if self.ok and self.tickets else None

    def check(self, calls: dict[str, int] | None, tokens: int | None, tickets: int) -> None:
        """Note a problem unless exit code, ticket count and (if given) usage are expected."""
        if self.problem:
            return
        if "Traceback (most recent call last)" in self.process.stderr.read_text(errors="replace"):
            self.problem = f"traceback: {self.process.tail(1)}"
        elif self.process.returncode != EXIT_NEEDS_HUMAN:
            self.problem = f"exit {self.process.returncode}: {self.process.tail()}"
        elif self.tickets != tickets:
            self.problem = f"{self.tickets} tickets in the run, expected {tickets}"
        elif calls is not None and {k: self.calls.get(k) for k in calls} != calls:
            self.problem = f"calls {self.calls}, expected {calls}"
        elif tokens is not None and self.tokens != tokens:
            self.problem = f"{self.tokens} tokens, expected {tokens}"

    def to_json(self) -> dict[str, Any]:
        """Process and run figures as JSON-ready data."""
        return {
            "run_id": self.folder.name if self.folder else None,
            "command_wall_s": round(self.process.wall_s, 3),
            "run_span_s": self.span_s,
            "node_span_s": self.node_span_s,
            "node_ms": self.node_ms,
            "calls": self.calls,
            "tokens": self.tokens,
            "tickets": self.tickets,
            "run_folder_bytes": self.folder_bytes,
            "written_bytes": self.process.oublock * BLOCK_BYTES,
            "problem": self.problem,
            "process": self.process.to_json(),
        }


Run = TypeVar("Run", "OurRun", "PeerRun")


def usable(runs: list[Run]) -> tuple[list[Run], str]:
    """The runs (ours or a peer's) that went as expected, and a note on those that did not."""
    ok = [r for r in runs if not r.problem]
    failed = [r for r in runs if r.problem]
    if not failed:
        return ok, ""
    return ok, f"{len(failed)}/{len(runs)} runs wrong: {failed[0].problem}"


def run_ticketgraph(
    workspace: Path,
    logs: Path,
    timeout_s: float,
    env: dict[str, str] | None = None,
    prefix: list[str] | None = None,
) -> OurRun:
    """`ticketgraph run --workspace W` with a clean environment plus `env`, measured;
    `prefix`: a command in front of it (strace, bench/syscalls.py)."""
    argv = [*(prefix or []), *ticketgraph("run", "--workspace", str(workspace))]
    process = run_watched(argv, workspace, child_env(**(env or {})), logs, timeout_s)
    return read_run(workspace, process)


def read_run(workspace: Path, process: Watched) -> OurRun:
    """The latest run of `workspace`, read from its folder."""
    pointer = workspace / "run-state.json"
    if not pointer.exists():
        return OurRun(process, None, problem=f"no run-state.json: {process.tail()}")
    state = json.loads(pointer.read_text(encoding="utf-8"))
    folder = pointer.resolve().parent
    nodes = state.get("nodes", {})
    run = OurRun(process, folder)
    run.node_ms = {name: node["ms"] for name, node in nodes.items() if node.get("ms") is not None}
    run.node_span_s = _node_span_s(nodes)
    run.calls = {name: node.get("calls", 0) for name, node in nodes.items()}
    run.tokens = sum(node.get("tokens", 0) for node in nodes.values())
    run.tickets = len(state.get("tickets", {}))
    run.span_s = trace_span_s(folder / "run.jsonl")
    run.folder_bytes = folder_bytes(folder)
    return run


def _node_span_s(nodes: dict[str, Any]) -> float | None:
    """From the first node's start to the last node's end, from `started` and `ms`."""
    timed = [n for n in nodes.values() if n.get("started") and n.get("ms") is not None]
    if not timed:
        return None
    end = max(n["started"] + n["ms"] / 1000 for n in timed)
    return round(end - min(n["started"] for n in timed), 3)


def trace_span_s(trace: Path) -> float | None:
    """Seconds from the first event's `ts` to the last one's in a run.jsonl."""
    if not trace.exists():
        return None
    with trace.open("rb") as lines:
        first = lines.readline()
        lines.seek(max(0, trace.stat().st_size - 65536))
        last = lines.read().rstrip(b"\n").rsplit(b"\n", 1)[-1]
    if not first or not last:
        return None
    start, end = (_ts(json.loads(line)["ts"]) for line in (first, last))
    return round(end - start, 3)


def _ts(text: str) -> float:
    """Epoch seconds of an ISO timestamp such as 2026-11-30T10:15:00.123Z."""
    return datetime.fromisoformat(text).timestamp()


def folder_bytes(folder: Path) -> int:
    """Apparent size of every file under `folder` (what the run left on disk)."""
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            total += os.lstat(os.path.join(root, name)).st_size
    return total


@dataclass
class PeerRun:
    """A finished `python -m bench.peers.langgraph_peer` process and the result it printed."""

    process_wall_s: float
    returncode: int
    result: dict[str, Any]
    stderr: str

    @property
    def wall_s(self) -> float | None:
        """The peer's own wall: first model request to the report written."""
        return self.result.get("wall_s")

    problem: str = ""
    cpu_s: float = 0.0  # user + system CPU of the peer's process (wait4), its provider apart

    def check(self, calls: int, tokens: int) -> None:
        """Note a problem unless the peer exited 0 having paid the expected calls and tokens."""
        got = (self.result.get("calls"), self.result.get("tokens"))
        if self.returncode != 0 or not self.result:
            self.problem = f"exit {self.returncode}: {self.stderr.strip()[-300:]}"
        elif got != (calls, tokens):
            self.problem = f"calls, tokens = {got}, expected {(calls, tokens)}"

    def to_json(self) -> dict[str, Any]:
        """The process wall and the peer's own record."""
        return {
            "process_wall_s": round(self.process_wall_s, 3),
            "cpu_s": round(self.cpu_s, 3),
            "problem": self.problem,
        } | {"result": self.result}


def run_langgraph(
    workspace: Path, base_url: str, pool: int, timeout_s: float, durable: bool = False
) -> PeerRun:
    """The LangGraph peer as its own process, against `base_url`; wall from spawn to exit.
    `durable`: with its SQLite checkpointer (langgraph_peer --durable). Its output goes to
    `workspace`/peer-logs."""
    argv = [sys.executable, "-m", "bench.peers.langgraph_peer", "--workspace", str(workspace)]
    argv += ["--base-url", base_url, "--pool", str(pool), "--json"]
    argv += ["--durable"] if durable else []
    done = run_watched(argv, REPO, child_env(), workspace / "peer-logs", timeout_s)
    stdout = done.stdout.read_text(errors="replace").strip()
    try:
        result = json.loads(stdout.splitlines()[-1]) if stdout else {}
    except ValueError:
        result = {}
    stderr = done.stderr.read_text(errors="replace")
    return PeerRun(done.wall_s, done.returncode, result, stderr, cpu_s=done.cpu_s)
