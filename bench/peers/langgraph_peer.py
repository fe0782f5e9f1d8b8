"""The LangGraph peer: ticketgraph's workload as a plain `StateGraph` in one process.

    START → route ──Send per ticket──▶ draft → merge ──Send per draft──▶ review → report → END

- route: one chat completion (`prompts.ROUTER` with the workspace's categories, user text
  `prompts.router_input`); a label outside the categories, or a missing line, becomes other.
- draft: the category's worker (the workspace's declared prompt, `prompts.draft_input`) as
  a minimal tool loop (`chat.run_agent`), or the category's template — no model call.
- merge: writes out/<id>.txt; only ids, categories and paths go on to review.
- review: `orchestrator.gate.check` with the workspace's filler phrases; a failing draft goes
  back to its worker (`prompts.rewrite_input`) until gate_pass, no_progress (the same report
  twice in a row), max_rounds, or no_rewriter (template drafts).
- report: runs/langgraph-peer/report.json.

Nodes are sync functions sharing one `httpx.Client`; `graph.invoke` runs the tasks of a
superstep on a thread pool whose size is `max_concurrency` from the invoke config, so at most
`pool` drafts or reviews are in flight (the provider's /stats `max_in_flight` shows it). Sync
threads, not async nodes: see `chat` for the measured cost of httpx's async client.

Timing: `wall_s` runs from the first model request being issued to the report being written;
`total_s` from process start (CLI: interpreter, imports, graph build) or from `run()`.

    python -m bench.peers.langgraph_peer --workspace DIR --base-url URL --pool 16 [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import operator
import re
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any, NamedTuple, TypedDict

import httpx
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Send

from bench.peers.chat import TOOLS_OF, Answer, Chat, PeerError, Toolbox, Usage, http_client
from bench.peers.chat import run_agent as run_tool_loop
from bench.peers.result import (
    NEEDS_HUMAN,
    PASS,
    NodeUsage,
    PeerResult,
    TicketOutcome,
    max_rss_mb,
    process_age_s,
)
from orchestrator.config import layers
from orchestrator.config.tables import WorkspaceConfig
from orchestrator.config.workspace import Workspace
from orchestrator.steps import gate, prompts

PEER = "langgraph"
OTHER = "other"
TEMPLATE = "template"
ROUTE_LINE = re.compile(r"^\s*([^\s:]+)\s*:\s*(\S+)\s*$")
REPORT_FILE = "runs/langgraph-peer/report.json"
CHECKPOINTS = "runs/langgraph-peer/checkpoints.sqlite"
DURABLE_PEER = "langgraph-sqlite"


class Ticket(NamedTuple):
    """A ticket from inbox/ (a tuple, as `prompts.router_input` takes it)."""

    id: str
    text: str


@dataclass(frozen=True)
class Routed:
    """A ticket with its category: the payload of one draft task."""

    id: str
    text: str
    category: str


@dataclass(frozen=True)
class Draft:
    """A draft in memory, between draft and merge."""

    id: str
    category: str
    handler: str
    text: str
    usage: Usage


@dataclass(frozen=True)
class Item:
    """A reference to a published draft: the payload of one review task."""

    id: str
    category: str
    handler: str
    file: str


@dataclass(frozen=True)
class Review:
    """How one ticket's review loop ended."""

    item: Item
    gate_rounds: int
    gate_reports: list[str]
    stop: str
    usage: Usage


class GraphState(TypedDict, total=False):
    """The graph's state; the fan-outs' results are gathered with list addition."""

    tickets: list[Ticket]
    routed: list[Routed]
    route_usage: Usage
    drafts: Annotated[list[Draft], operator.add]
    items: list[Item]
    reviews: Annotated[list[Review], operator.add]


@dataclass
class Clock:
    """The end of the measured span (its start is the chat client's first request)."""

    finished_at: float | None = None


