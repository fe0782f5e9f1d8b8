"""Scenario scripts: `{name}` placeholders, the model index, first match wins, match cost."""

from __future__ import annotations

import json
import random
import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.workers.provider.conftest import Message, Serve, assistant_call, chat, tool, user
from workers import tokens
from workers.errors import ScenarioError
from workers.provider import ChatRequest, ConversationView, Scenario, Script, load_scenario

TICKET = r"^Ticket id: (?P<ticket>T-\d+)"


def reply_of(url: str, model: str, messages: list[Message]) -> dict[str, Any]:
    """The assistant message of a request that must succeed."""
    response = chat(url, model, messages)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]


# --- placeholders --------------------------------------------------------------------------


def test_placeholders_fill_tool_call_ids_and_arguments(serve: Serve) -> None:
    call = {
        "id": "call_{ticket}_{turn}",
        "name": "lookup_order",
        "arguments": {"ticket": "{ticket}", "seen": ["{model} asked", {"deep": "{ticket}"}]},
    }
    raw = {"id": "raw", "name": "note", "arguments": '{"ticket": "{ticket}", "n": {"x": 1}}'}
    when = {"model": "^(?P<model>m\\d)$", "user": TICKET}
    url = serve([{"name": "t", "when": when, "replies": [{"tool_calls": [call, raw]}]}])
    calls = reply_of(url, "m7", [user("Ticket id: T-1042\nmy order")])["tool_calls"]
    assert calls[0]["id"] == "call_T-1042_0"
    assert json.loads(calls[0]["function"]["arguments"]) == {
        "ticket": "T-1042",
        "seen": ["m7 asked", {"deep": "T-1042"}],
    }
    assert calls[1]["function"]["arguments"] == '{"ticket": "T-1042", "n": {"x": 1}}'


def test_placeholders_fill_text_and_counted_usage_counts_the_filled_text(serve: Serve) -> None:
    text = 'Ticket {ticket}: status {"ok": true}, {nothing} and {ticket} again.'
    script = {
        "name": "t",
        "when": {"user": TICKET, "tool_results": "(?P<nothing>x)?done"},
        "replies": [{"tool_calls": [{"id": "c1", "name": "f"}]}, {"text": text}],
    }
    url = serve([script])
    messages = [user("Ticket id: T-7 please"), assistant_call("c1", "f"), tool("c1", "done")]
    response = chat(url, "m", messages).json()
    content = response["choices"][0]["message"]["content"]
    # `nothing` is a group that took no part in the match: its placeholder stays as written.
    assert content == 'Ticket T-7: status {"ok": true}, {nothing} and T-7 again.'
    assert response["usage"]["completion_tokens"] == tokens.count(content)


def test_the_first_regex_in_key_order_wins_a_shared_group_name(serve: Serve) -> None:
    when = {"system": "(?P<who>pirate)", "user": "(?P<who>\\w+)"}
    url = serve([{"name": "t", "when": when, "replies": [{"text": "{who}"}]}])
    messages = [{"role": "system", "content": "a pirate"}, user("sailor")]
    assert reply_of(url, "m", messages)["content"] == "pirate"


@pytest.mark.parametrize(
    ("reply", "named"),
    [
        ({"text": "Ticket {tikcet}"}, "{tikcet}"),
        ({"text": "turn {turn}"}, "{turn}"),
        ({"tool_calls": [{"id": "c{turn}_{order}", "name": "f"}]}, "{order}"),
        ({"tool_calls": [{"id": "c", "name": "f", "arguments": {"a": ["{x}"]}}]}, "{x}"),
        ({"tool_calls": [{"id": "c", "name": "f", "arguments": "{y}"}]}, "{y}"),
    ],
)
def test_a_placeholder_that_names_no_group_is_a_load_error(
    tmp_path: Path, reply: dict[str, Any], named: str
) -> None:
    path = tmp_path / "typo.yaml"
    script = {"name": "typo", "when": {"user": TICKET}, "replies": [{"text": "ok"}, reply]}
    path.write_text(yaml.safe_dump([script]), encoding="utf-8")
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    message = str(caught.value)
    assert "typo.yaml" in message and "'typo'" in message and "replies.1" in message
    assert named in message and "ticket" in message


