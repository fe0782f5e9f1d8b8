"""What a ticket of a run set in motion that a requeue would set in motion again: the writes
its tools recorded (actions.jsonl), the writes a crash cut off (maybe done), and a tool call
that still waits for a decision. `requeue` asks for --force before putting such a ticket
back in inbox/, naming each."""

from __future__ import annotations

import json

from orchestrator.errors import RunStateError
from orchestrator.people import money
from orchestrator.run.records import TicketStatus
from orchestrator.run.store import RunStore


def would_run_again(store: RunStore, tickets: list[str]) -> dict[str, list[str]]:
    """For each of `tickets` that did something a new run would do again: what, in words."""
    found: dict[str, list[str]] = {}
    writes = recorded(store)
    for ticket_id in tickets:
        said = [f"its tool wrote: {w}" for w in writes.get(ticket_id, [])]
        try:
            record = store.record(ticket_id)
        except RunStateError:
            record = None
        if record is not None:
            said += [f"a write cut off by a crash (maybe made): {c}" for c in record.unsure_writes]
            if record.status is TicketStatus.AWAITING_APPROVAL and record.waiting is not None:
                call = record.waiting
                said.append(f"waits for a decision on {call.tool}({money.words(call.args)})")
        if said:
            found[ticket_id] = said
    return found


def recorded(store: RunStore) -> dict[str, list[str]]:
    """The run's recorded effects (actions.jsonl), by ticket, in words (amounts as money)."""
    by_ticket: dict[str, list[str]] = {}
    try:
        lines = store.actions_path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return by_ticket
    for line in lines:
        try:
            effect = json.loads(line)
        except ValueError:
            continue
        if not isinstance(effect, dict) or not effect.get("ticket"):
            continue
        # The idempotency key is the ledger's, not what a person needs to see of a write.
        hidden = ("action", "ticket", "call_id", "key")
        fields = {k: v for k, v in effect.items() if k not in hidden}
        shown = f"{effect.get('action', 'write')} ({money.words(fields)})"
        by_ticket.setdefault(str(effect["ticket"]), []).append(shown)
    return by_ticket


def refusal(run_id: str, found: dict[str, list[str]], fates: list[str] | None = None) -> str:
    """The sentence a requeue without --force ends with; `fates`: what the next run would do
    with each write the workspace's ledger holds for them."""
    parts = [f"{ticket}: {'; '.join(said)}" for ticket, said in sorted(found.items())]
    ledger = f" — the ledger: {' | '.join(fates)}" if fates else ""
    return (
        f"requeue of run {run_id} would run again what these tickets set in motion — "
        + " | ".join(parts)
        + ledger
        + " — add --force to put them back in inbox/ anyway"
    )
