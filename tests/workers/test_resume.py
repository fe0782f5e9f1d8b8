"""Crash and resume across real processes, cancel through a sub-agent, malformed calls."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.workers.conftest import RunScenario
from workers import chapter, chapter_tools, loop, trace
from workers.cancel import CancelToken
from workers.errors import Superseded
from workers.fence import Fence
from workers.model.client import ModelClient
from workers.provider import running_provider
from workers.settings import HarnessSettings
from workers.state import AgentStatus, RunState, new_run

PLAN_WITH_HANG = """
- name: plan
  when: {model: "^plan$"}
  faults: [{turn: 2, hang_ms: 3000, times: 1}]
  replies:
    - tool_calls: [{id: c1, name: list_files, arguments: {}}]
    - tool_calls: [{id: c2, name: read_file, arguments: {path: errors.log}}]
    - text: "errors.log mentions a timeout: worker 7 timed out after 30000 ms."
"""

SLOW_CHILD = """
- name: research_runaway-child
  when: {model: "^research_runaway$", system: research assistant}
  latency_ms: 50
  after_last: repeat_last
  replies:
    - tool_calls: [{id: "c{turn}", name: list_files, arguments: {}}]
- name: research_runaway
  when: {model: "^research_runaway$"}
  replies:
    - tool_calls: [{id: r1, name: research, arguments: {question: "Which file?"}}]
    - text: "The research did not finish."
"""

BAD_CALLS = """
- name: badcalls
  when: {model: "^badcalls$"}
  replies:
    - tool_calls: [{id: b1, name: format_disk, arguments: {}}]
    - tool_calls: [{id: b2, name: read_file, arguments: "{not json"}]
    - tool_calls: [{id: b3, name: read_file, arguments: {file: errors.log}}]
    - text: "I could not use the tools."
