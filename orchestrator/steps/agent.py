"""Run one harness agent for a step: the graph calls the harness here and nowhere else."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis
from pydantic import BaseModel

from orchestrator.broker.timelimits import TIME_LIMIT
from orchestrator.config.workspace import DEMO_SCENARIOS
from orchestrator.coordination import budget, ratecap
from orchestrator.run import ids
from orchestrator.run.records import CANCELLED, RoleSettings, RunConfig, StepUsage
from orchestrator.run.store import ROUTER
from orchestrator.steps import approval as steps_approval
from orchestrator.steps.context import Context
from workers import loop
from workers.model.client import ModelClient, RequestParams
from workers.provider.cassette import MISS
from workers.settings import HarnessSettings
from workers.state import AgentStatus, Interruption, RunState, new_run
from workers.tools import Catalog, Tool, ToolScope
from workers.trace import Tracer

EXPIRED = "approval_expired"  # the stop of a ticket whose call expired undecided
NO_SCRIPT = "no script matched the request"  # what the scripted provider answers then
ROUTER_ROLE = "router"

_clients: dict[str, ModelClient] = {}
_clients_lock = threading.Lock()
# The settings object of the last call and its client: every task of a worker passes the
# same object (worker_llm), so most calls skip dumping it to JSON for the key (~30 us).
_last_client: tuple[HarnessSettings, ModelClient] | None = None


@dataclass
class AgentResult:
    """What a node needs from an agent run: the text, how it ended, and what it cost."""

    text: str | None
    status: AgentStatus
    error: str | None
    usage: StepUsage
    retryable: bool = False
    stopped_by: str | None = None  # why it stopped short (time_limit, approval_expired, ...)
    unsure_writes: list[str] = field(default_factory=list)  # interrupted writes: check them
    waiting: Interruption | None = None  # the call it stopped for, waiting for a person
    out_of_budget: bool = False  # a call was not started: the run's (or ticket's) budget
    cut_off: str | None = None  # the last reply's text when replies were cut off twice

    @property
    def stop(self) -> str:
        """The ticket's stop reason when this run did not produce an answer: its own cap
        (`max_turns`, `budget`), the task's `time_limit`, a call's `approval_expired`, or
        `worker_failed`."""
        if self.stopped_by in (TIME_LIMIT, EXPIRED):
            return self.stopped_by
        if self.stopped_by is not None and self.stopped_by.startswith(CANCELLED):
            return "cancelled"
        return {
            AgentStatus.MAX_TURNS_EXCEEDED: "max_turns",
            AgentStatus.BUDGET_EXCEEDED: "budget",
        }.get(self.status, "worker_failed")

    @property
    def ok(self) -> bool:
        """True if the agent completed with an answer."""
        return self.status is AgentStatus.COMPLETED and bool(self.text)


def run_agent(
    ctx: Context,
    role: str,
    system: str,
    task: str,
    state_path: Path,
    tracer: Tracer,
    tools: list[Tool] | None = None,
    scope: ToolScope | None = None,
    approval: Callable[[Tool, BaseModel, str], bool] | None = None,
) -> AgentResult:
    """Run (or resume from `state_path`) one agent of `role` (router, evaluator or a worker
    category) for a step; its state is saved after every step, through the step's fence (a
    superseded copy raises `Superseded`). The step's cancel token stops it at once, even
    mid-request or in a tool."""
    config = ctx.meta.config
    how = role_of(config, role)
    state = (
        RunState.load(state_path)
        if state_path.exists()
        else new_run(role_prompt(how, config) or system, task, how.model)
    )
    catalog = Catalog(tools or [])
    if scope is not None and (
        unapplied := steps_approval.bring_back(ctx, scope.ticket_id, state, catalog)
    ):
        return _unapplied(ctx, state, state_path, unapplied)
    harness = loop.Harness(
        client=shared_client(ctx.llm, ctx.redis),
        catalog=catalog,
        price=(config.prices or ctx.llm.prices).for_model(state.model),
        caps=loop.Caps(max_turns=how.max_turns, budget_usd=how.budget_usd),
        tracer=tracer.bind(agent_run_id=state.run_id),
        state_path=state_path,
        cancel=ctx.cancel,
        params=how.params,
        tool_call_text_fallback=config.tool_call_text_fallback,
        fence=ctx.store.fence,
        scope=scope or ToolScope(),
        approval=approval,
        meter=_meter(ctx, state_path),
    )
    state = loop.run(state, harness)
    stopped_by = (
        state.interruption.reason
        if state.status is AgentStatus.INTERRUPTED and state.interruption is not None
        else None
    )
    error = state.error or _stop_reason(state)
    if config.scripted and error and NO_SCRIPT in error:
        error += _no_script_hint(role)
    if error and MISS in error:  # a replayed run asked what its cassette does not hold
        from orchestrator.config.cassette import miss_sentence

        error = miss_sentence(error, state_path)
    return AgentResult(
        text=state.output,
        status=state.status,
        error=error,
        usage=StepUsage(
            calls=state.usage.requests,
            tokens=state.usage.total_tokens,
            cost_usd=state.cost_usd,
            estimated=state.usage.estimated_requests,
            waited=state.usage.waited_requests,
        ),
        retryable=state.retryable
        or stopped_by == TIME_LIMIT
        or _cancelled(stopped_by)
        or _run_budget(state),
        stopped_by=stopped_by,
        unsure_writes=list(state.unsure_calls),
        waiting=state.interruption if _waits(state) else None,
        out_of_budget=_run_budget(state),
        cut_off=_cut_off(state),
    )


def _meter(ctx: Context, state_path: Path) -> budget.RunMeter | None:
    """The run's budget ledger, for the calls of the ticket (or the router) the agent's
    state belongs to (`agents/<owner>.<step>.json`); None when the run has no budget."""
    config = ctx.meta.config
    if not budget.limits(config).any or ctx.redis is None:
        return None
    owner = ids.agent_of(state_path)[0]
    owner = "" if owner == ROUTER else owner
    return budget.RunMeter(ctx.redis, ctx.store, budget.limits(config), owner)


def _run_budget(state: RunState) -> bool:
    """Stopped by the run's budget, not its own: a higher `resume --budget` goes on."""
    return state.interruption is not None and state.interruption.type == "run_budget"


