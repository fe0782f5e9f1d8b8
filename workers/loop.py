"""The agent loop: one function over a `RunState`, five exits, each set where it happens.

Every iteration first answers tool calls still pending in the transcript and only asks the
model when nothing is pending, so a fresh run, a resumed run and an approved run take the
same path. State is saved after every step; a killed run resumes without paying twice.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from workers import effects
from workers.cancel import CancelToken
from workers.errors import Cancelled, PermanentToolError, ProviderError, ToolError
from workers.fence import UNFENCED, Fence
from workers.meter import Hold, Meter, OverBudget, worst_case
from workers.model import textcalls
from workers.model.client import ModelClient, ModelReply, RequestParams
from workers.pricing import Price, cost
from workers.state import (
    AgentStatus,
    Interruption,
    Message,
    RunState,
    ToolCall,
    distinct_ids,
    pending,
)
from workers.tools import Catalog, Tool, ToolContext, ToolScope
from workers.trace import Tracer


class ToolErrors(StrEnum):
    """What the model is told when a tool fails."""

    TEXT = "text"  # "Error: <message>" — the model can act on it
    BARE = "bare"  # "Error" — caught, but the model learns nothing
    FATAL = "fatal"  # the run stops `failed`


@dataclass
class Caps:
    """Caps checked before every model call; None means no cap."""

    max_turns: int | None = 20
    budget_usd: float | None = None


@dataclass
class Harness:
    """Everything one run needs besides its state."""

    client: ModelClient
    catalog: Catalog
    price: Price = field(default_factory=Price)
    caps: Caps = field(default_factory=Caps)
    tool_errors: ToolErrors = ToolErrors.TEXT
    permanent_errors_stop: bool = True
    dedupe: bool = False
    tracer: Tracer = field(default_factory=lambda: Tracer(None, ""))
    cancel: CancelToken = field(default_factory=CancelToken)
    state_path: Path | None = None
    # A reply whose text is a tool call (small models, servers without a tool-call parser)
    # is run as that call; the trace says `parsed_from_text`.
    tool_call_text_fallback: bool = True
    params: RequestParams | None = None  # max_tokens, temperature
    # Every save goes through it, and it is checked before every model call: a copy of the
    # task that was superseded (see fence.py) stops there with `Superseded`.
    fence: Fence = UNFENCED
    # The ticket, files and effects log every tool call of this run sees (ToolContext).
    scope: ToolScope = field(default_factory=ToolScope)
    # Whether a call may run without a person (tool, its arguments, the call id): the
    # caller's approval policy, which may approve it itself. None: the tools' own flags.
    approval: Callable[[Tool, BaseModel, str], bool] | None = None
    # Where the call's money is held before it starts and settled after (a run's budget
    # across every worker); None: only `caps.budget_usd`, this run's own.
    meter: Meter | None = None


def run(state: RunState, h: Harness) -> RunState:
    """Drive `state` to one of the five exits; calling it again on a stopped run resumes it."""
    if state.status in (AgentStatus.COMPLETED, AgentStatus.FAILED):
        return state
    state.status, state.interruption, state.provider_failed = AgentStatus.RUNNING, None, False
    while True:
        if h.cancel.cancelled:
            return _cancelled(state, h)
        if calls := pending(state):
            if (stopped := _drain(state, h, calls)) is not None:
                return stopped
            continue
        if (answer := _final_answer(state)) is not None:
            saved = state.status is AgentStatus.COMPLETED  # with its last turn (_record_reply)
            state.output = answer
            return _stop(state, h, AgentStatus.COMPLETED, save=not saved)
        if h.caps.max_turns is not None and state.turns >= h.caps.max_turns:
            return _stop(state, h, AgentStatus.MAX_TURNS_EXCEEDED, Interruption(type="max_turns"))
        if h.caps.budget_usd is not None and state.cost_usd >= h.caps.budget_usd:
            return _stop(state, h, AgentStatus.BUDGET_EXCEEDED, Interruption(type="max_budget"))
        h.fence.check()  # a superseded copy must not pay for another turn
        schemas = h.catalog.schemas()
        try:
            hold = _hold(state, h, schemas)
        except OverBudget as exc:
            interruption = Interruption(type="run_budget", reason=str(exc))
            return _stop(state, h, AgentStatus.BUDGET_EXCEEDED, interruption)
        try:
            reply = h.client.complete(
                state.model,
                state.messages,
                schemas,
                cancel=h.cancel,
                params=h.params,
                on_wait=lambda cap: _waiting(h, cap),
            )
        except Cancelled:
            _release(h, hold)
            return _cancelled(state, h)
        except ProviderError as exc:
            _release(h, hold)
            state.retryable, state.provider_failed = exc.retryable, True
            return _stop(state, h, AgentStatus.FAILED, error=str(exc))
        except BaseException:
            _release(h, hold)
            raise
        _record_reply(state, h, reply, hold)
        if reply.finish_reason in TRUNCATED and not reply.message.tool_calls:
            if state.truncated:
                error = (
                    f"truncated: the reply was cut off twice (finish_reason {reply.finish_reason})"
                )
                return _stop(state, h, AgentStatus.FAILED, error=error)
            state.truncated += 1
            state.messages.append(Message(role="user", content=TRUNCATED_NOTE))
            _save(state, h)


def _waiting(h: Harness, cap: str | None) -> None:
    """Trace a request's wait for the endpoint's shared caps: where the run's command
    learns, as it waits, how many requests wait and since when."""
    if cap is None:
        h.tracer.emit("cap_admitted")
    else:
        h.tracer.emit("cap_wait", cap=cap)


def _final_answer(state: RunState) -> str | None:
    last = state.messages[-1] if state.messages else None
    if last is not None and last.role == "assistant" and not last.tool_calls:
        return last.content or ""
    return None


TRUNCATED = ("length", "max_tokens")
TRUNCATED_NOTE = (
    "Your last reply was cut off before it ended. Answer again, completely and more briefly."
)


def _hold(state: RunState, h: Harness, schemas: list[dict[str, Any]]) -> Hold | None:
    """Hold the call's worst case with the meter (`OverBudget` if it cannot be covered)."""
    if h.meter is None:
        return None
    max_tokens = h.params.max_tokens if h.params is not None else None
    worst = worst_case(state.messages, schemas, max_tokens, h.price)
    hold = h.meter.hold(worst)
    h.tracer.emit(
        "reserved",
        usd=round(worst.usd, 9),
        prompt_tokens=worst.prompt_tokens,
        reply_tokens=worst.reply_tokens,
    )
    return hold


