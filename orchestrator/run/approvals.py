"""Tool calls that wait for a person, and the decisions on them, in the run folder:

    runs/<run>/approvals/<ticket>.<call>.json   the request: tool, arguments, their hash,
                                                when, the step it stopped
    runs/<run>/decisions/<ticket>.<call>.json   the decision: approved or not, by whom, when,
                                                why, the arguments' hash it was made for
    runs/<run>/decisions/void/<ticket>.<call>.<n>.json
                                                decision files that did not count, set aside

A decision is a file created once (a second one for the same call is refused), from any
machine that sees the workspace, with or without workers or Redis; nothing waits in memory
for it, so one made before `resume`, or long after the run ended, counts the same. A policy
that approves a call by itself writes the same file, with `by = "policy"` and the rule.

A decision file counts only if it decides the call as it was asked: made by a person (a
policy never decides a call its rule sent to a person), for the request's arguments (the
same hash), before the call expired (`[approvals] expire_h` after it was asked). One that
does not count is ignored (the call still waits, and `pending` says why) and set aside when
the call is decided again. A person's decision counts only if it is signed with a key the
workspace trusts (run/signing.py): one written or edited by hand does not. A policy's
approval is a record, never an authority: the worker applies the rule itself, and a file
that says the policy decided a call the rule sends to a person does not count.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ValidationError

from orchestrator.errors import RunStateError, UsageError
from orchestrator.run import signing
from orchestrator.run.records import RunConfig, TicketStatus
from orchestrator.run.store import RunStore
from orchestrator.run.workspace import Workspace
from workers import effects, versions
from workers.trace import now_iso

REQUESTS, DECISIONS, VOID = "approvals", "decisions", "void"
POLICY = "policy"  # the `by` of a decision the approval policy made by itself
_SAFE = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _when(stamp: str) -> datetime:
    """An ISO time as written here (`Z` for UTC; one without a zone is taken as UTC)."""
    when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _a_time(stamp: str) -> str:
    _when(stamp)  # a ValueError here fails the file's validation: it cannot be read
    return stamp


Stamp = Annotated[str, AfterValidator(_a_time)]


class Request(BaseModel):
    """A call that waits for a person."""

    run_id: str
    ticket: str
    call_id: str
    tool: str
    args: dict[str, Any]
    args_hash: str
    asked_at: Stamp
    step: str


class Decision(BaseModel):
    """What a person (or a policy) decided about one call."""

    ticket: str
    call_id: str
    tool: str
    args_hash: str
    approved: bool
    by: str
    at: Stamp
    reason: str = ""
    rule: str | None = None  # the policy's rule, when `by` is "policy"
    run_id: str = ""
    key_id: str | None = None  # the signer's key (run/signing.py); a person's decisions only
    signature: str | None = None


@dataclass
class Standing:
    """Where an asked call stands: the decision that counts, if one does; a decision file
    that does not, and why; whether it is past its expiry undecided."""

    request: Request
    decided: Decision | None = None
    void: str | None = None
    expired: bool = False


args_hash = effects.args_hash  # one hash of a call's arguments: decisions' and the ledger's


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
    """The request of call `call_id` of `ticket`, if there is one and it can be read."""
    path = store.dir / REQUESTS / _name(ticket, call_id)
    try:
        return Request.model_validate_json(path.read_bytes())
    except (FileNotFoundError, ValidationError):
        return None


def decision(store: RunStore, ticket: str, call_id: str) -> Decision | None:
    """The decision file on a call, if there is one and it can be read (whether it counts
    is `standing`'s to say)."""
    path = store.dir / DECISIONS / _name(ticket, call_id)
    try:
        return Decision.model_validate_json(path.read_bytes())
    except (FileNotFoundError, ValidationError):
        return None


def expire_s(config: RunConfig) -> float:
    """How long a call of the run may wait undecided, in seconds (`[approvals] expire_h`)."""
    return config.approval_expire_h * 3600


def standing(store: RunStore, asked: Request, expire: float) -> Standing:
    """Whether `asked` was decided by a decision that counts, and if not, why not."""
    path = store.dir / DECISIONS / _name(asked.ticket, asked.call_id)
    found = Standing(asked, expired=age_s(asked) > expire)
    if not path.exists():
        return found
    made = decision(store, asked.ticket, asked.call_id)
    found.void = "it cannot be read" if made is None else _flaw(asked, made, expire)
    if made is not None and found.void is None:
        found.void = _unsigned(store, asked, made)
    if found.void is None:
        found.decided, found.expired = made, False
    return found


def _flaw(asked: Request, made: Decision, expire: float) -> str | None:
    """Why the decision `made` does not decide `asked`, or None if it does."""
    if (made.ticket, made.call_id, made.tool) != (asked.ticket, asked.call_id, asked.tool):
        return f"it names another call ({made.ticket} {made.call_id} {made.tool})"
    if made.by == POLICY:
        return "it says the policy decided, but the policy sends this call to a person"
    if made.args_hash != asked.args_hash:
        return "it was made for other arguments (its hash is not the call's)"
    if age_s(asked, _when(made.at)) > expire:
        return f"it was made after the call expired ({expire / 3600:g} h undecided)"
    return None


def _unsigned(store: RunStore, asked: Request, made: Decision) -> str | None:
    """Why a person's decision was not made by someone the workspace trusts, or None."""
    if made.run_id != asked.run_id:
        return f"it names another run ({made.run_id or 'none'})"
    return signing.flaw(store.workspace, made.model_dump())


def set_aside(store: RunStore, ticket: str, call_id: str, why: str) -> None:
    """Move the decision file on a call that did not count to decisions/void/ (kept, with
    why in the trace), so the call can be decided again."""
    path = store.dir / DECISIONS / _name(ticket, call_id)
    if not path.exists():
        return
    folder = store.dir / DECISIONS / VOID
    folder.mkdir(parents=True, exist_ok=True)
    stem = path.name.removesuffix(".json")
    with store.fence.held():
        for n in range(1, 1000):
            aside = folder / f"{stem}.{n}.json"
            try:
                os.link(path, aside)  # never over an earlier one
            except FileExistsError:
                continue
            except FileNotFoundError:
                return  # set aside already (by whoever decided it meanwhile)
            os.unlink(path)
            break
    kept = f"{DECISIONS}/{VOID}/{aside.name}"
    store.tracer(node="approval", ticket=ticket).emit(
        "decision_set_aside", call_id=call_id, why=why, kept=kept
    )


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
) -> Decision:
    """A person's decision on the call `ticket` waits with (`call_id`: that call); a
    decision file on it that does not count is set aside first. `UsageError` for an unknown,
    decided or expired call, or one whose arguments changed since it was asked: that one is
    asked again with the arguments the ticket's agent has now, for a person to see first."""
    open_calls = waiting_of(store, ticket)
    if call_id is not None:
        open_calls = [s for s in open_calls if s.request.call_id == call_id]
    if not open_calls:
        raise UsageError(_not_open(store, ticket, call_id))
    found = open_calls[0]
    asked = found.request
    now = current_args(store, ticket, asked.call_id)
    now = asked.args if now is None else now
    if args_hash(now) != asked.args_hash:
        ask(store, asked.model_copy(update={"args": now, "args_hash": args_hash(now)}))
        shown = json.dumps(now, ensure_ascii=False)
        raise UsageError(
            f"call {asked.call_id} of {ticket}: its arguments changed since it was asked (the "
            f"hash differs); it waits again with the arguments it has now, {shown}: decide "
            "it again (ticketgraph pending)"
        )
    if found.void is not None:
        set_aside(store, ticket, asked.call_id, found.void)
    made = Decision(
        ticket=ticket,
        call_id=asked.call_id,
        tool=asked.tool,
        args_hash=asked.args_hash,
        approved=approved,
        by=by,
        at=now_iso(),
        reason=reason,
        run_id=asked.run_id,
    )
    key = signing.signer(store.workspace)
    made.key_id, made.signature = signing.sign(key, made.model_dump())
    return record(store, made)