"""


def _harness_cli(url: str, tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "LLM_BASE_URL": url}
    common = ["--trace", str(tmp_path / "trace.jsonl"), "--workspace", str(tmp_path / "ws")]
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "harness", "plan", *common, *args, "--json"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(predicate, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


def _tool_results(path: Path) -> int:
    if not path.exists():
        return 0
    return sum(e["event"] == "tool_result" for e in trace.read(path))


def test_killed_process_resumes_without_paying_twice(
    run_scenario: RunScenario, tmp_path: Path
) -> None:
    baseline, _ = run_scenario("plan", trace=tmp_path / "baseline.jsonl")
    scenario = tmp_path / "plan.yaml"
    scenario.write_text(PLAN_WITH_HANG)
    state_file = tmp_path / "state.json"
    with running_provider(scenario) as url:
        first = _harness_cli(url, tmp_path, "--state", str(state_file))
        try:
            # After turn 2's tool ran, the third model call hangs: kill the process there.
            _wait_for(lambda: _tool_results(tmp_path / "trace.jsonl") == 2)
            time.sleep(0.1)
        finally:
            os.kill(first.pid, signal.SIGKILL)
            first.wait(10)
        assert first.returncode == -signal.SIGKILL
        saved = RunState.load(state_file)
        assert (saved.status, saved.turns, saved.tool_runs) == (AgentStatus.RUNNING, 2, 2)

        second = _harness_cli(url, tmp_path, "--resume", str(state_file))
        out, err = second.communicate(timeout=30)
    assert second.returncode == 0, err
    result = json.loads(out)
    events = trace.read(tmp_path / "trace.jsonl")
    assert [e["tool"] for e in events if e["event"] == "tool_start"] == ["list_files", "read_file"]
    assert result["status"] == "completed" and result["turns"] == 3
    assert (result["prompt_tokens"], result["completion_tokens"]) == (
        baseline.usage.prompt_tokens,
        baseline.usage.completion_tokens,
    )
    assert result["cost_usd"] == round(baseline.cost_usd, 8)


def test_cancel_stops_parent_and_child(run_scenario: RunScenario, tmp_path: Path) -> None:
    scenario = tmp_path / "child.yaml"
    scenario.write_text(SLOW_CHILD)
    with running_provider(scenario) as url:
        state, _ = run_scenario("research_runaway", url=url, cancel_after=0.15, max_turns=None)
    assert state.status is AgentStatus.INTERRUPTED
    assert state.interruption is not None and state.interruption.type == "cancelled"
    stops = [e for e in trace.read(tmp_path / "trace.jsonl") if e["event"] == "run_stopped"]
    assert [(bool(e.get("sub_agent")), e["status"]) for e in stops] == [
        (True, "interrupted"),
        (False, "interrupted"),
    ]


def test_malformed_calls_go_back_to_the_model_as_errors(
    run_scenario: RunScenario, tmp_path: Path
) -> None:
    scenario = tmp_path / "bad.yaml"
    scenario.write_text(BAD_CALLS)
    with running_provider(scenario) as url:
        state, _ = run_scenario("badcalls", url=url)
    assert state.status is AgentStatus.COMPLETED and state.tool_runs == 0
    results = [m.content or "" for m in state.messages if m.role == "tool"]
    assert "unknown tool 'format_disk'" in results[0]
    assert "not valid JSON" in results[1]
    assert "do not fit its schema" in results[2] and "path" in results[2]


@contextlib.contextmanager
def _plan_harness(harness_url: str, tmp_path: Path) -> Iterator[loop.Harness]:
    """The `plan` scenario's harness (demo workspace, state saved at tmp_path/"s") on a
    client of its own, closed afterwards."""
    opts = chapter.Options(scenario="plan", workspace=tmp_path / "ws", state=tmp_path / "s")
    chapter_tools.make_demo_workspace(opts.workspace)
    client = ModelClient(HarnessSettings(base_url=harness_url))
    try:
        yield chapter.build(opts, client, new_run("system", "task", model="plan"))
    finally:
        client.close()


def _served(harness_url: str) -> int:
    """Requests the scripted provider has answered so far."""
    return int(httpx.get(harness_url.replace("/v1", "/stats")).json()["requests"])


class _TakenOverAfter(Fence):
    """A fence another copy takes over once this one has saved `saves` times."""

    def __init__(self, saves: int) -> None:
        self.saves, self.superseded = saves, False

    def check(self) -> None:
        if self.superseded:
            raise Superseded("taken over", 1, 2)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        self.check()
        yield
        self.saves -= 1
        self.superseded = self.saves <= 0


def test_a_superseded_run_stops_before_its_next_model_call_and_saves_nothing(
    harness_url: str, tmp_path: Path
) -> None:
    """`plan` asks the model three times; a fence taken over after the first saved step
    (the first reply) lets the loop run the tool but not save its result, and never ask
    the model again: one request served, the state file as of that first save."""
    before = _served(harness_url)
    with _plan_harness(harness_url, tmp_path) as h:
        h.fence = _TakenOverAfter(saves=1)
        with pytest.raises(Superseded):
            loop.run(new_run("system", "task", model="plan"), h)
    assert _served(harness_url) - before == 1
    saved = RunState.load(tmp_path / "s")
    assert saved.turns == 1 and not any(m.role == "tool" for m in saved.messages)


class _Recording(Fence):
    """Lets every write through and notes what each one saved: (status, turns, durable)."""

    def __init__(self) -> None:
        self.saves: list[tuple[str, int, bool]] = []

    def append(self, path: str | os.PathLike[str], line: str, durable: bool = True) -> None:
        saved = json.loads(line)
        self.saves.append((saved["status"], saved["turns"], durable))
        super().append(path, line, durable)


def test_the_turn_that_ends_a_run_and_its_exit_are_one_durable_save(
    harness_url: str, tmp_path: Path
) -> None:
    """`plan` (three turns, two read-only tools): every paid turn is saved durably, and the
    last one carries the completed exit with it; no second file is written for the exit
    (one version appended less per agent run). A resume of that file pays nothing more."""
    with _plan_harness(harness_url, tmp_path) as h:
        h.fence = recording = _Recording()
        done = loop.run(new_run("system", "task", model="plan"), h)
        before = _served(harness_url)
        again = loop.run(RunState.load(tmp_path / "s"), h)
    assert done.status is AgentStatus.COMPLETED and done.turns == 3
    assert recording.saves == [
        ("running", 1, True),
        ("running", 1, False),  # list_files' result: read-only, derivable, no fsync
        ("running", 2, True),
        ("running", 2, False),
        ("completed", 3, True),  # the last turn and the exit, together
    ]
    saved = RunState.load(tmp_path / "s")
    assert (saved.status, saved.output, saved.error) == (AgentStatus.COMPLETED, done.output, None)
    assert again.status is AgentStatus.COMPLETED and _served(harness_url) == before


class _CancelsOnTurn(trace.Tracer):
    """A tracer that cancels the run as it traces turn `turn`: a cancel (a person's, the
    soft time limit) that lands just after the run's last reply was saved."""

    def __init__(self, path: Path, cancel: CancelToken, turn: int) -> None:
        super().__init__(path, "r")
        self.cancel, self.turn = cancel, turn

    def bind(self, **fields: object) -> trace.Tracer:
        return self

    def emit(self, event: str, **data: object) -> None:
        super().emit(event, **data)
        if event == "turn" and data.get("turn") == self.turn:
            self.cancel.cancel("cancelled: by a person")


def test_a_run_cancelled_as_its_last_reply_arrives_stops_without_an_output(
    harness_url: str, tmp_path: Path
) -> None:
    """The last reply is saved with the completed exit; a cancel that lands right after it
    still stops the run `interrupted`, with no output, in memory and in the file. A resume
    completes it from the saved reply and pays nothing more."""
    with _plan_harness(harness_url, tmp_path) as h:
        h.tracer = _CancelsOnTurn(tmp_path / "t.jsonl", h.cancel, turn=3)
        stopped = loop.run(new_run("system", "task", model="plan"), h)
        saved = RunState.load(tmp_path / "s")
        before = _served(harness_url)
        h.cancel, h.tracer = CancelToken(), trace.Tracer(tmp_path / "t.jsonl", "r")
        again = loop.run(RunState.load(tmp_path / "s"), h)
    assert (stopped.status, stopped.turns, stopped.output) == (AgentStatus.INTERRUPTED, 3, None)
    assert (saved.status, saved.turns, saved.output) == (AgentStatus.INTERRUPTED, 3, None)
    assert saved.interruption is not None and saved.interruption.type == "cancelled"
    assert again.status is AgentStatus.COMPLETED and again.output and again.turns == 3
    assert _served(harness_url) == before
