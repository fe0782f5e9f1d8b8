"""What a tool is to the harness: a schema, two flags, and a function that gets a context.

Arguments are a pydantic model, so the JSON schema sent to the model and the validation of
what the model sent back come from one definition.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from workers.cancel import CancelToken
from workers.errors import ToolError
from workers.trace import Tracer


class NoArgs(BaseModel):
    """Arguments of a tool that takes none."""


@dataclass
class ToolContext:
    """What a running tool may use: the run's cancel token, progress, budget and trace."""

    cancel: CancelToken
    progress: Callable[[str], None] = lambda _label: None
    budget_left: float | None = None
    charge: Callable[[float], None] = lambda _usd: None
    tracer: Tracer = field(default_factory=lambda: Tracer(None, ""))
    model: str = "scripted"
    call_id: str = ""  # the model's id for this call: a write tool's idempotency key


@dataclass
class Tool:
    """A tool the model may call."""

    name: str
    description: str
    run: Callable[[Any, ToolContext], str]
    args: type[BaseModel] = NoArgs
    read_only: bool = True
    needs_approval: bool = False

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