def _not_open(store: RunStore, ticket: str, call_id: str | None) -> str:
    """Why `ticket` has no call (`call_id`) a person can decide now."""
    asked = [r for r in requests_of(store, ticket) if call_id in (None, r.call_id)]
    if not asked:
        which = f" call {call_id}" if call_id else " call"
        return f"run {store.run_id}: ticket {ticket} waits for no{which} (ticketgraph pending)"
    latest = standing(store, max(asked, key=lambda r: r.asked_at), expire_s(store.meta().config))
    call = latest.request.call_id
    if latest.decided is not None:
        return _already(latest.decided, latest.decided)
    if latest.expired:
        hours = store.meta().config.approval_expire_h
        return (
            f"call {call} of {ticket} expired: it waited {hours:g} h undecided ([approvals] "
            f"expire_h) and can no longer be decided; `ticketgraph requeue {store.run_id} "
            f"{ticket}` puts the ticket back in inbox/ for a new run"
        )
    status = _record_status(store, ticket)
    return f"ticket {ticket} no longer waits for call {call} (it is {status}): nothing to decide"


def waiting_of(store: RunStore, ticket: str | None = None) -> list[Standing]:
    """The run's calls (of `ticket`, or all) a person can decide now, oldest first: asked,
    still waited for by their ticket, not past their expiry, and without a decision that
    counts."""
    try:
        expire = expire_s(store.meta().config)
    except RunStateError:  # no readable run.json: no expiry to go by, so none is assumed
        expire = float("inf")
    found, waits = [], _Waits(store)
    for asked in requests_of(store, ticket):
        if waits.on(asked.ticket) != asked.call_id:
            continue
        now = standing(store, asked, expire)
        if now.decided is None and not now.expired:
            found.append(now)
    return sorted(found, key=lambda s: s.request.asked_at)