def _release(h: Harness, hold: Hold | None) -> None:
    if hold is not None:
        hold.release()
        h.tracer.emit("released")


def _record_reply(state: RunState, h: Harness, reply: ModelReply, hold: Hold | None) -> None:
    if h.tool_call_text_fallback and not reply.message.tool_calls:
        known = set(h.catalog.by_name)
        if calls := textcalls.parse(reply.message.content, known, state.turns):
            reply.message = Message(role="assistant", content=None, tool_calls=calls)
            for call in calls:
                h.tracer.emit(
                    "tool_call_parsed",
                    tool=call.function.name,
                    call_id=call.id,
                    parsed_from_text=True,
                )
    for call, given in distinct_ids(state, reply.message):
        h.tracer.emit("tool_call_id_reused", tool=call.function.name, call_id=call.id, given=given)
    # Money first: the turn is paid the moment the reply exists.
    paid = cost(reply.usage, h.price)
    if hold is not None:  # before the save: a crash between them pays again, and counts it
        hold.settle(paid, reply.usage)
        h.tracer.emit("settled", usd=round(paid, 9), **_estimated(reply))
    state.cost_usd += paid
    state.usage.add(reply.usage)
    state.turns += 1
    state.per_turn_prompt_tokens.append(reply.usage.prompt_tokens)
    state.messages.append(reply.message)
    if reply.finish_reason not in TRUNCATED and (answer := _final_answer(state)) is not None:
        # The run ends on this turn: one save holds the turn and the exit, not two files.
        state.status, state.interruption, state.error = AgentStatus.COMPLETED, None, None
        state.output = answer
    _save(state, h)
    h.tracer.emit(
        "turn",
        turn=state.turns,
        prompt_tokens=reply.usage.prompt_tokens,
        completion_tokens=reply.usage.completion_tokens,
        total_tokens=reply.usage.total_tokens,
        cost_usd=round(state.cost_usd, 8),
        finish=reply.finish_reason,
        **_estimated(reply),
    )


def _estimated(reply: ModelReply) -> dict[str, bool]:
    return {"estimated": True} if reply.usage.estimated else {}


def _drain(state: RunState, h: Harness, calls: list[ToolCall]) -> RunState | None:
    """Answer pending calls in order; return the state if one of them stops the run."""
    for call in calls:
        if h.cancel.cancelled:
            return _cancelled(state, h)
        try:
            result = _answer(state, h, call)
        except _Stop as stop:
            return stop.state
        state.messages.append(
            Message(role="tool", tool_call_id=call.id, name=call.function.name, content=result)
        )
        _save(state, h, durable=not _read_only(h, call))
    return None