def test_turn_in_an_id_and_braces_without_a_name_need_no_group(tmp_path: Path) -> None:
    path = tmp_path / "fine.yaml"
    reply = {"tool_calls": [{"id": "c{turn}", "name": "f", "arguments": '{"a": {}}'}]}
    path.write_text(yaml.safe_dump([{"name": "ok", "replies": [reply, {"text": "{1} {}"}]}]))
    assert [s.name for s in load_scenario(path).scripts] == ["ok"]


# --- matching order and the model index ----------------------------------------------------

ORDER_SCRIPTS = [
    {"name": "a-urgent", "when": {"model": "^a$", "user": "^urgent"}},  # indexed
    {"name": "ab-urgent", "when": {"model": "^(a|b)$", "user": "^urgent"}},  # not indexed
    {"name": "a-plain", "when": {"model": "^a$"}},  # indexed
    {"name": "b-plain", "when": {"model": "^b$", "user": "^plain"}},  # indexed
    {"name": "a.b", "when": {"model": "^a.b$"}},  # a metacharacter: not indexed
    {"name": "fallback", "when": {}},  # not indexed
    {"name": "b-late", "when": {"model": "^b$"}},  # indexed, shadowed by the fallback
]


def first_in_file_order(model: str, text: str) -> str:
    """The script the pre-index matcher picked: a plain scan with `re.search`."""
    for script in ORDER_SCRIPTS:
        seen = {"model": model, "user": text}
        if all(re.search(p, seen[key]) for key, p in script["when"].items()):
            return script["name"]
    raise AssertionError("the fallback matches everything")


@pytest.mark.parametrize(
    ("model", "text", "expected"),
    [
        ("a", "urgent", "a-urgent"),  # indexed before not indexed
        ("b", "urgent", "ab-urgent"),  # not indexed before indexed
        ("a", "other", "a-plain"),
        ("b", "plain", "b-plain"),  # indexed before a later not-indexed one
        ("b", "other", "fallback"),  # not indexed before a later indexed one
        ("axb", "urgent", "a.b"),
        ("a\n", "other", "a-plain"),  # `$` matches before a trailing newline
        ("a\n\n", "other", "fallback"),
        ("c", "urgent", "fallback"),
    ],
)
def test_first_match_in_file_order_wins_across_indexed_scripts(
    serve: Serve, model: str, text: str, expected: str
) -> None:
    scripts = [s | {"replies": [{"text": s["name"]}]} for s in ORDER_SCRIPTS]
    url = serve(scripts)
    assert first_in_file_order(model, text) == expected
    assert reply_of(url, model, [user(text)])["content"] == expected


def scripted(count: int) -> Scenario:
    """`count` scripts, each indexed by its own model and capturing the ticket id."""
    scripts = [
        Script.model_validate(
            {
                "name": f"s{i}",
                "when": {"model": f"^m{i}$", "user": TICKET},
                "replies": [{"text": "{ticket}"}],
            }
        )
        for i in range(count)
    ]
    return Scenario(source="memory", scripts=scripts)


def seconds_per_match(scenario: Scenario, requests: list[ChatRequest]) -> float:
    """Best of five rounds of one view and one match per request, per request."""
    rounds = []
    for _ in range(5):
        started = time.perf_counter()
        for request in requests:
            assert scenario.match(ConversationView.of(request)) is not None
        rounds.append(time.perf_counter() - started)
    return min(rounds) / len(requests)


def requests_for(count: int, size: int = 2000) -> list[ChatRequest]:
    """`size` requests for models picked at random among `count` scripts."""
    pick = random.Random(count)
    return [
        ChatRequest.model_validate(
            {"model": f"m{pick.randrange(count)}", "messages": [user("Ticket id: T-9 help")]}
        )
        for _ in range(size)
    ]


