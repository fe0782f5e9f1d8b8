"""The tool API: what a tool is to the harness, and `@tool`, which makes one from a plain typed
Python function.

    from typing import Annotated
    from pydantic import Field
    from workers import ToolContext, ToolError, tool

    @tool
    def track_parcel(
        tracking_id: Annotated[str, Field(description="the carrier's id, e.g. 1Z999AA1")],
        ctx: ToolContext,
    ) -> str:
        \"\"\"Where a parcel is now, by its carrier tracking id.\"\"\"
        ...
        raise ToolError("no parcel 1Z999AA1")  # the model reads this and may try again

The JSON schema the model sees comes from the type hints (a pydantic model built once), the
description from the docstring's first paragraph, the name from the function. A parameter
annotated `ToolContext` gets the call's context instead of an argument. `@tool(read_only=
False)` marks a write: the harness records that it started before running it, so a crash
never runs it twice, and the workspace's ledger answers a later run's same call from its
recorded outcome (workers/effects.py). `@tool(read_only=False, idempotent=True)` says the
write is safe to repeat with the same `ctx.idempotency_key` (its API deduplicates by it):
cut off by a crash, it runs again with that key instead of ending `write_unsure`. A
`ToolError` goes back to the model as data; any other exception is the tool failing (the
model is told that too, by default).
"""

from __future__ import annotations

import functools
import inspect
import json
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError, create_model

from workers.cancel import CancelToken
from workers.effects import Ledger
from workers.errors import ToolError
from workers.sandbox import Sandbox
from workers.trace import Tracer


class NoArgs(BaseModel):
    """Arguments of a tool that takes none."""


@dataclass
class ToolContext:
    """What a running tool may use: the ticket it works for, the files it may read, a record
    of the effects it has, the cancel token, progress, budget and trace."""

    cancel: CancelToken
    progress: Callable[[str], None] = lambda _label: None
    budget_left: float | None = None
    charge: Callable[[float], None] = lambda _usd: None
    tracer: Tracer = field(default_factory=lambda: Tracer(None, ""))
    model: str = "scripted"
    call_id: str = ""  # the model's id for this call (unique in its transcript only)
    # The same for this call on its first run, its resume and a requeue of its ticket: pass
    # it to the API a write goes to, so the API deduplicates too (workers/effects.py).
    idempotency_key: str = ""
    ticket_id: str = ""  # the ticket the agent works for ('' outside the graph)
    files: Sandbox | None = None  # what this worker may read (its `reads`)
    # Record one effect of a write (e.g. a refund requested) in the run's actions, with the
    # ticket and the call id; durable before it returns.
    record: Callable[[dict[str, Any]], None] = lambda _effect: None

    def act(self, action: str, **fields: Any) -> None:
        """Record that this call did `action` (with `fields`) in the run's actions log."""
        key = self.idempotency_key
        self.record(
            {"action": action, "ticket": self.ticket_id, "call_id": self.call_id, "key": key}
            | fields
        )

    def readable(self) -> Sandbox:
        """The files this worker may read; a `ToolError` if it may read none."""
        if self.files is None or not self.files.roots:
            raise ToolError("this worker may read no files (its `reads` are empty)")
        return self.files


@dataclass
class ToolScope:
    """What every tool call of one agent run shares: the ticket, the files the worker may
    read, and where effects are recorded (the graph fills it; the harness alone has none)."""

    ticket_id: str = ""
    files: Sandbox | None = None
    record: Callable[[dict[str, Any]], None] = lambda _effect: None
    # What the calls' idempotency keys are made of besides their place (workers/effects.py),
    # and the ledger of writes that answers a call made before; None: no ledger.
    key_base: str = ""
    ledger: Ledger | None = None