def _read_only(h: Harness, call: ToolCall) -> bool:
    tool = h.catalog.by_name.get(call.function.name)
    return tool is not None and tool.read_only


class _Stop(Exception):
    """Unwinds `_answer` when a call ends the run (approval, cancel, fatal error)."""

    def __init__(self, state: RunState) -> None:
        self.state = state


def _answer(state: RunState, h: Harness, call: ToolCall) -> str:
    """The text that goes into the transcript for `call`, whatever the code decided."""
    name, arguments = call.function.name, call.function.arguments
    if call.id in state.rejected:
        reason = state.rejected[call.id]
        h.tracer.emit(
            "tool_result", tool=name, call_id=call.id, ms=0, ok=False, decision="rejected"
        )
        because = f" Their reason: {reason}" if reason else ""
        return f"A human reviewer declined this call to {name}; it was not run.{because}"
    try:
        tool = h.catalog.get(name)
        args = tool.parse(arguments)
    except ToolError as exc:
        return _tool_failed(state, h, call, exc)
    key = effects.idempotency_key(
        h.scope.key_base, effects.place(state, call), name, args.model_dump()
    )
    # Before approval: a write the ledger answers does not run, so nobody needs to decide it.
    if not tool.read_only and (answered := _written_before(state, h, call, tool, key)) is not None:
        return answered
    if call.id not in state.approved and not _may_run(h, tool, args, call):
        h.tracer.emit("approval_required", tool=name, args=arguments, call_id=call.id)
        interruption = Interruption(
            type="approval", call_id=call.id, tool=name, args=args.model_dump()
        )
        raise _Stop(_stop(state, h, AgentStatus.INTERRUPTED, interruption))
    if h.dedupe and tool.read_only and (earlier := _earlier_result(state, call)) is not None:
        h.tracer.emit("tool_result", tool=name, call_id=call.id, ms=0, ok=True, deduped=True)
        return earlier
    return _execute(state, h, call, tool, args, key)


def _written_before(
    state: RunState, h: Harness, call: ToolCall, tool: Tool, key: str
) -> str | None:
    """What a write that was made before says now: its recorded result (the ledger has its
    outcome), or that it may have happened (it was cut off, and is not safe to repeat);
    None when it runs (for the first time, or again with the same key: `idempotent`)."""
    earlier = h.scope.ledger.get(key) if h.scope.ledger is not None else None
    if earlier is not None and earlier.done:
        h.tracer.emit(
            "write_from_ledger", tool=tool.name, call_id=call.id, key=key, made_by=earlier.run_id
        )
        return earlier.outcome.result  # type: ignore[union-attr]
    cut_off = call.id in state.started_calls or (earlier is not None and earlier.cut_off)
    if cut_off and tool.idempotent:
        h.tracer.emit("write_repeated", tool=tool.name, call_id=call.id, key=key)
        return None
    if not cut_off:
        return None
    # A write that started before a crash may have happened; running it again might do it twice.
    if call.id not in state.unsure_calls:
        state.unsure_calls.append(call.id)
    h.tracer.emit("write_unsure", tool=tool.name, call_id=call.id, key=key)
    return (
        f"Error: an earlier attempt of this {tool.name} call was interrupted before its result "
        "was recorded; it may have taken effect. Check before calling it again."
    )


def _may_run(h: Harness, tool: Tool, args: BaseModel, call: ToolCall) -> bool:
    """Whether `call` may run without a person's decision: the caller's policy says (it may
    approve the call itself, and record that), else the tool's own `needs_approval` flag."""
    if h.approval is None:
        return not tool.needs_approval
    return h.approval(tool, args, call.id)


