"""The run as plain, serialisable data: the loop is a function over this and nothing else.

Because a run is data and not a closure, it can be saved after every step, killed, and
resumed in another process; approval and resume are the same code path (see `pending`).
"""

from __future__ import annotations

import uuid
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from workers import versions
from workers.fence import UNFENCED, Fence
from workers.usage import RunUsage


class AgentStatus(StrEnum):
    """Where an agent run is (the harness's run of one agent, not the graph's run): running,
    or one of its five exits."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    MAX_TURNS_EXCEEDED = "max_turns_exceeded"
    BUDGET_EXCEEDED = "budget_exceeded"
    INTERRUPTED = "interrupted"


class Interruption(BaseModel):
    """Why a run stopped short: approval needed, a cap hit, or a cancel."""

    # max_budget: this run's own cap; run_budget: the budget of the batch it is part of
    type: Literal["approval", "max_turns", "max_budget", "run_budget", "cancelled"]
    call_id: str | None = None
    tool: str | None = None
    args: Any = None
    reason: str | None = None


class FunctionCall(BaseModel):
    """The function part of a tool call, as the wire format carries it."""

    name: str
    arguments: str = "{}"


class ToolCall(BaseModel):
    """One tool call the model asked for."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(BaseModel):
    """One chat message in OpenAI's shape."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def wire(self) -> dict[str, Any]:
        """The message as the chat-completions API expects it."""
        return self.model_dump(exclude_none=True)


class RunState(BaseModel):
    """Everything a run is: transcript, counters, money, status and decisions."""

    version: int = 1
    run_id: str = Field(default_factory=lambda: f"h-{uuid.uuid4().hex[:12]}")
    model: str = "scripted"
    messages: list[Message] = []
    turns: int = 0
    usage: RunUsage = RunUsage()
    per_turn_prompt_tokens: list[int] = []
    cost_usd: float = 0.0
    tool_runs: int = 0
    status: AgentStatus = AgentStatus.RUNNING
    interruption: Interruption | None = None
    approved: list[str] = []
    rejected: dict[str, str] = {}
    started_calls: list[str] = []
    # Writes that started before a crash and left no result: they may or may not have
    # happened, and are never run again; a person should check them.
    unsure_calls: list[str] = []
    truncated: int = 0  # replies cut off (finish_reason length) so far; a second one fails
    provider_failed: bool = False  # it failed because the model endpoint did (exit 3)
    error: str | None = None
    retryable: bool = False  # a `failed` exit that asking again later may fix
    output: str | None = None

    def save(self, path: str | Path, durable: bool = True, fence: Fence = UNFENCED) -> None:
        """Persist as the file's newest version (workers/versions.py: one line appended,
        fsynced unless not `durable`), through `fence` (a superseded copy of a task gets
        `Superseded` and writes nothing)."""
        fence.append(path, self.model_dump_json(), durable=durable)

    @classmethod
    def load(cls, path: str | Path) -> RunState:
        """Read a state saved by `save` (its newest version)."""
        return versions.read(path, cls.model_validate_json)


def new_run(system: str, task: str, model: str = "scripted") -> RunState:
    """A fresh run with a system prompt and one user message."""
    return RunState(
        model=model,
        messages=[Message(role="system", content=system), Message(role="user", content=task)],
    )


def pending(state: RunState) -> list[ToolCall]:
    """Tool calls asked for in the last assistant message and not yet answered."""
    last_assistant = next((m for m in reversed(state.messages) if m.role == "assistant"), None)
    if last_assistant is None or not last_assistant.tool_calls:
        return []
    answered = {m.tool_call_id for m in state.messages if m.role == "tool"}
    return [c for c in last_assistant.tool_calls if c.id not in answered]


def distinct_ids(state: RunState, reply: Message) -> list[tuple[ToolCall, str]]:
    """Give each tool call of `reply` (a new assistant message) an id no other call of the
    run has: a model that reuses an id, in one reply or across turns, would otherwise leave
    a call unanswered (its id looks answered), and its approval, its start record and its
    idempotency key would be another call's. A reused `c1` becomes `c1-2` (then `c1-3`);
    the calls renamed, each with the id the model gave it."""
    seen = {c.id for m in state.messages if m.role == "assistant" for c in m.tool_calls or []}
    renamed = []
    for call in reply.tool_calls or []:
        if call.id in seen:
            given, n = call.id, 2
            while f"{given}-{n}" in seen:
                n += 1
            call.id = f"{given}-{n}"
            renamed.append((call, given))
        seen.add(call.id)
    return renamed


def retry(state: RunState, force: bool = False) -> bool:
    """Make a run that failed for a retryable reason (any failure if `force`) resumable;
    its paid turns are kept. False, and nothing changed, if there is nothing to retry."""
    if state.status is not AgentStatus.FAILED or not (state.retryable or force):
        return False
    state.status, state.error, state.retryable = AgentStatus.RUNNING, None, False
    return True


def approve(state: RunState, call_id: str) -> None:
    """Let a call that stopped the run for approval run on resume."""
    state.approved.append(call_id)


def reject(state: RunState, call_id: str, reason: str = "") -> None:
    """Decline a call; on resume the model is told so, in words."""
    state.rejected[call_id] = reason
