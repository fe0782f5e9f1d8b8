"""Scenario files for the scripted provider: their models, matching, and reply rendering.

A scenario file (YAML or JSON) is a top-level list of scripts. The first script whose `when`
matches a request answers it; the reply is picked by the request's turn index, which is the
number of assistant messages in the request (the provider keeps no conversation state).

    - name: plan                      # required, unique within the file
      when: {model: "^plan$"}         # optional regexes (re.search), all given must match:
                                      #   model, system, user, transcript, tool_results
      latency_ms: 0                   # scripted model time, slept asynchronously
      after_last: error               # or repeat_last, once the turns run past `replies`
      faults: [{turn: 0, status: 429, retry_after: 1, times: 1}]
      replies:
        - tool_calls: [{id: c1, name: list_files, arguments: {}}]
        - text: "done"
          usage: {prompt_tokens: 100, completion_tokens: 5}   # fixed; else counted

This module is plain code over plain data: no HTTP lives here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from workers import tokens
from workers.errors import ScenarioError

BUILTIN_PACKAGE = "workers.provider"
BUILTIN_FOLDER = "scenarios"


# --- the scenario file ---------------------------------------------------------------------


class _Strict(BaseModel):
    """Base of the scenario models: a misspelt key is an error, not a silent default."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ToolCallSpec(_Strict):
    """One scripted tool call; `{turn}` in the id becomes the request's turn index."""

    id: str
    name: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)


class FixedUsage(_Strict):
    """Usage numbers a reply reports instead of counted ones."""

    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)


class Reply(_Strict):
    """One scripted assistant reply: either text or tool calls."""

    text: str | None = None
    tool_calls: list[ToolCallSpec] | None = Field(default=None, min_length=1)
    usage: FixedUsage | None = None

    @model_validator(mode="after")
    def _exactly_one_kind(self) -> Reply:
        if (self.text is None) == (self.tool_calls is None):
            raise ValueError("a reply needs exactly one of `text` or `tool_calls`")
        return self


class When(_Strict):
    """Regexes a request must match (`re.search`); a key left out matches anything."""

    model: str | None = None
    system: str | None = None
    user: str | None = None
    transcript: str | None = None
    tool_results: str | None = None

    @field_validator("model", "system", "user", "transcript", "tool_results")
    @classmethod
    def _compiles(cls, pattern: str | None) -> str | None:
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"regex {pattern!r} does not compile: {exc}") from exc
        return pattern

    def matches(self, view: ConversationView) -> bool:
        """True when every given regex is found in the matching part of the request."""
        # `re` caches compiled patterns, so compiling per request costs a dict lookup.
        return all(
            re.search(pattern, getattr(view, key)) is not None
            for key, pattern in self.model_dump(exclude_none=True).items()
        )


class Fault(_Strict):
    """A scripted failure: an HTTP error status, a malformed body, or a hang before answering."""

    turn: int | None = Field(default=None, ge=0, description="None: every turn")
    status: int | None = Field(default=None, ge=400, le=599)
    retry_after: float | None = Field(default=None, ge=0)
    times: int | None = Field(default=None, ge=1, description="None: fires every time")
    malformed: bool = False
    hang_ms: float = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _one_effect(self) -> Fault:
        if self.status is not None and self.malformed:
            raise ValueError("a fault has either `status` or `malformed`, not both")
        if self.status is None and not self.malformed and not self.hang_ms:
            raise ValueError("a fault needs `status`, `malformed` or `hang_ms`")
        if self.retry_after is not None and self.status is None:
            raise ValueError("`retry_after` only goes with `status`")
        return self

    def applies_to(self, turn: int) -> bool:
        """True when this fault is scripted for `turn` (ignoring how often it has fired)."""
        return self.turn is None or self.turn == turn