def _execute(
    state: RunState, h: Harness, call: ToolCall, tool: Tool, args: BaseModel, key: str
) -> str:
    ledger = h.scope.ledger if not tool.read_only else None
    if not tool.read_only:
        if call.id not in state.started_calls:
            state.started_calls.append(call.id)
        _save(state, h)
    if ledger is not None:
        ledger.intend(key, tool.name, args.model_dump(), call.id, tool.idempotent)
    h.tracer.emit(
        "tool_start",
        tool=tool.name,
        args=call.function.arguments,
        call_id=call.id,
        key=key,
        pid=os.getpid(),
    )
    started = time.perf_counter()
    ctx = ToolContext(
        cancel=h.cancel,
        progress=_progress(h, tool.name, call.id),
        budget_left=_budget_left(state, h),
        charge=lambda usd: _charge(state, usd),
        tracer=h.tracer,
        model=state.model,
        call_id=call.id,
        idempotency_key=key,
        ticket_id=h.scope.ticket_id,
        files=h.scope.files,
        record=h.scope.record,
    )
    try:
        result = tool.run(args, ctx)
    except Cancelled:
        raise _Stop(_cancelled(state, h)) from None
    except Exception as exc:
        state.tool_runs += 1
        if ledger is not None:
            ledger.settle(key, ok=False, result=f"Error: {exc}")
        _emit_result(h, call, tool.name, started, ok=False, error=str(exc))
        return _tool_failed(state, h, call, exc)
    state.tool_runs += 1
    if ledger is not None:
        ledger.settle(key, ok=True, result=result)
    _emit_result(h, call, tool.name, started, ok=True)
    return result


def _emit_result(h: Harness, call: ToolCall, name: str, started: float, **data: object) -> None:
    ms = round((time.perf_counter() - started) * 1000, 2)
    h.tracer.emit("tool_result", tool=name, call_id=call.id, ms=ms, **data)


def _progress(h: Harness, tool: str, call_id: str) -> Callable[[str], None]:
    return lambda label: h.tracer.emit("tool_progress", tool=tool, call_id=call_id, label=label)


def _budget_left(state: RunState, h: Harness) -> float | None:
    if h.caps.budget_usd is None:
        return None
    return max(h.caps.budget_usd - state.cost_usd, 0.0)


def _charge(state: RunState, usd: float) -> None:
    # Money a tool spent on our behalf (a sub-agent's turns) is this run's money too.
    state.cost_usd += usd


def _tool_failed(state: RunState, h: Harness, call: ToolCall, exc: Exception) -> str:
    """Turn a tool failure into transcript text, or stop the run if policy says so."""
    permanent = isinstance(exc, PermanentToolError) and h.permanent_errors_stop
    if permanent or h.tool_errors is ToolErrors.FATAL:
        kind = "permanent tool error" if permanent else "tool error"
        state.messages.append(
            Message(
                role="tool", tool_call_id=call.id, name=call.function.name, content=f"Error: {exc}"
            )
        )
        raise _Stop(
            _stop(state, h, AgentStatus.FAILED, error=f"{kind} in {call.function.name}: {exc}")
        )
    return "Error" if h.tool_errors is ToolErrors.BARE else f"Error: {exc}"


def _earlier_result(state: RunState, call: ToolCall) -> str | None:
    """The result of an earlier call with the same tool and arguments, if the transcript has one."""
    key = (call.function.name, call.function.arguments)
    same = {
        c.id
        for m in state.messages
        if m.role == "assistant" and m.tool_calls
        for c in m.tool_calls
        if c.id != call.id and (c.function.name, c.function.arguments) == key
    }
    answers = (m.content for m in state.messages if m.role == "tool" and m.tool_call_id in same)
    return next(answers, None)


def _cancelled(state: RunState, h: Harness) -> RunState:
    reason = h.cancel.reason or "cancelled"
    return _stop(state, h, AgentStatus.INTERRUPTED, Interruption(type="cancelled", reason=reason))


def _stop(
    state: RunState,
    h: Harness,
    status: AgentStatus,
    interruption: Interruption | None = None,
    error: str | None = None,
    save: bool = True,
) -> RunState:
    """Set the exit as data, persist it (unless saved already: `save`), and trace why the
    run stopped."""
    state.status, state.interruption, state.error = status, interruption, error
    if status is not AgentStatus.COMPLETED:  # an answer that came as it was cancelled, say:
        state.output = None  # only a completed run has an output (a resume completes it)
    if save:  # a resume finds the same exit again from the transcript
        _save(state, h, durable=False)
    reason = interruption.type if interruption else (error or status.value)
    h.tracer.emit(
        "run_stopped",
        status=status.value,
        reason=reason,
        detail=interruption.reason if interruption else None,
        turns=state.turns,
        cost_usd=round(state.cost_usd, 8),
    )
    return state


def _save(state: RunState, h: Harness, durable: bool = True) -> None:
    """Persist the state after a step. Money and side effects are made durable (a paid
    turn, a write tool's start and result); what a resume can derive again is written
    without an fsync (a read-only tool's result, the stop reason): still atomic, and it
    survives a killed process, only an OS crash can take it back."""
    if h.state_path is not None:
        state.save(h.state_path, durable=durable, fence=h.fence)
