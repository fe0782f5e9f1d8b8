"""A minimal OpenAI-compatible agent for the peers: one shared client, a tool loop, two tools.

It is deliberately small and independent of `workers/` (the harness under test), so a peer
measures its framework, not ticketgraph's code: no persisted state, no budget, no retries.
The client is httpx's sync `Client`, shared by threads: on the 2-vCPU development machine,
1,668 requests at 16 in flight cost 2.3 s of CPU through it (threads) against 5.3 s through
`AsyncClient` (whose anyio-based pool costs about 3 ms of CPU per request), and with 50 ms
per request the async client's lanes fell into lockstep with the CPU: 10 s instead of 6.5 s.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from workers.model import pool_guard

Message = dict[str, Any]
ORDERS_FILE = "data/orders.json"
READ_TIMEOUT_S = 60.0

READ_FILE = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a text file under the workspace, e.g. kb/known-issues.md.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string", "description": "relative to the workspace"}},
            "required": ["path"],
        },
    },
}
LOOKUP_ORDER = {
    "type": "function",
    "function": {
        "name": "lookup_order",
        "description": "Look up billing facts of one order: amount, times charged, status, "
        "invoice title.",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string", "description": "e.g. A-77301"}},
            "required": ["order_id"],
        },
    },
}
TOOLS_OF = {"billing": [LOOKUP_ORDER], "bug": [READ_FILE]}


class PeerError(Exception):
    """A peer run that cannot go on: a failed request, a bad reply, too many turns."""


class ToolFailed(Exception):
    """A tool call the model got wrong; its message goes back to the model as data."""


@dataclass(frozen=True)
class Usage:
    """Model calls and the tokens the provider reported for them."""

    calls: int = 0
    tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.calls + other.calls, self.tokens + other.tokens)


@dataclass(frozen=True)
class Answer:
    """An agent's final text and what it cost."""

    text: str
    usage: Usage


def http_client(base_url: str) -> httpx.Client:
    """The shared, thread-safe client; its pool is unbounded so only the graph limits it.

    Its pool gets ticketgraph's guard against httpcore closing a connection it just gave a
    request (workers/model/pool_guard.py): without it the peer lost requests to `[Errno 9] Bad
    file descriptor` past about 420 in flight (section h), as ticketgraph's client did."""
    client = httpx.Client(
        base_url=base_url.rstrip("/") + "/",
        timeout=httpx.Timeout(READ_TIMEOUT_S, connect=5.0),
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
    )
    pool_guard.guard(client)
    return client


class Chat:
    """Chat completions over a shared client; remembers when the first request was issued."""

    def __init__(self, http: httpx.Client, model: str) -> None:
        self.http, self.model = http, model
        self.first_call_at: float | None = None

    def complete(self, messages: list[Message], tools: list[Message]) -> tuple[Message, Usage]:
        """The next assistant message and the usage the provider reported for it."""
        if self.first_call_at is None:
            self.first_call_at = time.perf_counter()
        body: dict[str, Any] = {"model": self.model, "messages": messages}
        if tools:
            body["tools"] = tools
        try:
            response = self.http.post("chat/completions", json=body)
            response.raise_for_status()
            data = response.json()
            usage = data.get("usage") or {}
            return data["choices"][0]["message"], Usage(1, _tokens(usage))
        except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
            raise PeerError(f"chat completion failed: {exc!r}") from exc


def _tokens(usage: dict[str, int]) -> int:
    total = usage.get("total_tokens")
    return (
        total
        if total is not None
        else usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0)
    )


class Toolbox:
    """The worker tools over one workspace: lookup_order (data/orders.json) and read_file."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    def run(self, call: Message) -> Message:
        """Run one tool call; a wrong call becomes an error text for the model."""
        function = call.get("function") or {}
        try:
            args = json.loads(function.get("arguments") or "{}")
            content = self._dispatch(function.get("name", ""), args)
        except (ToolFailed, ValueError, TypeError, OSError) as exc:
            content = f"error: {exc}"
        return {"role": "tool", "tool_call_id": call.get("id", ""), "content": content}

    def _dispatch(self, name: str, args: dict[str, Any]) -> str:
        if name == "lookup_order":
            return self.lookup_order(str(args["order_id"]))
        if name == "read_file":
            return self.read_file(str(args["path"]))
        raise ToolFailed(f"no tool named {name!r}")

    def lookup_order(self, order_id: str) -> str:
        """One order's row as JSON."""
        orders = json.loads((self.root / ORDERS_FILE).read_text(encoding="utf-8"))
        if order_id not in orders:
            raise ToolFailed(f"no order {order_id}; check the id as written in the ticket")
        return json.dumps(orders[order_id])

    def read_file(self, relative: str) -> str:
        """A text file under the workspace root."""
        path = (self.root / relative).resolve()
        if not path.is_relative_to(self.root):
            raise ToolFailed(f"{relative} is outside the workspace")
        return path.read_text(encoding="utf-8")


def run_agent(
    chat: Chat, system: str, task: str, tools: list[Message], toolbox: Toolbox, max_turns: int
) -> Answer:
    """Ask, run the tool calls, ask again; stop at the first text answer or at `max_turns`."""
    messages: list[Message] = [
        {"role": "system", "content": system},
        {"role": "user", "content": task},
    ]
    usage = Usage()
    for _ in range(max_turns):
        message, used = chat.complete(messages, tools)
        usage += used
        calls = message.get("tool_calls") or []
        if not calls:
            return Answer(message.get("content") or "", usage)
        messages.append(message)
        messages.extend(toolbox.run(call) for call in calls)
    raise PeerError(f"no answer after {max_turns} turns")