class Script(_Strict):
    """One scripted conversation: when it answers, and what it says turn by turn."""

    name: str = Field(min_length=1)
    when: When = When()
    replies: list[Reply] = Field(min_length=1)
    latency_ms: float = Field(default=0, ge=0)
    after_last: Literal["repeat_last", "error"] = "error"
    faults: list[Fault] = Field(default_factory=list)

    def reply_for(self, turn: int) -> Reply | None:
        """The reply for `turn`, or None when the script has run out and must error."""
        if turn < len(self.replies):
            return self.replies[turn]
        return self.replies[-1] if self.after_last == "repeat_last" else None


class Scenario(BaseModel):
    """The scripts of one scenario file, in the order they are tried."""

    source: str
    scripts: list[Script]

    def match(self, view: ConversationView) -> Script | None:
        """The first script whose `when` matches, or None."""
        return next((s for s in self.scripts if s.when.matches(view)), None)


# --- loading -------------------------------------------------------------------------------


def builtin_names() -> list[str]:
    """Names of the scenario sets shipped in the package (`harness`, ...)."""
    folder = resources.files(BUILTIN_PACKAGE).joinpath(BUILTIN_FOLDER)
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_scenario(source: str | Path) -> Scenario:
    """Load a scenario from a YAML/JSON file path or a built-in set name; ScenarioError if bad."""
    label, text = _read_source(source)
    try:
        data = json.loads(text) if label.endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise ScenarioError(f"{label}: not valid YAML/JSON: {exc}") from exc
    if not isinstance(data, list):
        raise ScenarioError(f"{label}: the top level must be a list of scripts")
    scripts = [_validate_script(label, index, item) for index, item in enumerate(data)]
    names = [s.name for s in scripts]
    if duplicates := sorted({n for n in names if names.count(n) > 1}):
        raise ScenarioError(f"{label}: script names must be unique: {', '.join(duplicates)}")
    return Scenario(source=label, scripts=scripts)


def _read_source(source: str | Path) -> tuple[str, str]:
    """(label for messages, text) of a file path, else of a built-in set."""
    path = Path(source)
    if path.is_file():
        return str(path), path.read_text(encoding="utf-8")
    builtin = resources.files(BUILTIN_PACKAGE).joinpath(BUILTIN_FOLDER, f"{source}.yaml")
    if isinstance(source, str) and builtin.is_file():
        return f"{source}.yaml", builtin.read_text(encoding="utf-8")
    raise ScenarioError(
        f"{source}: no such scenario file or built-in set (built-ins: {', '.join(builtin_names())})"
    )


def _validate_script(label: str, index: int, item: Any) -> Script:
    """Validate one script; its errors name the file, the script and the field."""
    try:
        return Script.model_validate(item)
    except ValidationError as exc:
        name = item.get("name") if isinstance(item, dict) else None
        who = f"script #{index}" + (f" ({name!r})" if name else "")
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or '(script)'}: {error['msg']}"
            for error in exc.errors()
        )
        raise ScenarioError(f"{label}: {who}: {problems}") from exc


# --- the request, as the matcher sees it ---------------------------------------------------


class WireFunction(BaseModel):
    """The `function` of an assistant tool call on the wire."""

    name: str
    arguments: str = ""


class WireToolCall(BaseModel):
    """An assistant tool call on the wire."""

    id: str
    type: Literal["function"] = "function"
    function: WireFunction


class WireMessage(BaseModel):
    """One chat message on the wire (unknown keys are allowed, as real clients send them)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[WireToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def text(self) -> str:
        """The message's text; content parts of type `text` are joined."""
        if isinstance(self.content, list):
            return "".join(str(p.get("text", "")) for p in self.content if p.get("type") == "text")
        return self.content or ""


