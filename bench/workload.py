"""The peers' scaled workload as a ticketgraph workspace: N clones of the six demo tickets.

From DESIGN.md: ticket k = 1..N gets id `T-(100000+k)` and the text of demo ticket (k-1) mod 6
(T-1001..T-1006, sorted), with that ticket's scripted replies, its id replaced and usage
unchanged; the router answers one line per ticket with the demo's raw label, usage fixed at
624 + 96 a call. At N = 1,000: calls fanout/review 1,334/333, 1,990,100 tokens besides
routing. ticketgraph routes in batches that fit the router's max_tokens (steps/batches.py:
28 calls at N = 1,000 with the demo's 512); a peer that routes in one call pays 1 (`peer_*`).

The scenario stays a handful of scripts for any N: the router answers line by line (a
`lines` reply: each ticket line of its request gets its demo ticket's label, told apart by
the ticket's text), so each batch is answered about exactly its tickets; each other demo
script becomes one templated script whose `user` regex captures the clone's id as `{ticket}`
and tells the demo tickets apart by their request text, built with the same
`orchestrator.prompts` functions that write the requests: a draft by the customer's text, a
rewrite by the previous draft it quotes.

    from bench.workload import build
    workload = build(Path("/tmp/ws"), 1000, latency_ms=50, pool_size=16)
    workload.calls, workload.tokens   # {"route": 28, "fanout": 1334, "review": 333}, 2009540
    workload.critical_path_s()        # 5.309...: the ideal wall time (see its docstring)
"""

from __future__ import annotations

import heapq
import os
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from orchestrator.config import layers
from orchestrator.config.workspace import CONFIG_FILE, Workspace, init_demo
from orchestrator.intake.inbox import route_text
from orchestrator.steps import batches, prompts
from workers.provider.scenario import map_strings

FIRST_NUMBER = 100000
TICKET_GROUP = r"(?P<ticket>T-\d+)"
# Stands for the ticket id while a request is built and escaped (no character to escape).
MARK = "TICKETIDMARK"
ROUTER = "router"
ROUTE_PREFIX = 40  # characters of a demo ticket's text that tell it apart in a routing line
REGEX_SPECIAL = re.compile(r"([.^$*+?{}\[\]\\|()])")


class _Dumper(yaml.SafeDumper):
    """Writes multi-line strings as `|` blocks, so the router's answer reads a line a ticket."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    """A string node, in block style when it spans lines."""
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)


@dataclass(frozen=True)
class DemoTicket:
    """One demo ticket: its text, the router's raw label, and what its scripts cost."""

    id: str
    text: str
    label: str
    draft_calls: int = 0
    draft_tokens: int = 0
    rewrite_calls: int = 0
    rewrite_tokens: int = 0


