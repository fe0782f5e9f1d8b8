"""What small models actually send, through the whole harness loop over real HTTP: tool calls
written as text, replies cut off by the length limit, replies without usage."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.workers.model.test_client import _Canned
from workers import loop, trace
from workers.chapter_tools import ChapterFolder, make_demo_workspace
from workers.model.client import ModelClient
from workers.provider import running_provider
from workers.settings import HarnessSettings
from workers.state import AgentStatus, approve, new_run
from workers.tools import Catalog
from workers.trace import Tracer

TEXT_FORMS = {
    "bare json": '{"name": "list_files", "arguments": {}}',
    "hermes": '<tool_call>\n{"name": "list_files", "arguments": {}}\n</tool_call>',
    "fenced": '```json\n{"name": "list_files", "arguments": {}}\n```',
}


def _harness(url: str, tmp: Path, **options: Any) -> loop.Harness:
    files = ChapterFolder(make_demo_workspace(tmp / "ws"))
    return loop.Harness(
        client=ModelClient(HarnessSettings(base_url=url)),
        catalog=Catalog(files.tools()),
        tracer=Tracer(tmp / "trace.jsonl", "r1"),
        **options,
    )


def _scenario(tmp: Path, first_reply: str) -> Path:
    script = {
        "name": "texty",
        "replies": [{"text": first_reply}, {"text": "There are files: errors.log and more."}],
    }
    path = tmp / "s.yaml"
    path.write_text(yaml.safe_dump([script]))
    return path


@pytest.mark.parametrize("form", list(TEXT_FORMS))
def test_a_tool_call_written_as_text_is_run_as_that_call(tmp_path: Path, form: str) -> None:
    with running_provider(_scenario(tmp_path, TEXT_FORMS[form])) as url:
        state = loop.run(new_run("sys", "list the files", "m"), _harness(url, tmp_path))
    assert state.status is AgentStatus.COMPLETED
    assert state.tool_runs == 1 and "errors.log" in (state.output or "")
    events = trace.read(tmp_path / "trace.jsonl")
    parsed = [e for e in events if e["event"] == "tool_call_parsed"]
    assert parsed and parsed[0]["parsed_from_text"] is True and parsed[0]["tool"] == "list_files"


def test_the_text_fallback_can_be_turned_off(tmp_path: Path) -> None:
    with running_provider(_scenario(tmp_path, TEXT_FORMS["bare json"])) as url:
        harness = _harness(url, tmp_path, tool_call_text_fallback=False)
        state = loop.run(new_run("sys", "list the files", "m"), harness)
    assert state.status is AgentStatus.COMPLETED and state.tool_runs == 0
    assert state.output == TEXT_FORMS["bare json"]


def test_prose_that_mentions_json_stays_an_answer(tmp_path: Path) -> None:
    prose = 'Use {"name": "list_files"} in your config, then restart.'
    with running_provider(_scenario(tmp_path, prose)) as url:
        state = loop.run(new_run("sys", "help", "m"), _harness(url, tmp_path))
    assert state.status is AgentStatus.COMPLETED and state.output == prose


def _cut(text: str) -> dict[str, Any]:
    message = {"role": "assistant", "content": text}
    usage = {"prompt_tokens": 10, "completion_tokens": 5}
    return {"choices": [{"finish_reason": "length", "message": message}], "usage": usage}


def test_a_reply_cut_off_is_asked_again_once_then_fails_as_truncated(tmp_path: Path) -> None:
    with _Canned([_cut("The answer is"), _cut("The answer")]) as server:
        state = loop.run(new_run("sys", "q", "m"), _harness(server.url, tmp_path))
    assert state.status is AgentStatus.FAILED and (state.error or "").startswith("truncated")
    assert state.turns == 2 and state.output is None


def test_a_reply_cut_off_once_then_complete_is_the_answer(tmp_path: Path) -> None:
    done = {
        "choices": [{"finish_reason": "stop", "message": {"role": "assistant", "content": "42."}}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 2},
    }
    with _Canned([_cut("The answer is"), done]) as server:
        state = loop.run(new_run("sys", "q", "m"), _harness(server.url, tmp_path))
    assert state.status is AgentStatus.COMPLETED and state.output == "42."
    assert any("cut off" in (m.content or "") for m in state.messages if m.role == "user")


def test_usage_the_server_left_out_is_estimated_and_still_charged(tmp_path: Path) -> None:
    bare = {"choices": [{"finish_reason": "stop", "message": {"content": "fine, thanks"}}]}
    with _Canned([bare]) as server:
        state = loop.run(new_run("sys", "how are you", "m"), _harness(server.url, tmp_path))
    assert state.status is AgentStatus.COMPLETED and state.cost_usd > 0
    assert state.usage.estimated and state.usage.estimated_requests == 1
    (turn,) = [e for e in trace.read(tmp_path / "trace.jsonl") if e["event"] == "turn"]
    assert turn["estimated"] is True


def _read(call_id: str, path: str) -> dict[str, Any]:
    return {"id": call_id, "name": "read_file", "arguments": {"path": path}}


REUSED = {
    "name": "reused",
    "replies": [
        {"tool_calls": [_read("c1", "notes.txt"), _read("c1", "access.log")]},  # one reply
        {"tool_calls": [{"id": "c1", "name": "delete_file", "arguments": {"path": "notes.txt"}}]},
        {"text": "Read both, deleted notes.txt."},
    ],
}


def test_reused_call_ids_are_each_answered_and_a_reused_write_waits_for_approval(
    tmp_path: Path,
) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump([REUSED]))
    with running_provider(scenario) as url:
        harness = _harness(url, tmp_path)
        state = loop.run(new_run("sys", "tidy up", "m"), harness)
        stopped = state.interruption
        assert state.status is AgentStatus.INTERRUPTED and stopped is not None
        assert (stopped.type, stopped.call_id, stopped.tool) == ("approval", "c1-3", "delete_file")
        assert (tmp_path / "ws" / "notes.txt").exists()
        approve(state, "c1-3")
        state = loop.run(state, harness)
        seen = httpx.get(url.replace("/v1", "/stats")).json()
    assert state.status is AgentStatus.COMPLETED and not (tmp_path / "ws" / "notes.txt").exists()
    ids = [c.id for m in state.messages for c in m.tool_calls or []]
    answers = {m.tool_call_id: m.content or "" for m in state.messages if m.role == "tool"}
    assert ids == ["c1", "c1-2", "c1-3"] and len(answers) == 3 == state.tool_runs
    assert answers["c1"].startswith("Remember") and answers["c1-2"].startswith("GET /health")
    events = trace.read(tmp_path / "trace.jsonl")
    reused = [(e["given"], e["call_id"]) for e in events if e["event"] == "tool_call_id_reused"]
    assert reused == [("c1", "c1-2"), ("c1", "c1-3")]
    assert [e["call_id"] for e in events if e["event"] == "tool_result"] == ids
    assert seen["protocol_errors"] == {}  # no request a strict endpoint would refuse