class ChatRequest(BaseModel):
    """The part of a chat-completions request body the provider reads."""

    model: str
    messages: list[WireMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None

    @property
    def turn(self) -> int:
        """Turn index: how many assistant messages the request already holds."""
        return sum(1 for m in self.messages if m.role == "assistant")


@dataclass(frozen=True)
class ConversationView:
    """The texts `when` regexes are matched against."""

    model: str
    system: str
    user: str
    transcript: str
    tool_results: str

    @classmethod
    def of(cls, request: ChatRequest) -> ConversationView:
        """Build the view: tool calls enter the transcript as `name arguments` lines."""
        messages = request.messages
        transcript: list[str] = []
        for message in messages:
            transcript.append(message.text())
            for call in message.tool_calls or []:
                transcript.append(f"{call.function.name} {call.function.arguments}")
        users = [m.text() for m in messages if m.role == "user"]
        return cls(
            model=request.model,
            system="\n".join(m.text() for m in messages if m.role in ("system", "developer")),
            user=users[0] if users else "",
            transcript="\n".join(transcript),
            tool_results="\n".join(m.text() for m in messages if m.role == "tool"),
        )


# --- rendering a reply, and counting its tokens --------------------------------------------

# OpenAI's published guidance for chat models: every message costs 3 tokens of framing
# (role and delimiters) besides its content, and every reply is primed with 3 more.
TOKENS_PER_MESSAGE = 3
TOKENS_REPLY_PRIMING = 3


def prompt_tokens(request: ChatRequest) -> int:
    """Counted prompt tokens (o200k_base), the one rule the provider uses.

    sum over messages of (TOKENS_PER_MESSAGE + count(text) + sum over the message's tool
    calls of (count(name) + count(arguments))) + TOKENS_REPLY_PRIMING + count(tools JSON),
    where the tools JSON is `json.dumps(tools, separators=(",", ":"))` and is only counted
    when the request lists tools. Roles and `name`/`tool_call_id` fields are not counted.
    """
    total = TOKENS_REPLY_PRIMING
    for message in request.messages:
        total += TOKENS_PER_MESSAGE + tokens.count(message.text())
        total += _calls_tokens([call.model_dump() for call in message.tool_calls or []])
    if request.tools:
        total += tokens.count(json.dumps(request.tools, separators=(",", ":")))
    return total


def _calls_tokens(calls: list[dict[str, Any]]) -> int:
    """Tokens of wire-format tool calls: each call's name plus its argument string."""
    return sum(
        tokens.count(call["function"]["name"]) + tokens.count(call["function"]["arguments"])
        for call in calls
    )


@dataclass(frozen=True)
class RenderedReply:
    """A reply ready for the wire: the assistant message, why it stopped, and its usage."""

    message: dict[str, Any]
    finish_reason: Literal["stop", "tool_calls"]
    prompt_tokens: int
    completion_tokens: int


def render_reply(reply: Reply, request: ChatRequest) -> RenderedReply:
    """Turn a scripted reply into an OpenAI assistant message with usage (fixed or counted)."""
    calls = _wire_calls(reply, request.turn)
    message: dict[str, Any] = {"role": "assistant", "content": reply.text}
    if calls:
        message["tool_calls"] = calls
    if reply.usage is not None:
        prompt, completion = reply.usage.prompt_tokens, reply.usage.completion_tokens
    else:
        prompt = prompt_tokens(request)
        completion = tokens.count(reply.text or "") + _calls_tokens(calls)
    return RenderedReply(message, "tool_calls" if calls else "stop", prompt, completion)


def _wire_calls(reply: Reply, turn: int) -> list[dict[str, Any]]:
    """The reply's tool calls in wire format, with `{turn}` in ids replaced."""
    return [
        {
            "id": call.id.replace("{turn}", str(turn)),
            "type": "function",
            "function": {"name": call.name, "arguments": _arguments(call)},
        }
        for call in reply.tool_calls or []
    ]


def _arguments(call: ToolCallSpec) -> str:
    """The call's arguments as the JSON string the wire carries (a mapping is dumped compact)."""
    if isinstance(call.arguments, str):
        return call.arguments
    return json.dumps(call.arguments, separators=(",", ":"), ensure_ascii=False)
