"""One ticket's whole story, for its page: what it said, how it was routed, every agent run
(each turn's tokens and cost, each tool call's arguments, result and duration, the stop
reason), every gate round's report, the run's own reply (and whether out/ changed since),
the decisions made on it (a person's and the policy's), the writes its tools recorded, a
person's handling or audit, and the other runs that handled the same ticket id.

Read from the run folder, the same files as `status` and the report: the ticket's record,
its text under tickets/, its agents' states under agents/, approvals/ and decisions/, the
cancels, actions.jsonl, handled/ and audits/, and the run's trace (the lines that name the
ticket). Never out/ for the run's reply: a later run, or a person, may have replaced it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from orchestrator.config.workspace import Workspace
from orchestrator.people import effects, reply
from orchestrator.run import approvals, cancels, ids
from orchestrator.run import verdicts as kept
from orchestrator.run.records import Cancel, TicketRecord
from orchestrator.run.store import ROUTER, RunStore
from workers.state import RunState

MAX_TEXT = 200_000  # characters of a ticket, reply or tool result shown (the rest is cut)


@dataclass
class ToolCallView:
    """One tool call of an agent run."""

    call_id: str
    tool: str
    arguments: str
    result: str | None = None
    ms: float | None = None
    ok: bool | None = None


@dataclass
class TurnView:
    """One model turn: what it cost and how it ended."""

    turn: int
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float  # the agent run's cost after this turn
    finish: str


@dataclass
class AgentView:
    """One agent run of the ticket (its draft, a review round, ...)."""

    step: str
    status: str
    stop: str
    turns: list[TurnView] = field(default_factory=list)
    tools: list[ToolCallView] = field(default_factory=list)
    cost_usd: float = 0.0
    tokens: int = 0
    error: str | None = None
    output: str | None = None


@dataclass
class GateRound:
    """One round of the deterministic gate."""

    round: int
    passed: bool | None
    report: str


@dataclass
class DecisionView:
    """A call that waited for a person, and what was decided (None: still waiting)."""

    request: approvals.Request
    decision: approvals.Decision | None
    open: bool = False  # a person can decide it now
    note: str | None = None  # why it cannot be decided, or a decision file that does not count
    age_s: float = 0.0  # since it was asked
    expires_at: str = ""  # when it expires undecided ([approvals] expire_h after asked)
    rule: str | None = None  # what made it wait: the worker's approval rule for the tool


@dataclass
class Story:
    """Everything the ticket page shows."""

    ticket_id: str
    record: TicketRecord
    text: str | None
    reply: str | None
    reply_file: str | None
    routed: dict[str, Any] | None
    gate: list[GateRound]
    agents: list[AgentView]
    decisions: list[DecisionView]
    cancel: Cancel | None
    policy: list[approvals.Decision] = field(default_factory=list)  # made by the policy
    actions: list[str] = field(default_factory=list)  # the writes its tools recorded, in words
    out_changed: bool = False  # out/<ticket>.txt no longer holds the run's reply
    out_now: str | None = None  # what it holds instead (None: it holds the run's, or nothing)
    source_moved: bool = False  # the ticket's file is no longer where the run put it
    handled: kept.PersonVerdict | None = None
    audited: kept.PersonVerdict | None = None
    other_runs: list[str] = field(default_factory=list)  # runs with a record of this ticket id


def read(store: RunStore, workspace: Workspace, ticket_id: str) -> Story:
    """The story of `ticket_id` in the run (`RunStateError` if the id is not one)."""
    ids.ticket(ticket_id)
    record = store.ticket(ticket_id)
    events = trace_of(store.trace_path, ticket_id)
    reply_file, own, now = _reply(store, workspace, ticket_id, record)
    return Story(
        ticket_id=ticket_id,
        record=record,
        text=_text(store.ticket_path(ticket_id)),
        reply=own,
        reply_file=reply_file,
        routed=next((e for e in events if e.get("event") == "routed"), None),
        gate=_gate(record, events),
        agents=_agents(store, ticket_id, events),
        decisions=_decisions(store, ticket_id),
        cancel=cancels.of(store.dir, ticket_id),
        policy=_policy(store, ticket_id),
        actions=effects.recorded(store).get(ticket_id, []),
        out_changed=now is not None,
        out_now=now or None,
        source_moved=not (workspace.root / record.source).exists(),
        handled=kept.read(store, kept.HANDLED, ticket_id),
        audited=kept.read(store, kept.AUDITS, ticket_id),
        other_runs=_other_runs(workspace, store.run_id, ticket_id),
    )


def trace_of(path: Path, ticket_id: str) -> list[dict[str, Any]]:
    """The trace's events that name `ticket_id`, in order (a torn last line is skipped)."""
    needle = f'"ticket": {json.dumps(ticket_id)}'.encode()
    found = []
    try:
        with path.open("rb") as handle:
            for line in handle:
                if needle in line:
                    try:
                        found.append(json.loads(line))
                    except ValueError:
                        continue
    except FileNotFoundError:
        return []
    return found