def test_match_cost_does_not_grow_with_the_number_of_indexed_scripts() -> None:
    few, many = scripted(5), scripted(5000)
    ratio = seconds_per_match(many, requests_for(5000)) / seconds_per_match(few, requests_for(5))
    assert ratio < 10, f"5,000 scripts match {ratio:.1f}x slower than 5"


# --- replies made line by line, and the reply's token cap ----------------------------------

ROUTER_LINES = {
    "name": "router",
    "when": {"system": "router"},
    "replies": [
        {
            "lines": [
                {"match": r"^(?P<ticket>T-\d+): .*charged", "text": "{ticket}: billing"},
                {"match": r"^(?P<ticket>T-\d+): ", "text": "{ticket}: {label}"},
            ]
        }
    ],
}


def test_a_lines_reply_answers_exactly_the_lines_of_the_request_a_rule_matches(
    serve: Serve,
) -> None:
    script = ROUTER_LINES | {"when": {"system": "router (?P<label>\\w+)"}}
    url = serve([script])
    batch = "T-7: I was charged twice\nnot a ticket line\nT-9: the app crashes\nT-3: charged"
    system = {"role": "system", "content": "router other"}
    assert reply_of(url, "m", [system, user(batch)])["content"] == (
        "T-7: billing\nT-9: other\nT-3: billing"
    )
    assert reply_of(url, "m", [system, user("T-12: hello")])["content"] == "T-12: other"


def test_max_lines_stops_a_lines_reply_and_lines_go_with_nothing_else(
    serve: Serve, tmp_path: Path
) -> None:
    rules = [{"match": r"^(?P<ticket>T-\d+)", "text": "{ticket}: bug"}]
    url = serve([{"name": "tired", "replies": [{"lines": rules, "max_lines": 2}]}])
    batch = "\n".join(f"T-{n}: text" for n in range(5))
    assert reply_of(url, "m", [user(batch)])["content"] == "T-0: bug\nT-1: bug"
    for bad in (
        {"lines": rules, "text": "x"},
        {"text": "x", "max_lines": 2},
        {"lines": [{"match": "(", "text": "x"}]},
        {"lines": [{"match": "T", "text": "{nope}"}]},
    ):
        path = tmp_path / "bad.yaml"
        path.write_text(yaml.safe_dump([{"name": "bad", "replies": [bad]}]))
        with pytest.raises(ScenarioError):
            load_scenario(path)


def test_a_reply_longer_than_max_tokens_is_cut_there_with_finish_reason_length(
    serve: Serve,
) -> None:
    long_text = " ".join(f"word{n}" for n in range(200))
    fixed = {"prompt_tokens": 10, "completion_tokens": 500}
    scripted = {"text": long_text, "usage": fixed}
    url = serve(
        [
            {"name": "long", "when": {"user": "long"}, "replies": [{"text": long_text}]},
            {"name": "fixed", "when": {"user": "fixed"}, "replies": [scripted]},
        ]
    )
    cut = chat(url, "m", [user("long")], max_tokens=17).json()
    assert cut["choices"][0]["finish_reason"] == "length"
    assert cut["usage"]["completion_tokens"] == 17
    text = cut["choices"][0]["message"]["content"]
    assert tokens.count(text) == 17 and long_text.startswith(text)
    newer = chat(url, "m", [user("long")], max_completion_tokens=9, max_tokens=50).json()
    assert newer["usage"]["completion_tokens"] == 9
    whole = chat(url, "m", [user("long")], max_tokens=tokens.count(long_text)).json()
    assert whole["choices"][0]["finish_reason"] == "stop"
    assert whole["choices"][0]["message"]["content"] == long_text
    unset = chat(url, "m", [user("long")]).json()
    assert unset["choices"][0]["message"]["content"] == long_text
    capped = chat(url, "m", [user("fixed")], max_tokens=17).json()
    assert capped["choices"][0]["finish_reason"] == "length"
    assert capped["usage"]["completion_tokens"] == 17  # no more than the cap it was sent
