"""Effects a retry cannot take back: each tool call's idempotency key, and the ledger of
every write's intent and outcome.

    key    = sha256(base | place | tool | arguments' hash)
    base   = what the caller says the call belongs to (the graph: the workspace, the ticket,
             its text's hash, how many times a person asked its writes to be repeated, and
             the agent: draft or rewrite k); '' for the harness alone
    place  = the call's position among the tool calls of the agent's transcript

The same call gets the same key on the first run, after a crash (resume or redelivery),
and in a later run of the same ticket (requeue): none of these changes what the key is made
of. A tool passes `ctx.idempotency_key` to the API it writes to (a payment API's
Idempotency-Key header), so the API can deduplicate it too.

The ledger is a folder of one JSON file per key (`Write`): written before a write runs
(its intent) and again when it returns (its outcome). A call whose key already has an
outcome that succeeded is answered from the ledger, never run again; one whose key has an
intent and no outcome was cut off and may have happened: an idempotent tool runs again
with the same key, any other ends `write_unsure` for a person to check.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from workers.fence import UNFENCED, Fence
from workers.state import RunState, ToolCall
from workers.trace import now_iso


def args_hash(arguments: str | dict[str, Any]) -> str:
    """A hash of a call's arguments as JSON with sorted keys (the same for the model's
    string and for its parsed value)."""
    value = json.loads(arguments or "{}") if isinstance(arguments, str) else arguments
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def place(state: RunState, call: ToolCall) -> int:
    """Where `call` stands among the tool calls of the transcript (0 for the first)."""
    calls = [c.id for m in state.messages if m.role == "assistant" for c in m.tool_calls or []]
    return calls.index(call.id) if call.id in calls else len(calls)


def idempotency_key(base: str, at: int, tool: str, arguments: dict[str, Any]) -> str:
    """The key of the call at place `at` of a history named `base`, with these arguments."""
    text = f"ticketgraph-1|{base}|{at}|{tool}|{args_hash(arguments)}"
    return "tg-" + hashlib.sha256(text.encode()).hexdigest()[:40]


class Outcome(BaseModel):
    """What a write returned: its result (what the model read) or its error."""

    ok: bool
    result: str
    run_id: str
    at: str


class Write(BaseModel):
    """One write in the ledger: its key, what it was, who asked for it, and how it ended
    (None: it started and was cut off, so it may or may not have happened)."""

    key: str
    tool: str
    args_hash: str
    call_id: str
    run_id: str
    started_at: str
    idempotent: bool = False  # its tool is safe to repeat with the same key
    labels: dict[str, Any] = {}  # the caller's: ticket, text hash, repeats, agent
    outcome: Outcome | None = None

    @property
    def done(self) -> bool:
        """It happened: its outcome is recorded and it succeeded."""
        return self.outcome is not None and self.outcome.ok

    @property
    def cut_off(self) -> bool:
        """It started and no outcome was recorded: it may have happened."""
        return self.outcome is None


class Ledger:
    """A folder of writes, one file per key, shared by every run of a workspace."""

    def __init__(
        self,
        folder: Path,
        run_id: str,
        labels: dict[str, Any] | None = None,
        fence: Fence = UNFENCED,
    ) -> None:
        self.folder, self.run_id, self.labels, self.fence = folder, run_id, labels or {}, fence

    def path(self, key: str) -> Path:
        """The file of `key`."""
        return self.folder / f"{key}.json"

    def get(self, key: str) -> Write | None:
        """The write recorded under `key`, if one was (and can be read)."""
        try:
            return Write.model_validate_json(self.path(key).read_bytes())
        except (FileNotFoundError, ValidationError):
            return None

    def intend(
        self, key: str, tool: str, arguments: dict[str, Any], call_id: str, idempotent: bool
    ) -> None:
        """Record, durably, that this write is about to run."""
        write = Write(
            idempotent=idempotent,
            key=key,
            tool=tool,
            args_hash=args_hash(arguments),
            call_id=call_id,
            run_id=self.run_id,
            started_at=now_iso(),
            labels=self.labels,
        )
        self._save(write)

    def settle(self, key: str, ok: bool, result: str) -> None:
        """Record, durably, how the write under `key` ended."""
        write = self.get(key)
        if write is None:
            return  # its intent cannot be read: nothing to settle (the next run asks again)
        write.outcome = Outcome(ok=ok, result=result, run_id=self.run_id, at=now_iso())
        self._save(write)

    def _save(self, write: Write) -> None:
        os.makedirs(self.folder, exist_ok=True)
        self.fence.write(self.path(write.key), write.model_dump_json(indent=1))


def writes(folder: Path) -> list[Write]:
    """Every readable write of a ledger folder."""
    found = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            found.append(Write.model_validate_json(path.read_bytes()))
        except (OSError, ValidationError):
            continue
    return found