@dataclass(frozen=True)
class Workload:
    """A built workspace and what a run of it should cost, derived from the demo's numbers."""

    root: Path
    n: int
    latency_ms: float
    pool_size: int
    demo: tuple[DemoTicket, ...]
    route_tokens: int  # of one routing call
    route_calls: int = 1  # ticketgraph's routing calls: its batches of the N tickets

    def clone_ids(self) -> list[str]:
        """The N ticket ids, in inbox order."""
        return [clone_id(k) for k in range(1, self.n + 1)]

    def clones(self) -> list[DemoTicket]:
        """The demo ticket each of the N tickets copies, in inbox order."""
        return [self.demo[(k - 1) % len(self.demo)] for k in range(1, self.n + 1)]

    @property
    def calls(self) -> dict[str, int]:
        """Expected model calls per node of ticketgraph's run: a router call a batch, the
        drafts, the rewrites."""
        clones = self.clones()
        return {
            "route": self.route_calls,
            "fanout": sum(t.draft_calls for t in clones),
            "review": sum(t.rewrite_calls for t in clones),
        }

    @property
    def tokens(self) -> int:
        """Expected tokens of ticketgraph's whole run (prompt + completion, all fixed by the
        scripts)."""
        return self.peer_tokens + (self.route_calls - 1) * self.route_tokens

    @property
    def peer_calls(self) -> int:
        """Expected model calls of a peer that routes every ticket in one call."""
        return sum(self.calls.values()) - self.route_calls + 1

    @property
    def peer_tokens(self) -> int:
        """Expected tokens of a peer that routes every ticket in one call."""
        clones = self.clones()
        return self.route_tokens + sum(t.draft_tokens + t.rewrite_tokens for t in clones)

    def critical_path_s(
        self, latency_ms: float | None = None, pool_size: int | None = None
    ) -> float:
        """Ideal wall time: the route call, then each stage's calls spread evenly over the pool."""
        # The model behind DESIGN.md's 5.26 s (N = 1,000, pool 16, 50 ms per call, one
        # routing call): 0.05 + (1,334 + 333) × 0.05 / 16 = 5.259 s; ticketgraph's 28 routing
        # calls go 16 at a time, two waves: 5.309 s. A lower bound, since a ticket's calls run
        # one after another in its slot: whole tickets on a greedy list schedule
        # (`list_schedule_s`) take 2 × 0.05 + 42 × 0.1 + 21 × 0.05 = 5.35 s.
        latency_s, pool = self._figures(latency_ms, pool_size)
        calls = self.calls
        return latency_s * (self._route_waves(pool) + (calls["fanout"] + calls["review"]) / pool)

    def list_schedule_s(
        self, latency_ms: float | None = None, pool_size: int | None = None
    ) -> float:
        """Wall time of a greedy list schedule of whole tickets, stage by stage, on the slots."""
        latency_s, pool = self._figures(latency_ms, pool_size)
        clones = self.clones()
        drafts = _makespan([t.draft_calls for t in clones if t.draft_calls], pool)
        rewrites = _makespan([t.rewrite_calls for t in clones if t.rewrite_calls], pool)
        return latency_s * (self._route_waves(pool) + drafts + rewrites)

    def _route_waves(self, pool: int) -> int:
        """The routing calls' waves: they go side by side, `pool` at a time."""
        return -(-self.route_calls // pool)

    def _figures(self, latency_ms: float | None, pool_size: int | None) -> tuple[float, int]:
        """(seconds per call, slots), defaulting to the workload's own."""
        latency = self.latency_ms if latency_ms is None else latency_ms
        return latency / 1000, pool_size or self.pool_size


def clone_id(k: int) -> str:
    """The id of ticket k (1-based): T-(100000+k)."""
    return f"T-{FIRST_NUMBER + k}"


def build(root: Path, n: int, latency_ms: float = 50, pool_size: int = 16) -> Workload:
    """Create the workspace of N tickets at `root` (absent or empty) and describe its run."""
    if n < 1:
        raise ValueError(f"n must be at least 1, not {n}")
    if root.exists() and any(root.iterdir()):
        raise FileExistsError(f"{root} is not empty: the workload needs a fresh workspace")
    init_demo(root)
    workspace = Workspace(root)
    scripts = yaml.safe_load(workspace.scenarios.read_text(encoding="utf-8"))
    demo = demo_tickets(workspace, scripts)
    router = _script(scripts, ROUTER)
    workload = Workload(root, n, latency_ms, pool_size, demo, _tokens(router["replies"]))
    _write_inbox(workspace.inbox, workload)
    _write_scenarios(workspace.scenarios, workload, scripts)
    _set_pool_size(root / CONFIG_FILE, pool_size)
    return replace(workload, route_calls=_route_calls(workspace, workload))


def _route_calls(workspace: Workspace, workload: Workload) -> int:
    """ticketgraph's routing calls for the workload: its batches, as route plans them."""
    config = layers.declared(workspace)
    texts = {
        ticket: route_text(demo.text, config.route_chars)
        for ticket, demo in zip(workload.clone_ids(), workload.clones(), strict=True)
    }
    return len(batches.for_run(config, texts).plan(workload.clone_ids()))


# --- the demo's numbers --------------------------------------------------------------------


def demo_tickets(workspace: Workspace, scripts: list[dict[str, Any]]) -> tuple[DemoTicket, ...]:
    """The demo tickets in id order, with their labels and the cost of their scripts."""
    labels = dict(
        _route_line(line) for line in _script(scripts, ROUTER)["replies"][0]["text"].splitlines()
    )
    workers = set(workspace.config().workers)
    tickets = []
    for path in sorted(workspace.inbox.glob("*.txt")):
        ticket, label = path.stem, labels[path.stem]
        draft = _script(scripts, f"{ticket}#1")["replies"] if label in workers else []
        rewrite = next((s["replies"] for s in scripts if s["name"] == f"{ticket}#2"), [])
        costs = (len(draft), _tokens(draft), len(rewrite), _tokens(rewrite))
        tickets.append(DemoTicket(ticket, path.read_text(encoding="utf-8"), label, *costs))
    return tuple(tickets)


def _route_line(line: str) -> tuple[str, str]:
    """(ticket id, raw label) of one router line `T-1001: billing`."""
    ticket, label = line.split(":", 1)
    return ticket.strip(), label.strip()


def _script(scripts: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """The demo script called `name`."""
    for script in scripts:
        if script["name"] == name:
            return script
    raise ValueError(f"the demo scenario has no script named {name!r}")


def _tokens(replies: list[dict[str, Any]]) -> int:
    """Tokens of replies with fixed usage (every demo reply fixes its usage)."""
    return sum(r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"] for r in replies)


def _makespan(durations: list[int], slots: int) -> int:
    """Finish time of a greedy list schedule: each job goes to the slot that frees first."""
    finish = [0] * slots
    for duration in durations:
        heapq.heapreplace(finish, finish[0] + duration)
    return max(finish)


# --- writing the workspace -----------------------------------------------------------------


def _write_inbox(inbox: Path, workload: Workload) -> None:
    """Replace the demo tickets with the N clones."""
    for path in inbox.iterdir():
        path.unlink()
    past = time.time() - 60  # settled: inbox/ skips files modified in the last second
    for ticket, demo in zip(workload.clone_ids(), workload.clones(), strict=True):
        path = inbox / f"{ticket}.txt"
        path.write_text(demo.text, encoding="utf-8")
        os.utime(path, (past, past))


def _write_scenarios(path: Path, workload: Workload, demo_scripts: list[dict[str, Any]]) -> None:
    """The router for N tickets, then one templated script per demo script, in demo order."""
    by_id = {t.id: t for t in workload.demo}
    scripts = [_router(_script(demo_scripts, ROUTER), workload)]
    for script in demo_scripts:
        # The six demo tickets' own scripts (README's approval examples are not cloned).
        if script["name"].split("#")[0] in by_id:
            scripts.append(_templated(script, by_id, _script(demo_scripts, _draft_of(script))))
    for script in scripts:
        script["latency_ms"] = workload.latency_ms
    header = f"# bench/workload.py: {workload.n} clones of the demo tickets (generated)\n"
    body = yaml.dump(scripts, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)
    path.write_text(header + body, encoding="utf-8")


def _router(demo_router: dict[str, Any], workload: Workload) -> dict[str, Any]:
    """The demo's router script answering one `id: raw label` line per ticket line of its
    request: the demo ticket a clone copies is told by the start of its text."""
    rules = []
    for demo in workload.demo:
        start = REGEX_SPECIAL.sub(r"\\\1", " ".join(demo.text.split())[:ROUTE_PREFIX])
        rules.append({"match": f"^{TICKET_GROUP}: {start}", "text": f"{{ticket}}: {demo.label}"})
    usage = demo_router["replies"][0]["usage"]
    return demo_router | {"replies": [{"lines": rules, "usage": usage}]}


def _draft_of(script: dict[str, Any]) -> str:
    """The name of the draft script of the demo ticket `script` belongs to (`T-1004#1`)."""
    return f"{script['name'].split('#')[0]}#1"


def _templated(
    script: dict[str, Any], demo: dict[str, DemoTicket], draft: dict[str, Any]
) -> dict[str, Any]:
    """A demo draft (`T-1001#1`) or rewrite (`T-1004#2`) script, for every clone of its ticket."""
    ticket_id, step = script["name"].split("#")
    if step == "1":
        request = prompts.draft_input(MARK, demo[ticket_id].text.strip())
    else:
        # A rewrite quotes the draft it replaces: that text tells the demo tickets apart.
        previous = draft["replies"][-1]["text"].replace(ticket_id, MARK)
        request = prompts.rewrite_input(MARK, previous, "")
        request = request[: request.index(previous) + len(previous)]
    replies = map_strings(script["replies"], lambda text: text.replace(ticket_id, "{ticket}"))
    return script | {"when": {"user": "^" + _pattern(request)}, "replies": replies}


def _pattern(request: str) -> str:
    """A regex for `request` whose first MARK captures the id and later ones must repeat it."""
    # Escape only what `re` reads as syntax, and newlines as `\n`: the file stays readable.
    escaped = REGEX_SPECIAL.sub(r"\\\1", request).replace("\n", r"\n")
    first, *rest = escaped.split(MARK)
    if not rest:
        return first
    return first + TICKET_GROUP + "(?P=ticket)".join(rest)


def _set_pool_size(config: Path, pool_size: int) -> None:
    """Set `[graph] pool_size` in the workspace's ticketgraph.toml, keeping its comments."""
    text = config.read_text(encoding="utf-8")
    text, count = re.subn(r"(?m)^pool_size\s*=\s*\d+", f"pool_size = {pool_size}", text, count=1)
    if count != 1:
        raise ValueError(f"{config}: no `pool_size = N` line to set")
    config.write_text(text, encoding="utf-8")
