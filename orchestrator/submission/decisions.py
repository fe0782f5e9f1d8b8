"""What a person's decisions print: `pending`, `approve` and `reject` (the calls that wait
for a person, and a decision recorded; the rules are run/approvals.py's) and `cancel`
(submission/cancel.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.run import approvals, signing
from orchestrator.run.approvals import Standing
from orchestrator.run.store import RunStore, find

if TYPE_CHECKING:
    from orchestrator.config.workspace import Workspace


def pending_text(workspace: Workspace, as_json: bool) -> str:
    """Every call a person can decide now, for a person or (`as_json`) a program."""
    waiting = approvals.pending(workspace)
    if as_json:
        rows = [
            s.request.model_dump()
            | {"age_s": round(approvals.age_s(s.request), 1), "set_aside": s.void}
            for s in waiting
        ]
        return json.dumps(rows, indent=2) + "\n"
    if not waiting:
        return "no tool call waits for a decision\n"
    count = "1 tool call waits" if len(waiting) == 1 else f"{len(waiting)} tool calls wait"
    lines = [f"{count} for a decision:"]
    for s in waiting:
        lines += [f"  {line}" for line in describe(s)]
    return "\n".join(lines) + "\n"


def describe(waiting: Standing) -> list[str]:
    """One waiting call: where, what, how long, the two commands that decide it, and a
    decision file on it that does not count."""
    request = waiting.request
    hours = approvals.age_s(request) / 3600
    arguments = json.dumps(request.args, ensure_ascii=False)
    command = f"{request.run_id} {request.ticket} --call {request.call_id}"
    lines = [
        f"{request.run_id} {request.ticket} {request.tool}({arguments}), waiting {hours:.1f} h",
        f"    ticketgraph approve {command}",
        f"    ticketgraph reject {command} --reason '...'",
    ]
    if waiting.void is not None:
        why = waiting.void
        lines.append(f"    its decision file does not count ({why}): deciding sets it aside")
    return lines


def decide(
    workspace: Workspace,
    run_id: str,
    ticket: str,
    call_id: str | None,
    approved: bool,
    by: str | None,
    reason: str,
) -> str:
    """Record a person's decision on the call `ticket` waits with, signed with this user's
    key (`ConfigError` saying how to set one up when none can sign); what to do next."""
    signing.signer(workspace)
    store = find(workspace, run_id)
    made = approvals.decide(store, ticket, call_id, approved, by or _user(), reason)
    store.tracer(node="approval", ticket=ticket).emit(
        "approved" if approved else "rejected",
        call_id=made.call_id,
        tool=made.tool,
        by=made.by,
        reason=reason or None,
        args_hash=made.args_hash,
    )
    verdict = "approved" if approved else "rejected"
    where = (
        "" if workspace.root.resolve() == Path.cwd().resolve() else f" --workspace {workspace.root}"
    )
    return (
        f"{verdict}: {run_id} {ticket} {made.tool} (call {made.call_id}) by {made.by}\n"
        f"next: ticketgraph resume {run_id}{where}\n"
    )


def requeue(
    workspace: Workspace,
    run_id: str,
    tickets: list[str],
    by: str | None,
    force: bool = False,
    repeat_writes: bool = False,
) -> str:
    """Put the run's claimed files (all, or those of `tickets`) back into inbox/, recorded in
    the run's trace with who did it; what moved and what stayed, and what the next run does
    with each write they made (`repeat_writes`: every one runs again, with new keys).
    `RunBusy` while the run is being worked on; `UsageError` naming what they set in motion
    (a write its tools made, a call that waits for a decision) and what the next run would
    do with each write, unless `force` (or `repeat_writes`, which asks for the writes)."""
    from orchestrator.errors import UsageError
    from orchestrator.intake import claims, journal
    from orchestrator.people import effects
    from orchestrator.run import lease, ledger

    store = find(workspace, run_id)
    lease.wait_free(store, wait=False)
    chosen = tickets or store.ticket_ids()
    if not (force or repeat_writes) and (again := effects.would_run_again(store, chosen)):
        fates = [
            f"{line} (next run: {fate})" for line, fate in ledger.fates(workspace, store, chosen)
        ]
        raise UsageError(effects.refusal(run_id, again, fates))
    names = claims.names_of(store, tickets)
    done = claims.requeue(workspace, store, names)
    journal.requeued(store)  # a claim that never finished, emptied: no longer stranded
    left = sorted(done.taken + done.back + done.gone)
    store.tracer(node="requeue").emit("requeued", by=by or _user(), files=done.moved, left=left)
    lines = [f"inbox/{name}" for name in done.moved]
    if done.moved:
        lines += writes_text(workspace, store, tickets, by or _user(), repeat_writes)
    if done.taken:
        taken = ", ".join(done.taken)
        lines.append(f"left in runs/{run_id}/claimed/ (name taken in inbox/): {taken}")
    if done.back:
        verb = "is" if len(done.back) == 1 else "are"
        lines.append(f"{', '.join(done.back)} {verb} back in inbox/ already")
    if done.gone:
        where = f"in neither runs/{run_id}/claimed/ nor inbox/ (moved or deleted)"
        lines.append(f"{', '.join(done.gone)}: {where}")
    return "".join(f"{line}\n" for line in lines)


def writes_text(
    workspace: Workspace, store: RunStore, tickets: list[str], by: str, repeat_writes: bool
) -> list[str]:
    """What the next run does with each write the requeued tickets made (the ledger's
    answer, or running again), a line each; with `repeat_writes`, recorded (and traced)
    as asked by `by`, so that they run again with new keys."""
    from orchestrator.run import ledger

    lines = []
    chosen = tickets or store.ticket_ids()
    held = ledger.of_tickets(workspace, store, chosen)
    for ticket in chosen:
        for write in held[ticket]:
            said = ledger.fate(write, repeat_writes)
            lines.append(f"{ticket} {write.tool} (call {write.call_id}, {write.run_id}): {said}")
        if repeat_writes:
            ledger.repeat(workspace, ticket, by, store.run_id)
            store.tracer(node="requeue", ticket=ticket).emit("writes_repeat_asked", by=by)
    return lines


def cancel(
    workspace: Workspace,
    run_id: str,
    tickets: list[str],
    by: str | None,
    reason: str,
    broker_url: str | None,
    wait_s: float,
) -> str:
    """Cancel the run (or tickets of it); what happened, and what to do next."""
    from orchestrator.submission import cancel as cancelling

    store = find(workspace, run_id)
    done = cancelling.cancel(store, tickets, by or _user(), reason, broker_url, wait_s)
    if done.finished is not None:
        return f"run {run_id} has finished ({done.finished}): nothing to cancel\n"
    lines = [f"{t}: not cancelled, {why}" for t, why in done.skipped.items()]
    if not done.recorded:
        return "\n".join([*lines, "nothing to cancel"]) + "\n"
    whole = done.recorded[0].ticket is None
    what = f"run {run_id}" if whole else ", ".join(str(c.ticket) for c in done.recorded)
    first = done.recorded[0]
    if done.again:
        lines.append(
            f"{what} was cancelled already ({first.why}, at {first.at}): telling the workers again"
        )
    else:
        lines.append(f"cancelled {what}: {first.why}")
    if (d := done.delivery) is not None:
        lines.append(
            f"{d.stopped} running step(s) stopped on {len(d.answers)} of {d.listeners} "
            f"worker process(es) in {d.elapsed_s:.3f} s"
        )
        if not d.complete:
            lines.append(_LATE)
    elif done.relayed:
        lines.append("delivered to its workers by the run's own command")
    else:
        lines.append(f"recorded, not delivered live: {done.undelivered}")
        lines.append(_LATE)
    where = (
        "" if workspace.root.resolve() == Path.cwd().resolve() else f" --workspace {workspace.root}"
    )
    again = "the run" if whole else "those tickets"
    lines.append(f"next: ticketgraph resume {run_id}{where} goes on with {again}")
    return "\n".join(lines) + "\n"


_LATE = (
    "a worker process that did not hear it stops the run's steps before their next model "
    "request (the cancel is in the run folder)"
)


def _user() -> str:
    return signing.user_name()
