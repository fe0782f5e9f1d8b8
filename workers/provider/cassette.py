"""Cassettes: a run's model exchanges kept in a file, and served back offline.

A cassette is a JSON document the scripted provider loads instead of a scenario file:

    {"cassette": 1,
     "exchanges": [
       {"key": "<sha256>", "path": "chat/completions",
        "request": {"model": "demo", "messages": [...], "tools": [...]},
        "response": {...the body the model sent...}},
       ...]}

`key` is the sha256 of what the request says: its API path, model, system prompt (inside
`messages` for chat completions, `system` for Messages), messages and tools; sampling
settings (max_tokens, temperature) are left out, as they do not change what was asked. A
request is answered with the response recorded for the same key, byte for byte, usage
included, so a replayed run costs what the recorded one did and pays nothing. When one key
was recorded several times (a model asked the same thing twice), its responses are served in
the recorded order, the last one repeating.

A request no exchange holds is answered HTTP 400 with a sentence naming the cassette and what
differs from the nearest recorded request (the model, the system prompt, message N, the
tools): a changed prompt shows as a miss, never as a made-up reply.

Recording is `recorder.py`'s: a proxy in front of the real endpoint that appends here.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from workers import atomic
from workers.errors import ScenarioError

VERSION = 1
# The words of a miss's sentence that the graph looks for, to name the ticket and the step.
MISS = "holds no reply to this request"
CHAT_PATH = "chat/completions"
MESSAGES_PATH = "messages"


class Exchange(BaseModel):
    """One model request (what it said) and the response the model sent."""

    model_config = ConfigDict(extra="forbid")

    key: str
    path: str
    request: dict[str, Any]
    response: dict[str, Any]


def said(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """What a request body says, for matching: the model, system prompt, messages, tools."""
    kept = {"model": body.get("model"), "messages": body.get("messages") or []}
    if path == MESSAGES_PATH and body.get("system"):
        kept["system"] = body["system"]
    kept["tools"] = body.get("tools") or []
    return kept


def key_of(path: str, request: dict[str, Any]) -> str:
    """The sha256 of a request's matching part (`said`), in canonical JSON."""
    canonical = json.dumps([path, request], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass
class Cassette:
    """The exchanges of one cassette file, indexed by key; `served` counts replays."""

    source: str
    exchanges: list[Exchange] = field(default_factory=list)
    served: Counter[str] = field(default_factory=Counter)
    _index: dict[str, list[Exchange]] = field(init=False, repr=False)

    @property
    def by_key(self) -> dict[str, list[Exchange]]:
        """Exchanges by key, in recorded order."""
        index: dict[str, list[Exchange]] = {}
        for exchange in self.exchanges:
            index.setdefault(exchange.key, []).append(exchange)
        return index

    def replay(self, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """The recorded response to this request (the next one, if it was asked twice)."""
        key = key_of(path, said(path, body))
        found = self._index.get(key)
        if not found:
            return None
        turn = min(self.served[key], len(found) - 1)
        self.served[key] += 1
        return found[turn].response

    def add(self, path: str, body: dict[str, Any], response: dict[str, Any]) -> bool:
        """Keep an exchange (not twice the same request with the same response); True if new."""
        request = said(path, body)
        key = key_of(path, request)
        if any(e.response == response for e in self._index.get(key, [])):
            return False
        exchange = Exchange(key=key, path=path, request=request, response=response)
        self.exchanges.append(exchange)
        self._index.setdefault(key, []).append(exchange)
        return True

    def save(self, path: Path) -> None:
        """Write the cassette atomically (one exchange a line, so a diff shows what changed)."""
        lines = ",\n".join(e.model_dump_json() for e in self.exchanges)
        atomic.write_text(path, f'{{"cassette": {VERSION},\n"exchanges": [\n{lines}\n]}}\n')

    def miss(self, path: str, body: dict[str, Any]) -> str:
        """The sentence a request no exchange holds is answered with."""
        asked = said(path, body)
        return (
            f"the cassette {self.source} {MISS} "
            f"({_nearest(asked, [e.request for e in self.exchanges if e.path == path])}): "
            "re-record it (`ticketgraph run --record`) after changing a prompt, a tool or "
            "a ticket"
        )

    def __post_init__(self) -> None:
        self._index = self.by_key


def _nearest(asked: dict[str, Any], recorded: list[dict[str, Any]]) -> str:
    """What differs between `asked` and the recorded request most like it."""
    same_model = [r for r in recorded if r.get("model") == asked.get("model")]
    if not same_model:
        return f"no recorded request asks model {asked.get('model')!r}"
    best = max(same_model, key=lambda r: _shared(asked, r))
    asked_messages, best_messages = asked["messages"], best["messages"]
    if asked.get("system") != best.get("system"):
        return "the system prompt differs from every recorded one"
    for index, (mine, theirs) in enumerate(zip(asked_messages, best_messages, strict=False)):
        if mine != theirs:
            role = mine.get("role", "?") if isinstance(mine, dict) else "?"
            what = "the system prompt" if role == "system" else f"message {index} ({role})"
            return f"{what} differs from the nearest recorded request's"
    if len(asked_messages) != len(best_messages):
        return (
            f"it has {len(asked_messages)} messages, the nearest recorded request "
            f"{len(best_messages)}"
        )
    return "its tools differ from the nearest recorded request's"


def _shared(asked: dict[str, Any], recorded: dict[str, Any]) -> tuple[int, int]:
    """How alike two requests are: messages in common from the start (the first message
    being the system prompt, a system prompt differing counts as nothing shared), then tools."""
    count = 0
    for mine, theirs in zip(asked["messages"], recorded["messages"], strict=False):
        if mine != theirs:
            break
        count += 1
    return count, int(asked.get("tools") == recorded.get("tools"))


def is_cassette(source: str | Path) -> bool:
    """True when `source` is a file whose JSON says it is a cassette."""
    path = Path(source)
    if not path.is_file() or path.suffix != ".json":
        return False
    with path.open("rb") as f:
        return f.read(16).lstrip().startswith(b'{"cassette"')


def load_cassette(source: str | Path, missing_ok: bool = False) -> Cassette:
    """A cassette file's exchanges; `ScenarioError` naming the file if it is not one (an
    empty cassette if it does not exist and `missing_ok`, for recording into)."""
    path = Path(source)
    if missing_ok and not path.exists():
        return Cassette(str(path))
    try:
        data = json.loads(path.read_bytes())
        if not isinstance(data, dict) or data.get("cassette") != VERSION:
            raise ValueError(f'not a cassette: it must start {{"cassette": {VERSION}')
        exchanges = [Exchange.model_validate(e) for e in data.get("exchanges") or []]
    except (OSError, ValueError, ValidationError) as exc:
        raise ScenarioError(f"{path}: cannot load the cassette: {exc}") from exc
    return Cassette(str(path), exchanges)