def _text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")[:MAX_TEXT]
    except FileNotFoundError:
        return None


def _reply(
    store: RunStore, workspace: Workspace, ticket_id: str, record: TicketRecord
) -> tuple[str | None, str | None, str | None]:
    """The run's own reply (its last rewrite's, or its draft), where it was published, and
    what out/ holds instead when it changed since (a later run's reply, or a person's; ''
    when the file is gone), else None."""
    own = reply.final_text(store, ticket_id, record)
    if own is None:
        return None, None, None
    if record.file is None:
        return f"runs/{store.run_id} (not published by the run)", own[:MAX_TEXT], None
    published = _text(ids.out_file(workspace, ticket_id))
    if published is not None and published.strip() == own:
        return record.file, own[:MAX_TEXT], None
    return record.file, own[:MAX_TEXT], published or ""


def _policy(store: RunStore, ticket_id: str) -> list[approvals.Decision]:
    """The decisions on the ticket's calls that the approval policy made by itself (no
    person was asked, so no request file goes with them)."""
    found = []
    for path in sorted((store.dir / approvals.DECISIONS).glob(f"{ticket_id}.*.json")):
        try:
            made = approvals.Decision.model_validate_json(path.read_bytes())
        except (OSError, ValueError):
            continue
        if made.ticket == ticket_id and made.by == approvals.POLICY:
            found.append(made)
    return sorted(found, key=lambda d: d.at)


def _other_runs(workspace: Workspace, run_id: str, ticket_id: str) -> list[str]:
    """Every other run of the workspace that has a record of this ticket id, oldest first."""
    records = workspace.runs.glob(f"run-*/records/{ticket_id}.json")
    return sorted(p.parent.parent.name for p in records if p.parent.parent.name != run_id)


def _gate(record: TicketRecord, events: list[dict[str, Any]]) -> list[GateRound]:
    """Every gate round, from the trace (with its verdict) or else from the record."""
    rounds = [
        GateRound(int(e.get("round", i)), e.get("pass"), str(e.get("report") or ""))
        for i, e in enumerate(x for x in events if x.get("event") == "gate")
    ]
    if rounds:
        return rounds
    return [GateRound(i, None, report) for i, report in enumerate(record.gate_reports)]


def _agents(store: RunStore, ticket_id: str, events: list[dict[str, Any]]) -> list[AgentView]:
    """The ticket's agent runs, in the order they ran (the router's is not the ticket's)."""
    folder = store.dir / "agents"
    if ticket_id == ROUTER or not folder.is_dir():
        return []
    views = []
    for path in folder.glob(f"{ticket_id}.*.json"):
        step = path.name[len(ticket_id) + 1 : -len(".json")]
        if "." in step:  # another ticket's (an id may hold dots: T1 and T1.a)
            continue
        try:
            state = RunState.load(path)
        except (OSError, ValueError):
            views.append(AgentView(step=step, status="unreadable", stop=f"cannot read {path.name}"))
            continue
        views.append(
            _agent(step, state, [e for e in events if e.get("agent_run_id") == state.run_id])
        )
    return sorted(views, key=_ran_order)