@dataclass
class TicketNodes:
    """The five nodes over one workspace, sharing one chat client and toolbox."""

    root: Path
    config: WorkspaceConfig
    chat: Chat
    clock: Clock = field(default_factory=Clock)

    def __post_init__(self) -> None:
        self.toolbox = Toolbox(self.root)
        self.fixed = layers.declared(Workspace(self.root))  # prompts and templates as read

    def route(self, state: GraphState) -> dict[str, Any]:
        """One model call classifies every ticket; unknown labels become other."""
        tickets = state["tickets"]
        if not tickets:
            return {"routed": [], "route_usage": Usage()}
        system = prompts.ROUTER.format(categories=", ".join(self.config.categories))
        answer = self.agent(system, prompts.router_input(tickets), [])
        labels = parse_routes(answer.text, self.config.categories)
        routed = [Routed(t.id, t.text, labels.get(t.id, OTHER)) for t in tickets]
        return {"routed": routed, "route_usage": answer.usage}

    def draft(self, ticket: Routed) -> dict[str, list[Draft]]:
        """The category's worker drafts a reply; other gets the template."""
        if ticket.category not in self.fixed.workers:
            text = self.fixed.templates[ticket.category].format_map(
                {"ticket_id": ticket.id, "category": ticket.category, "subject": "", "sender": ""}
            )
            return {"drafts": [Draft(ticket.id, ticket.category, TEMPLATE, text, Usage())]}
        answer = self.worker(ticket.category, prompts.draft_input(ticket.id, ticket.text))
        handler = f"worker:{ticket.category}"
        return {"drafts": [Draft(ticket.id, ticket.category, handler, answer.text, answer.usage)]}

    def merge(self, state: GraphState) -> dict[str, list[Item]]:
        """Write each draft to out/<id>.txt; pass on references only."""
        out = self.root / "out"
        out.mkdir(parents=True, exist_ok=True)
        items = []
        for d in sorted(state["drafts"], key=lambda d: d.id):
            (out / f"{d.id}.txt").write_text(d.text.strip() + "\n", encoding="utf-8")
            items.append(Item(d.id, d.category, d.handler, f"out/{d.id}.txt"))
        return {"items": items}

    def review(self, item: Item) -> dict[str, list[Review]]:
        """Gate the draft; while it fails, its worker rewrites it; stop on the four reasons."""
        path = self.root / item.file
        text = path.read_text(encoding="utf-8").strip()
        reports: list[str] = []
        usage = Usage()
        verdict = self.check(item.id, text)
        while not verdict.passed:
            reports.append(verdict.report)
            if stop := self.why_stop(item, reports):
                return {"reviews": [Review(item, len(reports) - 1, reports, stop, usage)]}
            task = prompts.rewrite_input(item.id, text, verdict.report)
            answer = self.worker(item.category, task)
            usage += answer.usage
            text = answer.text.strip()
            path.write_text(text + "\n", encoding="utf-8")
            verdict = self.check(item.id, text)
        return {"reviews": [Review(item, len(reports), reports, "gate_pass", usage)]}

    def report(self, state: GraphState) -> dict[str, Any]:
        """Write the report file; the measured span ends here."""
        path = self.root / REPORT_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report_json(state), indent=2) + "\n", encoding="utf-8")
        self.clock.finished_at = time.perf_counter()
        return {}

    def why_stop(self, item: Item, reports: list[str]) -> str | None:
        """Why the loop must stop before another rewrite, or None to rewrite."""
        if len(reports) - 1 >= self.config.gate.max_rounds:
            return "max_rounds"
        if len(reports) > 1 and reports[-1] == reports[-2]:
            return "no_progress"
        if item.handler == TEMPLATE or item.category not in self.fixed.workers:
            return "no_rewriter"
        return None

    def check(self, ticket_id: str, text: str) -> gate.GateResult:
        """ticketgraph's deterministic gate with the workspace's filler phrases."""
        return gate.check(ticket_id, text, self.config.gate.filler_phrases)

    def worker(self, category: str, task: str) -> Answer:
        """One run of the category's worker agent."""
        prompt = self.fixed.workers[category].prompt
        return self.agent(prompt, task, TOOLS_OF.get(category, []))

    def agent(self, system: str, task: str, tools: list[dict[str, Any]]) -> Answer:
        """The tool loop with the workspace's turn limit."""
        turns = self.config.harness.max_turns
        return run_tool_loop(self.chat, system, task, tools, self.toolbox, turns)


def parse_routes(text: str, categories: list[str]) -> dict[str, str]:
    """`<id>: <category>` lines only; a label outside `categories` becomes other."""
    found = {}
    for line in text.splitlines():
        if match := ROUTE_LINE.match(line):
            found[match[1]] = match[2] if match[2] in categories else OTHER
    return found


def to_drafts(state: GraphState) -> list[Send] | str:
    """One draft task per ticket (straight to merge when there is none)."""
    return [Send("draft", ticket) for ticket in state["routed"]] or "merge"


def to_reviews(state: GraphState) -> list[Send] | str:
    """One review task per published draft (straight to report when there is none)."""
    return [Send("review", item) for item in state["items"]] or "report"


def build_graph(nodes: TicketNodes, checkpointer: Any = None) -> CompiledStateGraph:
    """The plan of the run: route, fan out drafts, merge, fan out reviews, report (saved
    after every step by `checkpointer`, if given)."""
    graph = StateGraph(GraphState)
    graph.add_node("route", nodes.route)
    graph.add_node("draft", nodes.draft)
    graph.add_node("merge", nodes.merge)
    graph.add_node("review", nodes.review)
    graph.add_node("report", nodes.report)
    graph.add_edge(START, "route")
    graph.add_conditional_edges("route", to_drafts, ["draft", "merge"])
    graph.add_edge("draft", "merge")
    graph.add_conditional_edges("merge", to_reviews, ["review", "report"])
    graph.add_edge("review", "report")
    graph.add_edge("report", END)
    return graph.compile(checkpointer=checkpointer)


def node_usage(state: GraphState) -> dict[str, NodeUsage]:
    """Calls and tokens per node, as in the seed's table."""
    drafted = sum((d.usage for d in state.get("drafts", [])), Usage())
    reviews = state.get("reviews", [])
    reviewed = sum((r.usage for r in reviews), Usage())
    route = state.get("route_usage", Usage())
    return {
        "route": NodeUsage(route.calls, route.tokens),
        "fanout": NodeUsage(drafted.calls, drafted.tokens),
        "merge": NodeUsage(),
        "review": NodeUsage(reviewed.calls, reviewed.tokens, sum(r.gate_rounds for r in reviews)),
    }


