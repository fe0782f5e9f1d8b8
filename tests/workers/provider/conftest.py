"""Fixtures and helpers of the provider tests: providers on scenario files, requests, stats."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from workers.provider import running_provider

REPO = Path(__file__).resolve().parents[3]

Message = dict[str, Any]
Serve = Callable[[list[dict[str, Any]]], str]


@pytest.fixture(scope="module")
def harness_url() -> Iterator[str]:
    """One provider on the built-in `harness` set, for tests that do not read its stats."""
    with running_provider("harness") as url:
        yield url


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Serve]:
    """Factory: write scripts to a YAML file and run a provider on it; stopped at teardown."""
    with ExitStack() as stack:

        def start(scripts: list[dict[str, Any]]) -> str:
            path = tmp_path / f"scenario-{len(list(tmp_path.iterdir()))}.yaml"
            path.write_text(yaml.safe_dump(scripts), encoding="utf-8")
            return stack.enter_context(running_provider(path))

        yield start


def user(text: str = "hi") -> Message:
    return {"role": "user", "content": text}


def assistant_call(call_id: str, name: str, arguments: str = "{}") -> Message:
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def tool(call_id: str, content: str) -> Message:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def chat(url: str, model: str, messages: list[Message], **extra: Any) -> httpx.Response:
    body = {"model": model, "messages": messages, **extra}
    return httpx.post(f"{url}/chat/completions", json=body, timeout=10)


def stats(url: str) -> dict[str, Any]:
    return httpx.get(f"{url.removesuffix('/v1')}/stats", timeout=5).json()


def play(url: str, model: str, turns: int, result: str = "ok") -> list[dict[str, Any]]:
    """Run `turns` requests, feeding each reply back with `result` for each of its calls."""
    messages, bodies = [user("Which file mentions a timeout?")], []
    for _ in range(turns):
        response = chat(url, model, messages)
        assert response.status_code == 200, response.text
        bodies.append(response.json())
        reply = response.json()["choices"][0]["message"]
        messages.append(reply)
        messages.extend(tool(call["id"], result) for call in reply.get("tool_calls", []))
    return bodies


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def text_script(name: str, when: dict[str, str], **extra: Any) -> dict[str, Any]:
    """A script that answers its own name as text, on every turn."""
    script = {"name": name, "when": when, "replies": [{"text": name}]}
    return script | {"after_last": "repeat_last"} | extra
