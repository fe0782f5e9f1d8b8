"""Where a run stands, counted from its trace as it grows: what `run` shows while it waits.

Workers on any machine append to the run's run.jsonl (the workspace is shared), so the
waiting command follows that file from where it last read: no polling of records, no extra
broker traffic, and the same numbers the trace keeps for later.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.run.records import FAILED_STOPS
from orchestrator.run.store import RunStore


class TraceTail:
    """The lines appended to a JSONL file since the last read (whole lines only); with
    `only`, just the lines holding one of those bytes are parsed (a cheap filter on a long
    trace)."""

    def __init__(self, path: Path, only: tuple[bytes, ...] = ()) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""
        self.only = only

    def read(self) -> list[dict[str, Any]]:
        """The events written since the last call."""
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(chunk)
        *lines, self.partial = (self.partial + chunk).split(b"\n")
        events = []
        for line in lines:
            if self.only and not any(part in line for part in self.only):
                continue
            try:
                events.append(json.loads(line))
            except ValueError:
                continue  # not a trace line (a torn write is never split: see Tracer.emit)
        return events


# The caps a request can wait for (coordination/ratecap.py), as the user set them.
CAPS = {"tpm": "LLM_MAX_TPM", "inflight": "LLM_MAX_INFLIGHT", "cool": "a 429's Retry-After"}
CAP_EVENTS = (b'"cap_wait"', b'"cap_admitted"')  # a wait always ends with its admission


@dataclass
class CapWaits:
    """The run's requests that wait for the endpoint's shared caps now, from the trace: a
    request waits from its `cap_wait` until its `cap_admitted` (or its agent run stops)."""

    # agent run -> (when this command saw it wait, wall clock; the cap)
    since: dict[str, tuple[float, str]] = field(default_factory=dict)

    def add(self, event: dict[str, Any]) -> None:
        """Count one trace event."""
        name, agent = event.get("event"), str(event.get("agent_run_id"))
        if name == "cap_wait":
            self.since.setdefault(agent, (time.time(), str(event.get("cap"))))
        elif name in ("cap_admitted", "run_stopped", "turn"):
            self.since.pop(agent, None)

    def line(self) -> str | None:
        """`3 requests wait for the endpoint's cap (LLM_MAX_TPM) since 10:04:31 (12 s)`."""
        if not self.since:
            return None
        count = len(self.since)
        caps = ", ".join(sorted({CAPS.get(cap, cap) for _t, cap in self.since.values()}))
        first = min(t for t, _cap in self.since.values())
        waited = time.time() - first
        at = time.strftime("%H:%M:%S", time.localtime(first))
        requests = "1 request waits" if count == 1 else f"{count} requests wait"
        return f"{requests} for the endpoint's cap ({caps}) since {at} ({waited:.0f} s)"


@dataclass
class Tally:
    """Counts of a run so far: tickets by stage and verdict, model calls, tokens, spend;
    `steps`: the nodes of the run's plan in order, `drafting`: the node whose tickets count
    as drafted when its worker (or template) is done."""

    tickets: int
    steps: tuple[str, ...]
    drafting: str
    started: float = field(default_factory=time.monotonic)
    nodes: dict[str, str] = field(init=False)  # node -> waiting, running or done
    node_ms: dict[str, int] = field(default_factory=dict)
    routed: set[str] = field(default_factory=set)
    drafted: set[str] = field(default_factory=set)
    passed: set[str] = field(default_factory=set)
    needs_human: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)
    calls: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    paid: dict[str, float] = field(default_factory=dict)  # agent run -> its cost so far
    run_budget_usd: float | None = None  # what the run may spend ([run] budget_usd, --budget)
    waits: CapWaits = field(default_factory=CapWaits)

    def __post_init__(self) -> None:
        self.nodes = dict.fromkeys(self.steps, "waiting")

    @property
    def spend(self) -> str:
        """`$0.0123`, or `$0.0123 of $0.0500` against the run's budget."""
        from orchestrator.steps.report import usd

        spent = usd(self.cost_usd)
        return spent if self.run_budget_usd is None else f"{spent} of {usd(self.run_budget_usd)}"

    def add(self, event: dict[str, Any]) -> None:
        """Count one trace event."""
        name, node, ticket = event.get("event"), event.get("node"), event.get("ticket")
        self.waits.add(event)
        if name == "node_start" and node in self.nodes:
            self.nodes[node] = "running"
        elif name == "node_end" and node in self.nodes:
            self.nodes[node] = "done"
            self.node_ms[node] = int(event.get("ms") or 0)
        elif name == "turn":  # its cost_usd is the agent run's so far, its tokens the turn's
            self.calls += 1
            self.tokens += int(event.get("total_tokens") or 0)
            agent = str(event.get("agent_run_id"))
            paid = float(event.get("cost_usd") or 0.0)
            self.cost_usd += paid - self.paid.get(agent, 0.0)
            self.paid[agent] = paid
        elif not ticket:
            return
        elif name == "routed":
            self.routed.add(ticket)
        elif name in ("template_done", "worker_done") and node == self.drafting:
            self.drafted.add(ticket)
        elif name == "verdict":  # also after a resume retried a failed ticket
            self.failed.discard(ticket)
            passed = event.get("status") == "pass"
            (self.passed if passed else self.needs_human).add(ticket)
            (self.needs_human if passed else self.passed).discard(ticket)
        elif name in FAILED_STOPS:
            self.failed.add(ticket)
            self.needs_human.add(ticket)

    @property
    def reviewed(self) -> int:
        """Tickets with a verdict (a failed draft is never reviewed)."""
        return len(self.passed) + len(self.needs_human - self.failed)

    @property
    def elapsed_s(self) -> float:
        """Seconds since this command started following the run."""
        return time.monotonic() - self.started

    def line(self) -> str:
        """The tally in one line."""
        return (
            f"{self.tickets} tickets: {len(self.drafted)} drafted, {self.reviewed} reviewed, "
            f"{len(self.passed)} pass, {len(self.needs_human)} need a human, "
            f"{len(self.failed)} failed; {self.calls} model calls, {self.tokens} tokens, "
            f"{self.spend}; {self.elapsed_s:.1f} s"
        )


class WaitPrinter:
    """Says, as it happens, that the run's requests wait for the endpoint's shared caps
    (LLM_MAX_TPM, LLM_MAX_INFLIGHT): when they start to, then every REPEAT_S while they do;
    a long wait is never silent. Reads only the trace's cap lines, from where it stood."""

    REPEAT_S = 30.0

    def __init__(self, store: RunStore) -> None:
        self.tail = TraceTail(store.trace_path, only=CAP_EVENTS)
        self.tail.offset = _size(store.trace_path)  # waits of an earlier command are over
        self.own = CapWaits()
        self.said_at: float | None = None

    def __call__(self, counted: CapWaits | None) -> None:
        """Print the waits' line if it is due; `counted`: a tally's, when one reads the
        trace already."""
        waits = counted if counted is not None else self.own
        if counted is None:
            for event in self.tail.read():
                waits.add(event)
        line = waits.line()
        if line is None:
            self.said_at = None
        elif self.said_at is None or time.monotonic() - self.said_at >= self.REPEAT_S:
            self.said_at = time.monotonic()
            print(f"[wait] {line}", flush=True)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
