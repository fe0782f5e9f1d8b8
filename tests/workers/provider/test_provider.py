"""The scripted provider over real HTTP: turns, usage, matching, faults, stats and the CLI."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.workers.provider.conftest import (
    REPO,
    Message,
    Serve,
    assistant_call,
    chat,
    free_port,
    play,
    stats,
    text_script,
    tool,
    user,
)
from workers import tokens
from workers.errors import ScenarioError
from workers.provider import (
    TOKENS_PER_MESSAGE,
    TOKENS_REPLY_PRIMING,
    load_scenario,
    running_provider,
)
from workers.provider.app import TokenRate

# --- turns and replies ---------------------------------------------------------------------


def test_plan_turn_index_is_the_assistant_message_count(harness_url: str) -> None:
    bodies = play(harness_url, "plan", 3)
    messages = [body["choices"][0]["message"] for body in bodies]
    assert [body["choices"][0]["finish_reason"] for body in bodies] == [
        "tool_calls",
        "tool_calls",
        "stop",
    ]
    assert messages[0]["tool_calls"][0]["function"] == {"name": "list_files", "arguments": "{}"}
    assert messages[1]["tool_calls"][0]["id"] == "c2"
    assert json.loads(messages[1]["tool_calls"][0]["function"]["arguments"]) == {
        "path": "errors.log"
    }
    assert messages[2] == {
        "role": "assistant",
        "content": "errors.log mentions a timeout: worker 7 timed out after 30000 ms.",
    }
    assert bodies[0]["object"] == "chat.completion"
    assert bodies[0]["id"].startswith("chatcmpl-")
    assert bodies[0]["model"] == "plan"


def test_the_embedded_provider_loads_no_websocket_or_auto_detected_stack() -> None:
    """uvicorn's "auto" settings import websockets and probe for httptools and uvloop; the
    provider (embedded in a run, or served alone) names h11 and asyncio, so it starts
    without them. Only websockets is installed here (the LangGraph peer brings it), so
    it is the check that can fail on this machine; the other two guard a machine that has
    them."""
    code = (
        "import sys, httpx\n"
        "from workers.provider import running_provider\n"
        "with running_provider('harness') as url:\n"
        "    status = httpx.get(url.replace('/v1', '/stats')).status_code\n"
        "print(status, [m for m in ('websockets', 'httptools', 'uvloop') if m in sys.modules])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["200", "[]"]


def test_service_ms_header_is_a_float(harness_url: str) -> None:
    response = chat(harness_url, "plan", [user()])
    assert float(response.headers["X-Service-Ms"]) >= 0


def test_after_last_error_is_500_naming_script_and_turn(harness_url: str) -> None:
    messages = [user(), *[assistant_call(f"c{i}", "list_files") for i in range(3)]]
    response = chat(harness_url, "plan", messages)
    assert response.status_code == 500
    message = response.json()["error"]["message"]
    assert "'plan'" in message and "turn 3" in message


def test_repeat_last_replaces_turn_in_ids(harness_url: str) -> None:
    bodies = play(harness_url, "runaway", 5)
    calls = [body["choices"][0]["message"]["tool_calls"][0] for body in bodies]
    assert [call["id"] for call in calls] == ["c0", "c1", "c2", "c3", "c4"]
    assert {call["function"]["name"] for call in calls} == {"list_files"}


def test_recover_switches_script_when_the_error_says_what_to_do(harness_url: str) -> None:
    informed = play(harness_url, "recover", 4, "Error: no such file: timeout.log. Call list_files")
    assert informed[-1]["choices"][0]["message"]["content"] == "errors.log mentions a timeout."
    blind = play(harness_url, "recover", 2, "Error: no such file: timeout.log.")
    assert blind[-1]["choices"][0]["message"]["content"].startswith("I could not read")


# --- usage ---------------------------------------------------------------------------------


def test_counted_prompt_tokens_grow_with_the_transcript(harness_url: str) -> None:
    prompts = [body["usage"]["prompt_tokens"] for body in play(harness_url, "plan", 3)]
    assert prompts[0] < prompts[1] < prompts[2]


def test_counted_usage_follows_the_documented_rule(serve: Serve) -> None:
    read = {"id": "r1", "name": "read_file", "arguments": {"path": "a"}}
    url = serve([{"name": "tiny", "replies": [{"text": "ok"}, {"tool_calls": [read]}]}])
    tools = [{"type": "function", "function": {"name": "list_files", "parameters": {}}}]
    first = chat(url, "m", [user("hi")], tools=tools).json()["usage"]
    tools_tokens = tokens.count(json.dumps(tools, separators=(",", ":")))
    expected = TOKENS_PER_MESSAGE + tokens.count("hi") + TOKENS_REPLY_PRIMING + tools_tokens
    assert first["prompt_tokens"] == expected
    assert first["completion_tokens"] == tokens.count("ok")
    assert first["total_tokens"] == first["prompt_tokens"] + first["completion_tokens"]

    second = chat(url, "m", [user("hi"), assistant_call("c1", "list_files"), tool("c1", "a")])
    usage = second.json()["usage"]
    call_tokens = tokens.count("list_files") + tokens.count("{}")
    expected = 3 * TOKENS_PER_MESSAGE + tokens.count("hi") + call_tokens + tokens.count("a")
    assert usage["prompt_tokens"] == expected + TOKENS_REPLY_PRIMING
    assert usage["completion_tokens"] == tokens.count("read_file") + tokens.count('{"path":"a"}')


def test_fixed_usage_is_reported_as_scripted(serve: Serve) -> None:
    fixed = {"prompt_tokens": 700, "completion_tokens": 20}
    url = serve([{"name": "fixed", "replies": [{"text": "routed: billing", "usage": fixed}]}])
    usage = chat(url, "m", [user("a long ticket " * 50)]).json()["usage"]
    assert usage == {**fixed, "total_tokens": 720}


# --- matching ------------------------------------------------------------------------------


def test_when_keys_and_order(serve: Serve) -> None:
    url = serve(
        [
            text_script("other-model", {"model": "^other$"}),
            text_script("system", {"model": "^m$", "system": "pirate"}),
            text_script("user", {"user": "^first"}),
            text_script("tool-results", {"tool_results": "boom"}),
            text_script("transcript", {"transcript": "secret_arg"}),
            text_script("fallback", {"model": "^m"}),
        ]
    )
    cases: list[tuple[str, list[Message], str]] = [
        ("other", [user("first")], "other-model"),
        ("m", [{"role": "system", "content": "a pirate"}, user("first")], "system"),
        ("m", [user("first of all")], "user"),
        ("m", [user("hello"), assistant_call("c1", "x"), user("first")], "fallback"),
        ("m", [user("x"), assistant_call("c1", "read_file"), tool("c1", "boom")], "tool-results"),
        ("m", [user("x"), assistant_call("c1", "read_file", '{"p":"secret_arg"}')], "transcript"),
        ("mm", [user("nothing special")], "fallback"),
    ]
    for model, messages, expected in cases:
        answer = chat(url, model, messages).json()["choices"][0]["message"]["content"]
        assert answer == expected, (model, messages)


def test_no_matching_script_is_400_naming_the_model(serve: Serve) -> None:
    url = serve([text_script("only", {"model": "^plan$"})])
    response = chat(url, "gpt-unknown", [user()])
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert "no script matched" in message and "gpt-unknown" in message


@pytest.mark.parametrize(
    "body",
    [b"{not json", b'{"model": "m"}', b'{"model": "m", "messages": [{"role": "robot"}]}', b"[]"],
)
def test_a_body_that_is_not_a_chat_request_is_400(harness_url: str, body: bytes) -> None:
    response = httpx.post(f"{harness_url}/chat/completions", content=body, timeout=5)
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


# --- faults and latency --------------------------------------------------------------------


def test_status_fault_with_times_fires_once_then_answers(serve: Serve) -> None:
    fault = {"turn": 0, "status": 429, "retry_after": 2, "times": 1}
    url = serve([text_script("limited", {}, faults=[fault])])
    first = chat(url, "m", [user()])
    assert first.status_code == 429
    assert first.headers["Retry-After"] == "2"
    assert first.json()["error"]["type"] == "rate_limit_error"
    second = chat(url, "m", [user()])
    assert second.status_code == 200
    assert second.json()["choices"][0]["message"]["content"] == "limited"


def test_fault_fires_only_on_its_turn(serve: Serve) -> None:
    url = serve([text_script("late", {}, faults=[{"turn": 1, "status": 503}])])
    assert chat(url, "m", [user()]).status_code == 200
    later = chat(url, "m", [user(), assistant_call("c1", "x"), tool("c1", "y")])
    assert later.status_code == 503
    assert "Retry-After" not in later.headers


def test_malformed_fault_sends_a_body_that_is_not_json(serve: Serve) -> None:
    url = serve([text_script("broken", {}, faults=[{"malformed": True}])])
    response = chat(url, "m", [user()])
    assert response.status_code == 200
    with pytest.raises(json.JSONDecodeError):
        json.loads(response.content)


def test_hang_fault_delays_then_answers(serve: Serve) -> None:
    url = serve([text_script("hangs", {}, faults=[{"hang_ms": 300}])])
    started = time.perf_counter()
    response = chat(url, "m", [user()])
    assert time.perf_counter() - started >= 0.3
    assert response.status_code == 200
    assert float(response.headers["X-Service-Ms"]) >= 300


def test_latency_lets_concurrent_requests_overlap(serve: Serve) -> None:
    url = serve([text_script("slow", {}, latency_ms=200)])

    async def both() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=10) as client:
            body = {"model": "m", "messages": [user()]}
            send = [client.post(f"{url}/chat/completions", json=body) for _ in range(2)]
            return await asyncio.gather(*send)

    responses = asyncio.run(both())
    assert [r.status_code for r in responses] == [200, 200]
    assert all(float(r.headers["X-Service-Ms"]) >= 200 for r in responses)
    assert stats(url)["max_in_flight"] == 2


# --- stats ---------------------------------------------------------------------------------


def test_stats_count_requests_tokens_and_scripts_and_reset(serve: Serve) -> None:
    url = serve([text_script("a", {"model": "^a$"}), text_script("b", {"model": "^b$"})])
    usages = [chat(url, model, [user()]).json()["usage"] for model in ("a", "a", "b")]
    assert chat(url, "c", [user()]).status_code == 400
    seen = stats(url)
    assert seen.pop("cpu_s") > 0
    assert time.time() - seen.pop("last_arrival_at") < 60  # the 400's, a moment ago
    assert seen == {
        "requests": 4,
        "in_flight": 0,
        "max_in_flight": 1,
        "prompt_tokens": sum(u["prompt_tokens"] for u in usages),
        "completion_tokens": sum(u["completion_tokens"] for u in usages),
        "scripts": {"a": 2, "b": 1},
        "params": {"a: none": 2, "b: none": 1},  # no max_tokens or temperature was sent
        "tools": {},  # no request offered a tool
        "abandoned": 0,  # every client waited for its reply
        "rate_limited": 0,  # no token rate was set
        "protocol_errors": {},  # every tool call was answered (none was made)
        "last_abandoned_at": None,
    }
    reset = httpx.post(f"{url.removesuffix('/v1')}/stats/reset", timeout=5)
    assert reset.status_code == 200
    zero = {"requests": 0, "in_flight": 0, "max_in_flight": 0, "prompt_tokens": 0}
    after = stats(url)
    assert after.pop("cpu_s") >= 0
    empty = {"scripts": {}, "params": {}, "tools": {}, "abandoned": 0, "rate_limited": 0}
    empty["protocol_errors"] = {}
    assert after == {
        **zero,
        **empty,
        "completion_tokens": 0,
        "last_abandoned_at": None,
        "last_arrival_at": None,
    }


def test_requests_a_strict_endpoint_would_refuse_are_answered_and_counted_by_why(
    serve: Serve,
) -> None:
    url = serve([text_script("a", {"model": "^a$"})])
    answered = [user(), assistant_call("c1", "f"), tool("c1", "ok")]
    assert chat(url, "a", answered).status_code == 200
    unanswered = [user(), assistant_call("c1", "f"), user("and?")]
    reused = [*answered, assistant_call("c1", "f"), tool("c1", "ok")]
    stray = [user(), tool("c9", "ok")]
    for messages in (unanswered, unanswered, reused, stray):
        assert chat(url, "a", messages).status_code == 200
    errors = stats(url)["protocol_errors"]
    assert sorted(errors.values()) == [1, 1, 2]
    assert errors["tool call id 'c1' is used by more than one call"] == 1
    assert [n for why, n in errors.items() if "these have none: c1" in why] == [2]
    assert [n for why, n in errors.items() if "answers 'c9'" in why] == [1]


def test_cpu_s_grows_with_requests_and_restarts_at_reset(serve: Serve) -> None:
    url = serve([text_script("a", {"model": "^a$"})])
    readings = []
    with httpx.Client(timeout=10) as client:
        for _ in range(4):
            for _ in range(10):
                body = {"model": "a", "messages": [user("count my tokens " * 50)]}
                assert client.post(f"{url}/chat/completions", json=body).status_code == 200
            readings.append(client.get(f"{url.removesuffix('/v1')}/stats").json()["cpu_s"])
    assert readings == sorted(readings)
    assert readings[-1] > readings[0] > 0
    reset = httpx.post(f"{url.removesuffix('/v1')}/stats/reset", timeout=5).json()
    assert 0 <= reset["cpu_s"] < readings[-1]


# --- scenario files ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("- name: x\n  replies: [{text: a, tool_calls: [{id: c, name: f}]}]\n", "exactly one"),
        ("- name: x\n  replies: [{}]\n", "exactly one"),
        ("- name: x\n  replies: [{text: a}]\n  colour: red\n", "colour"),
        ("- name: x\n  when: {model: '(unclosed'}\n  replies: [{text: a}]\n", "does not compile"),
        ("- name: x\n  when: {modle: '^m$'}\n  replies: [{text: a}]\n", "modle"),
        ("- name: x\n  replies: []\n", "replies"),
        ("- name: x\n  replies: [{text: a}]\n  faults: [{turn: 0}]\n", "fault needs"),
        ("- {name: x, replies: [{text: a}]}\n- {name: x, replies: [{text: b}]}\n", "unique"),
        ("name: x\n", "list of scripts"),
        ("- name: [unclosed\n", "not valid YAML"),
    ],
)
def test_invalid_scenario_file_raises_naming_the_file(
    tmp_path: Path, content: str, problem: str
) -> None:
    path = tmp_path / "broken-scenario.yaml"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    assert "broken-scenario.yaml" in str(caught.value)
    assert problem in str(caught.value)


def test_json_scenario_file_and_unknown_builtin(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps([text_script("j", {"model": "^j$"})]), encoding="utf-8")
    assert [s.name for s in load_scenario(path).scripts] == ["j"]
    with pytest.raises(ScenarioError, match="no-such-set"):
        load_scenario("no-such-set")


def test_builtin_harness_loads() -> None:
    names = [script.name for script in load_scenario("harness").scripts]
    assert names.index("research-child") < names.index("research")
    assert names.index("destructive-declined") < names.index("destructive")


# --- the command line ----------------------------------------------------------------------


def test_cli_serves_the_harness_set_until_stopped() -> None:
    port = free_port()
    command = [sys.executable, "-m", "workers.provider.server", "--scenarios", "harness"]
    process = subprocess.Popen([*command, "--port", str(port)], cwd=REPO)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(base, process)
        response = chat(f"{base}/v1", "plan", [user()])
        assert response.json()["choices"][0]["message"]["tool_calls"][0]["id"] == "c1"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_healthy(base: str, process: subprocess.Popen[bytes], timeout_s: float = 15) -> None:
    """Poll /healthz until the provider answers; fail if it exits or takes too long."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, f"provider exited with {process.returncode}"
        try:
            if httpx.get(f"{base}/healthz", timeout=1).json() == {"ok": True}:
                return
        except httpx.TransportError:
            time.sleep(0.05)
    pytest.fail(f"provider at {base} not healthy after {timeout_s} s")


def test_a_token_rate_answers_429_with_the_retry_after_that_admits(tmp_path: Path) -> None:
    scripts = [text_script("a", {"model": "^a$"})]
    scenario = tmp_path / "rate.yaml"
    scenario.write_text(yaml.safe_dump(scripts))
    with running_provider(scenario, rate=TokenRate(limit=10, window_s=2.0)) as url:
        first = chat(url, "a", [user()])
        assert first.status_code == 200
        used = first.json()["usage"]["total_tokens"]
        assert used <= 10 < used * 2  # a second one would pass the rate
        refused = chat(url, "a", [user()])
        assert refused.status_code == 429
        assert refused.json()["error"]["type"] == "rate_limit_error"
        wait = float(refused.headers["retry-after"])
        assert 1 <= wait <= 2
        time.sleep(wait)
        assert chat(url, "a", [user()]).status_code == 200
        seen = stats(url)
    assert (seen["requests"], seen["rate_limited"]) == (3, 1)
    assert seen["prompt_tokens"] + seen["completion_tokens"] == 2 * used  # 429s serve nothing