@dataclass
class Tool:
    """A tool the model may call."""

    name: str
    description: str
    run: Callable[[Any, ToolContext], str]
    args: type[BaseModel] = NoArgs
    read_only: bool = True
    needs_approval: bool = False
    function: Callable[..., Any] | None = None  # the function `@tool` made it from
    idempotent: bool = False  # a write safe to repeat with the same idempotency key

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the function the tool was made from, as if undecorated."""
        if self.function is None:
            raise TypeError(f"tool {self.name} was not made from a function")
        return self.function(*args, **kwargs)

    def schema(self) -> dict[str, Any]:
        """The tool in the chat-completions `tools` format."""
        params = _parameters(self.args)
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": params},
        }

    def parse(self, arguments: str) -> BaseModel:
        """Validate the model's argument string; a bad one is a `ToolError` the model can fix."""
        try:
            raw = json.loads(arguments or "{}")
        except json.JSONDecodeError as exc:
            raise ToolError(f"arguments for {self.name} are not valid JSON: {exc.msg}") from exc
        try:
            return self.args.model_validate(raw)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors()
            )
            raise ToolError(f"arguments for {self.name} do not fit its schema: {problems}") from exc


@typing.overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@typing.overload
def tool(
    *,
    name: str | None = None,
    read_only: bool = True,
    needs_approval: bool = False,
    idempotent: bool = False,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    read_only: bool = True,
    needs_approval: bool = False,
    idempotent: bool = False,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a plain typed function a tool (`@tool`, or `@tool(read_only=False)` for a
    write, `idempotent=True` if it is safe to repeat with the same `ctx.idempotency_key`):
    its schema from the type hints, its description from the docstring."""

    def make(f: Callable[..., Any]) -> Tool:
        made = from_function(f, name=name, read_only=read_only, needs_approval=needs_approval)
        made.idempotent = idempotent
        return made

    return make(fn) if fn is not None else make


def from_function(
    f: Callable[..., Any],
    name: str | None = None,
    read_only: bool = True,
    needs_approval: bool = False,
) -> Tool:
    """The tool `@tool` makes of `f`; `TypeError` naming what is missing (a docstring, a
    type hint)."""
    tool_name = name or f.__name__
    description = (inspect.getdoc(f) or "").split("\n\n", 1)[0].replace("\n", " ").strip()
    if not description:
        raise TypeError(f"tool {tool_name}: give the function a docstring (the model reads it)")
    hints = typing.get_type_hints(f, include_extras=True)
    fields: dict[str, Any] = {}
    context: str | None = None
    for param in inspect.signature(f).parameters.values():
        hint = hints.get(param.name)
        if hint is ToolContext:
            context = param.name
            continue
        if hint is None:
            raise TypeError(f"tool {tool_name}: parameter {param.name!r} needs a type hint")
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (hint, default)
    args = create_model(f"{_camel(tool_name)}Args", **fields) if fields else NoArgs

    @functools.wraps(f)
    def run(parsed: BaseModel, ctx: ToolContext) -> str:
        kwargs = {key: getattr(parsed, key) for key in fields}
        if context is not None:
            kwargs[context] = ctx
        result = f(**kwargs)
        return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)

    return Tool(tool_name, description, run, args, read_only, needs_approval, f)


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_")) or "Tool"


@functools.cache
def _parameters(args: type[BaseModel]) -> dict[str, Any]:
    """The JSON schema of an arguments model, built once per model per process.

    Every turn resends it, so pydantic's titles and the class docstring are dropped.
    Generating it costs more than the rest of a turn, and a worker builds the same few
    tools for every ticket.
    """
    params = _without_titles(args.model_json_schema())
    params.pop("description", None)
    params.setdefault("properties", {})
    return params


def _without_titles(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _without_titles(v) for k, v in schema.items() if k != "title"}
    if isinstance(schema, list):
        return [_without_titles(v) for v in schema]
    return schema


class Catalog:
    """The tools of one run, by name."""

    def __init__(self, tools: list[Tool]) -> None:
        self.by_name = {t.name: t for t in tools}
        # Built once: generating JSON schemas costs more than the rest of a turn.
        self._schemas = [t.schema() for t in tools]

    def get(self, name: str) -> Tool:
        """The tool called `name`; an unknown name is a `ToolError` the model can fix."""
        tool = self.by_name.get(name)
        if tool is None:
            known = ", ".join(sorted(self.by_name)) or "none"
            raise ToolError(f"unknown tool {name!r}; available tools: {known}")
        return tool

    def schemas(self) -> list[dict[str, Any]]:
        """All tools in the chat-completions `tools` format."""
        return self._schemas