def outcomes(state: GraphState) -> dict[str, TicketOutcome]:
    """Per ticket, in id order: category, handler, rounds, stop reason, status."""
    return {
        r.item.id: TicketOutcome(
            r.item.category,
            r.item.handler,
            r.gate_rounds,
            r.stop,
            PASS if r.stop == "gate_pass" else NEEDS_HUMAN,
        )
        for r in sorted(state.get("reviews", []), key=lambda r: r.item.id)
    }


def report_json(state: GraphState) -> dict[str, Any]:
    """The report file: node usage and per-ticket outcomes."""
    return {
        "nodes": {name: vars(node) for name, node in node_usage(state).items()},
        "tickets": {tid: vars(o) for tid, o in outcomes(state).items()},
    }


def load_inbox(inbox: Path) -> list[Ticket]:
    """The inbox's *.txt tickets in name order."""
    paths = sorted(inbox.glob("*.txt"))
    return [Ticket(p.stem, p.read_text(encoding="utf-8").strip()) for p in paths]


def provider_stats(http: httpx.Client) -> dict[str, Any] | None:
    """The scripted provider's /stats (beside /v1), or None when the endpoint has none."""
    try:
        response = http.get(http.base_url.join("/stats"))
        response.raise_for_status()
        return dict(response.json())
    except (httpx.HTTPError, ValueError):
        return None


def run(workspace: Path, base_url: str, pool: int, durable: bool = False) -> PeerResult:
    """Run the graph over the workspace's inbox against `base_url`; the measured result.
    `durable`: every step's state is saved before the next starts (see `_durable`)."""
    started = time.perf_counter()
    config = Workspace(workspace).config()
    tickets = load_inbox(workspace / "inbox")
    with http_client(base_url) as http:
        nodes = TicketNodes(workspace, config, Chat(http, config.harness.model))
        limits: dict[str, Any] = {"max_concurrency": pool, "recursion_limit": 50}
        if durable:
            state = asyncio.run(_durable(nodes, tickets, limits, workspace / CHECKPOINTS))
        else:
            state = build_graph(nodes).invoke({"tickets": tickets}, limits)
        stats = provider_stats(http)
    result = _result(state, nodes, started, len(tickets), pool, stats)
    if durable:
        result.peer = DURABLE_PEER
    return result


async def _durable(
    nodes: TicketNodes, tickets: list[Ticket], limits: dict[str, Any], path: Path
) -> GraphState:
    """The same graph with LangGraph's SQLite checkpointer (`AsyncSqliteSaver`) and
    durability "sync": each step's writes are committed before the next step starts, so a
    killed run resumes from its last step (the fair peer of a system that survives a crash).
    The sync nodes run on the event loop's thread pool, `max_concurrency` at a time."""
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
        graph = build_graph(nodes, saver)
        config = {**limits, "configurable": {"thread_id": "langgraph-peer"}}
        state = await graph.ainvoke({"tickets": tickets}, config, durability="sync")
    return state  # type: ignore[no-any-return]


def _result(
    state: GraphState,
    nodes: TicketNodes,
    started: float,
    tickets: int,
    pool: int,
    stats: dict[str, Any] | None,
) -> PeerResult:
    finished = nodes.clock.finished_at or time.perf_counter()
    first_call = nodes.chat.first_call_at or finished
    extra: dict[str, Any] = {"langgraph": metadata.version("langgraph")}
    if stats is not None:
        extra["provider"] = {k: stats.get(k) for k in ("requests", "max_in_flight")}
    return PeerResult(
        peer=PEER,
        tickets=tickets,
        pool=pool,
        wall_s=finished - first_call,
        total_s=finished - started,
        max_rss_mb=max_rss_mb(),
        exit_code=0,
        nodes=node_usage(state),
        outcomes=outcomes(state),
        extra=extra,
    )


def main(argv: list[str] | None = None) -> int:
    """Command line: run once and print the result (one JSON object with --json)."""
    parser = argparse.ArgumentParser(prog="python -m bench.peers.langgraph_peer")
    parser.add_argument("--workspace", type=Path, required=True, help="a ticketgraph workspace")
    parser.add_argument("--base-url", required=True, help="OpenAI-compatible base URL (…/v1)")
    parser.add_argument("--pool", type=int, default=16, help="max_concurrency (default: 16)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--durable",
        action="store_true",
        help="save every step with langgraph-checkpoint-sqlite (AsyncSqliteSaver, durability sync)",
    )
    args = parser.parse_args(argv)
    try:
        result = run(args.workspace, args.base_url, max(1, args.pool), args.durable)
    except (PeerError, OSError, ValueError) as exc:
        print(f"langgraph peer failed: {exc}", file=sys.stderr)
        return 1
    # From the CLI, total_s counts from process start: interpreter, imports, graph build.
    result.total_s = process_age_s() or result.total_s
    print(json.dumps(result.to_json()) if args.json else result.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