def _cut_off(state: RunState) -> str | None:
    """The text of the reply a run failed on for being cut off at max_tokens (twice): what
    a caller that can use part of an answer (the router's lines) still reads."""
    if state.status is not AgentStatus.FAILED or not state.truncated or not state.messages:
        return None
    last = state.messages[-1]
    return last.content if last.role == "assistant" and not last.tool_calls else None


def _waits(state: RunState) -> bool:
    stopped = state.status is AgentStatus.INTERRUPTED and state.interruption is not None
    return stopped and state.interruption.type == "approval"  # type: ignore[union-attr]


def _cancelled(stopped_by: str | None) -> bool:
    return stopped_by is not None and stopped_by.startswith(CANCELLED)


def _unapplied(
    ctx: Context, state: RunState, state_path: Path, unapplied: steps_approval.Unapplied
) -> AgentResult:
    """A decision that was not applied: the call waits for a person again, with the
    arguments it has now (saved in the agent's state, which a decision is checked against),
    or the call expired and the ticket ends `approval_expired`."""
    usage = StepUsage(calls=0, tokens=0, cost_usd=0.0)
    if unapplied.again is None:
        return AgentResult(None, AgentStatus.FAILED, unapplied.why, usage, stopped_by=EXPIRED)
    state.status, state.interruption = AgentStatus.INTERRUPTED, unapplied.again
    state.save(state_path, fence=ctx.store.fence)
    return AgentResult(None, AgentStatus.INTERRUPTED, unapplied.why, usage, waiting=unapplied.again)