def _ran_order(view: AgentView) -> tuple[int, int, str]:
    """draft, then each round's runs (evaluate-N before review-N), rounds by number."""
    name, _, number = view.step.rpartition("-")
    if view.step == "draft" or view.step.startswith("draft-"):  # a draft, or an angle's
        return (0, 0, view.step)
    if number.isdigit():
        return (1, int(number), name)
    return (2, 0, view.step)


def _agent(step: str, state: RunState, events: list[dict[str, Any]]) -> AgentView:
    results = {m.tool_call_id: m.content for m in state.messages if m.role == "tool"}
    timing = {e.get("call_id"): e for e in events if e.get("event") == "tool_result"}
    tools = []
    for message in state.messages:
        for call in message.tool_calls or []:
            timed = timing.get(call.id, {})
            tools.append(
                ToolCallView(
                    call_id=call.id,
                    tool=call.function.name,
                    arguments=call.function.arguments,
                    result=(results.get(call.id) or None) and str(results[call.id])[:MAX_TEXT],
                    ms=timed.get("ms"),
                    ok=timed.get("ok"),
                )
            )
    turns = [
        TurnView(
            turn=int(e.get("turn", 0)),
            prompt_tokens=int(e.get("prompt_tokens") or 0),
            completion_tokens=int(e.get("completion_tokens") or 0),
            cost_usd=float(e.get("cost_usd") or 0.0),
            finish=str(e.get("finish") or ""),
        )
        for e in events
        if e.get("event") == "turn"
    ]
    stopped = next((e for e in reversed(events) if e.get("event") == "run_stopped"), None)
    stop = state.status.value
    if state.interruption is not None:
        stop = f"{stop}: {state.interruption.type}"
    elif stopped is not None and stopped.get("detail"):
        stop = f"{stop}: {stopped['detail']}"
    return AgentView(
        step=step,
        status=state.status.value,
        stop=stop,
        turns=turns,
        tools=tools,
        cost_usd=state.cost_usd,
        tokens=state.usage.prompt_tokens + state.usage.completion_tokens,
        error=state.error,
        output=state.output,
    )


def _decisions(store: RunStore, ticket_id: str) -> list[DecisionView]:
    """Every call of the ticket that asked for a person, with the decision that counts if
    one was made, and whether a person can decide it now (and if not, why not)."""
    open_calls = {s.request.call_id for s in approvals.waiting_of(store, ticket_id)}
    config = store.meta().config
    expire = approvals.expire_s(config)
    worker = config.workers.get(store.record(ticket_id).category or "")
    views = []
    for asked in approvals.requests_of(store, ticket_id):
        found = approvals.standing(store, asked, expire)
        view = DecisionView(asked, found.decided, asked.call_id in open_calls, _note(found))
        view.age_s = approvals.age_s(asked)
        asked_at = datetime.fromisoformat(asked.asked_at.replace("Z", "+00:00"))
        expires = asked_at + timedelta(seconds=expire)
        view.expires_at = expires.isoformat(timespec="seconds").replace("+00:00", " UTC")
        view.rule = worker.approval.get(asked.tool) if worker is not None else None
        views.append(view)
    return sorted(views, key=lambda v: v.request.asked_at)


def _note(found: approvals.Standing) -> str | None:
    if found.decided is not None:
        return None
    if found.expired:
        return "it expired undecided ([approvals] expire_h) and can no longer be decided"
    if found.void is not None:
        return f"its decision file does not count ({found.void})"
    return None
