"""The official SDKs against the scripted provider: if they parse its replies, it is a
faithful server for both APIs, and so are the tests that rely on it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest
import yaml

from workers.provider import running_provider

TOOL_OPENAI = {
    "type": "function",
    "function": {
        "name": "lookup_order",
        "description": "Look up one order.",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}},
    },
}
TOOL_ANTHROPIC = {
    "name": "lookup_order",
    "description": "Look up one order.",
    "input_schema": {"type": "object", "properties": {"order_id": {"type": "string"}}},
}
SCRIPT = {
    "name": "billing",
    "when": {"user": "^Ticket id: (?P<ticket>\\S+)"},
    "replies": [
        {
            "tool_calls": [{"id": "c1", "name": "lookup_order", "arguments": {"order_id": "A-1"}}],
            "usage": {"prompt_tokens": 50, "completion_tokens": 9},
        },
        {
            "text": "Ticket {ticket}: refunded.",
            "usage": {"prompt_tokens": 80, "completion_tokens": 6},
        },
    ],
}


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump([SCRIPT]))
    with running_provider(path) as base:
        yield base


def test_the_openai_sdk_parses_a_tool_call_and_the_answer(url: str) -> None:
    client = openai.OpenAI(base_url=url, api_key="test", max_retries=0)
    messages: list[dict[str, object]] = [{"role": "user", "content": "Ticket id: T-7\nhelp"}]
    first = client.chat.completions.create(model="m", messages=messages, tools=[TOOL_OPENAI])  # type: ignore[arg-type]
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "lookup_order"
    assert json.loads(call.function.arguments) == {"order_id": "A-1"}
    assert first.usage is not None and first.usage.prompt_tokens == 50
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"status": "paid"}'},
    ]
    second = client.chat.completions.create(model="m", messages=messages, tools=[TOOL_OPENAI])  # type: ignore[arg-type]
    assert second.choices[0].message.content == "Ticket T-7: refunded."
    assert second.choices[0].finish_reason == "stop"


def test_the_anthropic_sdk_parses_tool_use_and_the_answer(url: str) -> None:
    client = anthropic.Anthropic(base_url=url.removesuffix("/v1"), api_key="test", max_retries=0)
    messages: list[dict[str, object]] = [{"role": "user", "content": "Ticket id: T-7\nhelp"}]
    first = client.messages.create(
        model="m",
        max_tokens=100,
        system="you help",
        messages=messages,
        tools=[TOOL_ANTHROPIC],  # type: ignore[arg-type]
    )
    assert first.stop_reason == "tool_use"
    (use,) = [b for b in first.content if b.type == "tool_use"]
    assert (use.name, use.input) == ("lookup_order", {"order_id": "A-1"})
    assert (first.usage.input_tokens, first.usage.output_tokens) == (50, 9)
    messages += [
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "paid"}],
        },
    ]
    second = client.messages.create(
        model="m", max_tokens=100, messages=messages, tools=[TOOL_ANTHROPIC]
    )  # type: ignore[arg-type]
    assert second.stop_reason == "end_turn"
    assert [b.text for b in second.content if b.type == "text"] == ["Ticket T-7: refunded."]
    cut = client.messages.create(model="m", max_tokens=3, messages=messages, tools=[TOOL_ANTHROPIC])  # type: ignore[arg-type]
    assert (cut.stop_reason, cut.usage.output_tokens) == ("max_tokens", 3)


def test_the_anthropic_sdk_sees_a_scripted_fault_as_its_own_error(tmp_path: Path) -> None:
    path = tmp_path / "f.yaml"
    path.write_text(yaml.safe_dump([{**SCRIPT, "faults": [{"status": 429, "retry_after": 0}]}]))
    with running_provider(path) as base:
        client = anthropic.Anthropic(base_url=base.removesuffix("/v1"), api_key="t", max_retries=0)
        with pytest.raises(anthropic.RateLimitError):
            client.messages.create(
                model="m", max_tokens=10, messages=[{"role": "user", "content": "Ticket id: T-1"}]
            )
