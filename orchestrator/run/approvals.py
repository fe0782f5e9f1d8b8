"""Tool calls that wait for a person, and the decisions on them, in the run folder:

    runs/<run>/approvals/<ticket>.<call>.json   the request: tool, arguments, their hash,
                                                when, the step it stopped
    runs/<run>/decisions/<ticket>.<call>.json   the decision: approved or not, by whom, when,
                                                why, the arguments' hash it was made for

A decision is a file created once (a second one for the same call is refused), from any
machine that sees the workspace, with or without workers or Redis; nothing waits in memory
for it, so one made before `resume`, or long after the run ended, counts the same. A policy
that approves a call by itself writes the same file, with `by = "policy"` and the rule.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from orchestrator.errors import UsageError
from orchestrator.run.store import RunStore
from workers.trace import now_iso

REQUESTS, DECISIONS = "approvals", "decisions"
_SAFE = re.compile(r"[A-Za-z0-9_-]{1,64}")


class Request(BaseModel):
    """A call that waits for a person."""

    run_id: str
    ticket: str
    call_id: str
    tool: str
    args: dict[str, Any]
    args_hash: str
    asked_at: str
    step: str


class Decision(BaseModel):
    """What a person (or a policy) decided about one call."""

    ticket: str
    call_id: str
    tool: str
    args_hash: str
    approved: bool
    by: str
    at: str
    reason: str = ""
    rule: str | None = None  # the policy's rule, when `by` is "policy"


def args_hash(arguments: str | dict[str, Any]) -> str:
    """A hash of a call's arguments as JSON with sorted keys (the same for the model's
    string and for its parsed value)."""
    value = json.loads(arguments or "{}") if isinstance(arguments, str) else arguments
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _name(ticket: str, call_id: str) -> str:
    safe = (
        call_id
        if _SAFE.fullmatch(call_id)
        else "h" + hashlib.sha1(call_id.encode()).hexdigest()[:16]
    )
    return f"{ticket}.{safe}.json"


def ask(store: RunStore, request: Request) -> None:
    """Record that a call waits for a person (through the task's fence)."""
    store.write(
        store.dir / REQUESTS / _name(request.ticket, request.call_id), request.model_dump_json()
    )


def request(store: RunStore, ticket: str, call_id: str) -> Request | None:
    """The waiting call `call_id` of `ticket`, if it waits."""
    path = store.dir / REQUESTS / _name(ticket, call_id)
    return Request.model_validate_json(path.read_bytes()) if path.exists() else None


def decision(store: RunStore, ticket: str, call_id: str) -> Decision | None:
    """The decision on a call, if one was made."""
    path = store.dir / DECISIONS / _name(ticket, call_id)
    return Decision.model_validate_json(path.read_bytes()) if path.exists() else None


def record(store: RunStore, made: Decision) -> Decision:
    """Write a decision, once: `UsageError` if the call was decided before (by anyone)."""
    path = store.dir / DECISIONS / _name(made.ticket, made.call_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    with store.fence.held():
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            earlier = decision(store, made.ticket, made.call_id)
            raise UsageError(_already(made, earlier)) from None
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(made.model_dump_json())
            handle.flush()
            os.fsync(handle.fileno())
    return made


def _already(made: Decision, earlier: Decision | None) -> str:
    if earlier is None:
        return f"call {made.call_id} of {made.ticket} was decided already"
    verdict = "approved" if earlier.approved else "rejected"
    who = f"by {earlier.by} at {earlier.at}"
    return f"call {made.call_id} of {made.ticket} was already {verdict} {who}"


def decide(
    store: RunStore,
    ticket: str,
    call_id: str | None,
    approved: bool,
    by: str,
    reason: str = "",
    current_hash: str | None = None,
) -> Decision:
    """A person's decision on the call `ticket` waits with (`call_id`, if it waits with
    several over time); `UsageError` for an unknown call, a second decision, or a call whose
    arguments changed since it was asked (`current_hash`: the agent's own copy's hash)."""
    waiting = waiting_of(store, ticket)
    if call_id is not None:
        waiting = [r for r in waiting if r.call_id == call_id]
    if not waiting and (earlier := _decided(store, ticket, call_id)) is not None:
        raise UsageError(_already(earlier, earlier))
    if not waiting:
        asked = f" call {call_id}" if call_id else " call"
        raise UsageError(
            f"run {store.run_id}: ticket {ticket} waits for no{asked} (ticketgraph pending)"
        )
    if len(waiting) > 1:
        ids = ", ".join(r.call_id for r in waiting)
        raise UsageError(f"ticket {ticket} waits with several calls ({ids}): name one with --call")
    asked = waiting[0]
    if current_hash is not None and current_hash != asked.args_hash:
        raise UsageError(
            f"call {asked.call_id} of {ticket}: its arguments changed since it was asked "
            "(the hash differs): decide it again with ticketgraph pending"
        )
    made = Decision(
        ticket=ticket,
        call_id=asked.call_id,
        tool=asked.tool,
        args_hash=asked.args_hash,
        approved=approved,
        by=by,
        at=now_iso(),
        reason=reason,
    )
    return record(store, made)


def _decided(store: RunStore, ticket: str, call_id: str | None) -> Decision | None:
    """The latest decision on a call of `ticket` (`call_id`, or any)."""
    folder = store.dir / DECISIONS
    if call_id is not None:
        return decision(store, ticket, call_id)
    found = [Decision.model_validate_json(p.read_bytes()) for p in folder.glob(f"{ticket}.*.json")]
    return max(found, key=lambda d: d.at, default=None)


def waiting_of(store: RunStore, ticket: str | None = None) -> list[Request]:
    """The run's calls (of `ticket`, or all) that wait for a decision, oldest first."""
    folder = store.dir / REQUESTS
    if not folder.is_dir():
        return []
    found = []
    for path in sorted(folder.glob(f"{ticket}.*.json" if ticket else "*.json")):
        asked = Request.model_validate_json(path.read_bytes())
        if (
            asked.ticket == (ticket or asked.ticket)
            and not (store.dir / DECISIONS / path.name).exists()
        ):
            found.append(asked)
    return sorted(found, key=lambda r: r.asked_at)


def pending(workspace: Path) -> list[Request]:
    """Every call that waits for a decision, in every run of the workspace, oldest first."""
    found: list[Request] = []
    for run_dir in sorted((workspace / "runs").glob("run-*")):
        if (run_dir / REQUESTS).is_dir():
            found += waiting_of(RunStore(run_dir))
    return sorted(found, key=lambda r: r.asked_at)


def age_s(request: Request, now: datetime | None = None) -> float:
    """How long the call has waited, in seconds."""
    asked = datetime.fromisoformat(request.asked_at.replace("Z", "+00:00"))
    return ((now or datetime.now(UTC)) - asked).total_seconds()


def current_hash(store: RunStore, ticket: str, call_id: str) -> str | None:
    """The hash of the arguments the call has in the ticket's own agent state now (None if
    no agent of the ticket stopped for it): what a decision is checked against."""
    for path in sorted((store.dir / "agents").glob(f"{ticket}.*.json")):
        state = json.loads(path.read_bytes())
        stopped = state.get("interruption") or {}
        if stopped.get("type") == "approval" and stopped.get("call_id") == call_id:
            return args_hash(stopped.get("args") or {})
    return None