def requests_of(store: RunStore, ticket: str | None = None) -> list[Request]:
    """Every readable request of the run (of `ticket`, or all)."""
    folder = store.dir / REQUESTS
    found = []
    for path in sorted(folder.glob(f"{ticket}.*.json" if ticket else "*.json")):
        with contextlib.suppress(OSError, ValidationError):
            asked = Request.model_validate_json(path.read_bytes())
            if asked.ticket == (ticket or asked.ticket):
                found.append(asked)
    return found


class _Waits:
    """The call each ticket's record waits with (records read once each)."""

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self.known: dict[str, str | None] = {}

    def on(self, ticket: str) -> str | None:
        if ticket not in self.known:
            self.known[ticket] = _waiting_call(self.store, ticket)
        return self.known[ticket]


def _waiting_call(store: RunStore, ticket: str) -> str | None:
    try:
        record = store.record(ticket)
    except RunStateError:
        return None
    waits = record.status is TicketStatus.AWAITING_APPROVAL and record.waiting is not None
    return record.waiting.call_id if waits else None  # type: ignore[union-attr]


def _record_status(store: RunStore, ticket: str) -> str:
    try:
        record = store.record(ticket)
    except RunStateError as exc:
        return f"unreadable: {exc}"
    return record.status.value + (f", stop {record.stop}" if record.stop else "")


def pending(workspace: Workspace) -> list[Standing]:
    """Every call a person can decide now, in every run of the workspace, oldest first."""
    found: list[Standing] = []
    for run_dir in sorted((workspace.runs).glob("run-*")):
        if (run_dir / REQUESTS).is_dir():
            found += waiting_of(RunStore(run_dir))
    return sorted(found, key=lambda s: s.request.asked_at)


def age_s(request: Request, now: datetime | None = None) -> float:
    """How long the call has waited (by `now`), in seconds."""
    return ((now or datetime.now(UTC)) - _when(request.asked_at)).total_seconds()


def current_args(store: RunStore, ticket: str, call_id: str) -> dict[str, Any] | None:
    """The arguments the call has in the ticket's own agent state now (None if no agent of
    the ticket stopped for it): what a decision is checked against."""
    for path in sorted((store.dir / "agents").glob(f"{ticket}.*.json")):
        try:
            stopped = versions.read_json(path).get("interruption") or {}
        except (OSError, ValueError, AttributeError):
            continue  # not an agent's state: no call of it to check against
        if stopped.get("type") == "approval" and stopped.get("call_id") == call_id:
            return dict(stopped.get("args") or {})
    return None
