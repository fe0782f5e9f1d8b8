"""Tool calls written as text: what small models (and servers without a tool-call parser for
the model's chat template) send instead of structured `tool_calls`.

Three forms are recognised, and only for tools the catalog has:

- the whole reply is a JSON object `{"name": ..., "arguments": {...}}` (`parameters` also
  accepted for `arguments`);
- one or more `<tool_call>{...}</tool_call>` blocks (the Hermes / Qwen form);
- the whole reply is one fenced block (```json ... ```) holding such an object.

Anything else is prose and stays the answer.
"""

from __future__ import annotations

import json
import re
from typing import Any

from workers.state import FunctionCall, ToolCall

_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_FENCED = re.compile(r"^```(?:json)?\s*\n(.*?)\n?```$", re.DOTALL)


def parse(content: str | None, known: set[str], turn: int) -> list[ToolCall]:
    """The tool calls `content` spells out (empty if it is not one of the forms)."""
    text = (content or "").strip()
    if not text:
        return []
    if blocks := _HERMES.findall(text):
        objects = [_object(block) for block in blocks]
    elif fenced := _FENCED.match(text):
        objects = [_object(fenced.group(1))]
    else:
        objects = [_object(text)]
    calls = []
    for i, obj in enumerate(objects):
        call = _call(obj, known, f"text_{turn}_{i}")
        if call is None:
            return []  # all or nothing: half a parse is prose with JSON in it
        calls.append(call)
    return calls


def _object(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _call(obj: Any, known: set[str], call_id: str) -> ToolCall | None:
    if not isinstance(obj, dict) or obj.get("name") not in known:
        return None
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(
        id=call_id, function=FunctionCall(name=obj["name"], arguments=json.dumps(arguments))
    )
