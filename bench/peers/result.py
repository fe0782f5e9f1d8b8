"""What a peer run reports: one JSON-ready record that both peers fill the same way."""

from __future__ import annotations

import os
import resource
from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

NODE_ORDER = ("route", "fanout", "merge", "review")
PASS = "pass"
NEEDS_HUMAN = "needs_human"


class PeerStatus(StrEnum):
    """Whether the peer ran."""

    OK = "ok"
    SKIPPED = "skipped"
    FAILED = "failed"


@dataclass(frozen=True)
class NodeUsage:
    """Model calls and provider-reported tokens of one node (rounds: review only)."""

    calls: int = 0
    tokens: int = 0
    rounds: int | None = None


@dataclass(frozen=True)
class TicketOutcome:
    """How one ticket ended, with the seed's field names."""

    category: str
    handler: str
    gate_rounds: int
    stop: str
    status: str


@dataclass
class PeerResult:
    """One peer run: wall times, usage per node, verdicts, memory; `outcomes` stays in Python."""

    peer: str
    status: PeerStatus = PeerStatus.OK
    reason: str | None = None
    tickets: int = 0
    pool: int = 0
    wall_s: float | None = None
    total_s: float | None = None
    max_rss_mb: float | None = None
    exit_code: int | None = None
    nodes: dict[str, NodeUsage] = field(default_factory=dict)
    outcomes: dict[str, TicketOutcome] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def calls(self) -> int:
        """Model calls of the whole run."""
        return sum(n.calls for n in self.nodes.values())

    @property
    def tokens(self) -> int:
        """Provider-reported tokens of the whole run."""
        return sum(n.tokens for n in self.nodes.values())

    def count(self, status: str) -> int:
        """How many tickets ended with `status` (pass / needs_human)."""
        return sum(o.status == status for o in self.outcomes.values())

    def to_json(self) -> dict[str, Any]:
        """The record as one JSON object (per-ticket outcomes reduced to counts)."""
        body: dict[str, Any] = {"peer": self.peer, "status": self.status.value}
        if self.reason is not None:
            body["reason"] = self.reason
        if self.status is PeerStatus.SKIPPED:
            return body | self.extra
        return body | {
            "tickets": self.tickets,
            "pool": self.pool,
            "wall_s": _round(self.wall_s),
            "total_s": _round(self.total_s),
            "calls": self.calls,
            "tokens": self.tokens,
            "nodes": {name: _node_json(node) for name, node in self.nodes.items()},
            "pass": self.count(PASS),
            "needs_human": self.count(NEEDS_HUMAN),
            "stops": dict(sorted(Counter(o.stop for o in self.outcomes.values()).items())),
            "max_rss_mb": _round(self.max_rss_mb, 1),
            "exit_code": self.exit_code,
            **self.extra,
        }

    def summary(self) -> str:
        """A few human-readable lines: the node table and the verdicts."""
        lines = [f"{self.peer}: {self.status.value}" + (f" ({self.reason})" if self.reason else "")]
        if self.status is PeerStatus.SKIPPED:
            return lines[0]
        for name, node in self.nodes.items():
            rounds = "-" if node.rounds is None else node.rounds
            usage = f"{node.calls:>8} calls{node.tokens:>12} tokens"
            lines.append(f"  {name:<8}{usage}  rounds {rounds}")
        lines.append(
            f"  {self.tickets} tickets, pool {self.pool}: wall {_fmt(self.wall_s)} s, total "
            f"{_fmt(self.total_s)} s, pass {self.count(PASS)}, needs_human "
            f"{self.count(NEEDS_HUMAN)}, max RSS {_fmt(self.max_rss_mb, 1)} MB, "
            f"exit code {self.exit_code}"
        )
        return "\n".join(lines)


def _node_json(node: NodeUsage) -> dict[str, int]:
    body = {"calls": node.calls, "tokens": node.tokens}
    return body if node.rounds is None else body | {"rounds": node.rounds}


def _fmt(value: float | None, digits: int = 3) -> str:
    return "?" if value is None else f"{value:.{digits}f}"


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def max_rss_mb(who: int = resource.RUSAGE_SELF) -> float:
    """Peak resident set size in MiB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(who).ru_maxrss / 1024


def process_age_s() -> float | None:
    """Seconds since this process started (Linux /proc, 10 ms steps); None elsewhere."""
    try:
        with open("/proc/self/stat", encoding="ascii") as stat:
            # Field 22 (starttime, in clock ticks since boot) counts from after the `(comm)`.
            start_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime", encoding="ascii") as uptime:
            up_s = float(uptime.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return up_s - start_ticks / os.sysconf("SC_CLK_TCK")