@dataclass
class Role:
    """How one role's agent runs: model, request settings, limits and system prompt."""

    model: str
    params: RequestParams
    max_turns: int
    budget_usd: float | None
    prompt: str | None  # None: the built-in prompt


def _no_script_hint(role: str) -> str:
    """What to do when the workspace's scripted replies have none for a request of `role`."""
    whose = "the router's request" if role == ROUTER_ROLE else "this ticket"
    return (
        f" (the workspace's {DEMO_SCENARIOS} has no script for {whose}: "
        "`ticketgraph scenarios init` adds one to fill in for each ticket in inbox/; or set "
        "LLM_BASE_URL to answer with a real model)"
    )


def role_of(config: RunConfig, role: str) -> Role:
    """The settings of an agent run by its role: router, evaluator or a worker category.
    A role's own table ([harness.router], [workers.<category>]) wins; what it leaves unset
    is [harness]'s."""
    own: RoleSettings = config.workers.get(role) or config.roles.get(role, RoleSettings())
    if role == "router":
        max_tokens, temperature = config.router_max_tokens, config.router_temperature
        model, budget = config.router_model or config.model, config.agent_budget_usd
    elif role == "evaluator":
        max_tokens, temperature = config.evaluator_max_tokens, config.evaluator_temperature
        model, budget = config.evaluator_model or config.model, config.evaluator_budget_usd
    else:
        max_tokens, temperature = config.max_tokens, config.temperature
        model, budget = config.model, config.agent_budget_usd
    params = RequestParams(
        max_tokens=own.max_tokens or max_tokens,
        temperature=temperature if own.temperature is None else own.temperature,
        token_param=config.token_param,  # type: ignore[arg-type]
    )
    return Role(
        model=own.model or model,
        params=params,
        max_turns=own.max_turns or config.max_turns,
        budget_usd=own.agent_budget_usd or budget,
        # A worker's prompt is its caller's to give (steps/draft.py: its own, or an angle's).
        prompt=None if role in config.workers else own.prompt or None,
    )


def role_prompt(role: Role, config: RunConfig) -> str | None:
    """The role's own system prompt, with {categories} filled in (a router's)."""
    if role.prompt is None:
        return None
    return role.prompt.replace("{categories}", categories_text(config))


def categories_text(config: RunConfig) -> str:
    """The categories as the router is told them: each with its worker's description."""
    described = []
    for name in config.categories:
        worker = config.workers.get(name)
        about = worker.description if worker is not None else ""
        described.append(f"{name} ({about})" if about else name)
    return ", ".join(described)


def shared_client(llm: HarnessSettings, r: redis.Redis | None = None) -> ModelClient:
    """One model client per endpoint per process, shared by all tasks and threads.

    Creating an httpx client costs 30-60 ms here (it builds an SSL context), more than the
    rest of a short agent run; a shared one also keeps its connections warm. It is created
    lazily, so a prefork worker builds its own after the fork. With `r` (the broker's
    Redis) its requests wait under the endpoint's shared caps, if LLM_MAX_* set any.
    """
    global _last_client
    last = _last_client  # one read: another thread may replace it meanwhile
    if last is not None and last[0] is llm:  # the settings object of the last call
        return last[1]
    key = llm.model_dump_json()
    with _clients_lock:
        if key not in _clients:
            _clients[key] = ModelClient(llm, gate=ratecap.gate_for(r, llm))
        _last_client = (llm, _clients[key])
        return _clients[key]


def _stop_reason(state: RunState) -> str | None:
    if state.status is AgentStatus.COMPLETED:
        return None if state.output else "the agent completed with an empty answer"
    if state.interruption is not None and state.interruption.reason:
        if _run_budget(state):
            return state.interruption.reason
        if state.interruption.reason.startswith(CANCELLED):  # a person's words, as they are
            return state.interruption.reason
        return f"the agent stopped: {state.status.value} ({state.interruption.reason})"
    return f"the agent stopped: {state.status.value}"
