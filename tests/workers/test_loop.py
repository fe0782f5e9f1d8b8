"""The chapter's measured claims, each through real HTTP to the scripted provider."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.workers.conftest import RunScenario
from workers import trace
from workers.state import AgentStatus


def _turns(path: Path, **match: object) -> list[dict]:
    return [
        e
        for e in trace.read(path)
        if e["event"] == "turn" and all(e.get(k) == v for k, v in match.items())
    ]


def test_plan_completes_in_three_turns_and_costs_what_the_usage_says(
    run_scenario: RunScenario, tmp_path: Path
) -> None:
    state, _ = run_scenario("plan")
    assert state.status is AgentStatus.COMPLETED
    assert (state.turns, state.tool_runs) == (3, 2)
    assert "errors.log" in state.output and "timed out" in state.output
    prompts = state.per_turn_prompt_tokens
    assert len(prompts) == 3 and prompts[0] < prompts[1] < prompts[2]
    turns = _turns(tmp_path / "trace.jsonl")
    expected = sum(t["prompt_tokens"] * 2.0 + t["completion_tokens"] * 12.0 for t in turns) / 1e6
    assert state.cost_usd == pytest.approx(expected, abs=1e-8)
    assert state.usage.prompt_tokens == sum(prompts)


def test_turn_cap_is_a_quadratic_dial(run_scenario: RunScenario) -> None:
    prompt_tokens = {}
    for cap in (8, 20, 50, 100):
        state, _ = run_scenario("runaway", max_turns=cap)
        assert state.status is AgentStatus.MAX_TURNS_EXCEEDED
        assert state.interruption is not None and state.interruption.type == "max_turns"
        assert state.turns == cap and state.output is None
        prompt_tokens[cap] = state.usage.prompt_tokens
    assert prompt_tokens[100] > 3.5 * prompt_tokens[50]


@pytest.mark.parametrize("budget", [0.01, 0.05, 0.25])
def test_budget_overshoots_by_less_than_one_turn(
    run_scenario: RunScenario, tmp_path: Path, budget: float
) -> None:
    state, _ = run_scenario("runaway", max_turns=None, budget=budget)
    assert state.status is AgentStatus.BUDGET_EXCEEDED
    assert state.interruption is not None and state.interruption.type == "max_budget"
    turns = _turns(tmp_path / "trace.jsonl")
    last_turn_cost = turns[-1]["cost_usd"] - turns[-2]["cost_usd"]
    assert budget <= state.cost_usd < budget + last_turn_cost


def test_recover_with_the_error_text_finds_the_answer(run_scenario: RunScenario) -> None:
    state, _ = run_scenario("recover", tool_errors="text")
    assert state.status is AgentStatus.COMPLETED
    assert state.output == "errors.log mentions a timeout."
    assert any("Call list_files" in (m.content or "") for m in state.messages if m.role == "tool")


def test_recover_with_a_bare_error_gives_up_politely(run_scenario: RunScenario) -> None:
    state, _ = run_scenario("recover", tool_errors="bare")
    assert state.status is AgentStatus.COMPLETED
    assert "do not know" in state.output


def test_recover_with_fatal_errors_fails_with_the_error(run_scenario: RunScenario) -> None:
    state, _ = run_scenario("recover", tool_errors="fatal")
    assert state.status is AgentStatus.FAILED
    assert "no such file: timeout.log" in state.error
    assert state.turns == 1 and state.output is None


def test_denied_read_retried_until_the_cap_without_classification(
    run_scenario: RunScenario,
) -> None:
    state, _ = run_scenario("denied", max_turns=12, retry_permanent=True)
    assert state.status is AgentStatus.MAX_TURNS_EXCEEDED
    assert not state.output
    assert state.tool_runs >= 11


def test_denied_read_classified_permanent_fails_after_one_run(run_scenario: RunScenario) -> None:
    state, _ = run_scenario("denied", max_turns=12)
    assert state.status is AgentStatus.FAILED
    assert state.tool_runs == 1 and state.turns == 1
    assert "permission denied" in state.error


def test_dedupe_saves_the_tool_run_not_the_turn(run_scenario: RunScenario) -> None:
    plain, _ = run_scenario("repeat")
    deduped, _ = run_scenario("repeat", dedupe=True)
    assert plain.status is deduped.status is AgentStatus.COMPLETED
    assert deduped.tool_runs == plain.tool_runs - 1
    assert deduped.turns == plain.turns
    assert deduped.cost_usd == pytest.approx(plain.cost_usd, abs=1e-12)


def test_dedupe_never_swallows_a_write(run_scenario: RunScenario, tmp_path: Path) -> None:
    state, _ = run_scenario("repeat_write", dedupe=True)
    assert state.status is AgentStatus.COMPLETED and state.tool_runs == 2
    notes = (tmp_path / "ws" / "notes.txt").read_text().splitlines()
    assert notes.count("rotate logs on Friday") == 2


def test_destructive_stops_for_approval_and_deletes_nothing(
    run_scenario: RunScenario, tmp_path: Path
) -> None:
    state, _ = run_scenario("destructive", state=tmp_path / "s.json")
    assert state.status is AgentStatus.INTERRUPTED
    i = state.interruption
    assert i is not None and (i.type, i.tool, i.args) == (
        "approval",
        "delete_file",
        {"path": "access.log"},
    )
    assert (tmp_path / "ws" / "access.log").exists()


def test_approve_resumes_from_disk_and_deletes_once(
    run_scenario: RunScenario, tmp_path: Path
) -> None:
    run_scenario("destructive", state=tmp_path / "s.json")
    state, _ = run_scenario("destructive", resume=tmp_path / "s.json", decision="approve")
    assert state.status is AgentStatus.COMPLETED and state.turns == 3
    assert state.output == "Deleted access.log to free space."
    assert not (tmp_path / "ws" / "access.log").exists()
    deletes = [
        e
        for e in trace.read(tmp_path / "trace.jsonl")
        if e["event"] == "tool_start" and e["tool"] == "delete_file"
    ]
    assert len(deletes) == 1


def test_reject_with_a_reason_reaches_the_transcript(
    run_scenario: RunScenario, tmp_path: Path
) -> None:
    state, _ = run_scenario(
        "destructive", decision="reject", reject_reason="access.log is evidence"
    )
    assert state.status is AgentStatus.COMPLETED
    assert (tmp_path / "ws" / "access.log").exists()
    tool_texts = [m.content or "" for m in state.messages if m.role == "tool"]
    assert any("declined" in t and "access.log is evidence" in t for t in tool_texts)
    assert state.output == "I did not delete anything: you declined the deletion."


def test_cancel_reaches_into_the_slow_tool(run_scenario: RunScenario, tmp_path: Path) -> None:
    state, wall_ms = run_scenario("slow", cancel_after=1.2)
    assert state.status is AgentStatus.INTERRUPTED
    assert state.interruption is not None and state.interruption.type == "cancelled"
    assert state.interruption.reason == "user pressed Stop"
    # The tool would run 3 s; stopping well under 100 ms after the cancel means the wait inside
    # the tool woke up, not that the tool finished.
    assert 0 <= wall_ms - 1200 < 100
    events = [e["event"] for e in trace.read(tmp_path / "trace.jsonl")]
    assert events.count("tool_progress") >= 2
    assert events.index("tool_progress") < events.index("run_stopped")


def test_every_trace_line_has_a_run_id_and_the_six_events_appear(
    run_scenario: RunScenario, tmp_path: Path
) -> None:
    runs = [run_scenario(name)[0] for name in ("plan", "destructive")]
    runs.append(run_scenario("slow", cancel_after=0.6)[0])
    events = trace.read(tmp_path / "trace.jsonl")
    assert all(e["run_id"] and e["ts"] and e["event"] for e in events)
    assert {e["run_id"] for e in events} == {r.run_id for r in runs}
    by_run = {r.run_id: [e["event"] for e in events if e["run_id"] == r.run_id] for r in runs}
    plan, destructive, slow = (by_run[r.run_id] for r in runs)
    assert plan[0] == "turn" and plan[-1] == "run_stopped"
    assert plan.count("tool_start") == plan.count("tool_result") == 2
    assert destructive[-2:] == ["approval_required", "run_stopped"]
    assert "tool_progress" in slow and slow[-1] == "run_stopped"
    stopped = next(
        e for e in events if e["event"] == "run_stopped" and e["run_id"] == runs[1].run_id
    )
    assert (stopped["status"], stopped["reason"]) == ("interrupted", "approval")


def test_research_sub_agent_returns_only_its_final_text(run_scenario: RunScenario) -> None:
    state, _ = run_scenario("research")
    assert state.status is AgentStatus.COMPLETED
    research = [m.content for m in state.messages if m.role == "tool"]
    assert research == ["errors.log: worker 7 timed out after 30000 ms."]


def test_runaway_child_stops_at_its_own_cap(run_scenario: RunScenario, tmp_path: Path) -> None:
    state, _ = run_scenario("research_runaway", budget=0.05)
    assert state.status is AgentStatus.COMPLETED
    events = trace.read(tmp_path / "trace.jsonl")
    child_stop = next(e for e in events if e["event"] == "run_stopped" and e.get("sub_agent"))
    assert child_stop["status"] == "max_turns_exceeded" and child_stop["turns"] == 6
    child_turns = [e for e in events if e["event"] == "turn" and e.get("sub_agent")]
    parent_turns = [e for e in events if e["event"] == "turn" and not e.get("sub_agent")]
    assert len(child_turns) == 6 and len(parent_turns) == 2
    # The child's spend is charged to the parent, and stays inside the parent's budget.
    assert child_stop["cost_usd"] < state.cost_usd < 0.05


def test_child_budget_is_capped_by_what_the_parent_has_left(
    run_scenario: RunScenario, tmp_path: Path
) -> None:
    # The parent's first turn costs about $0.001; the child's own limit ($0.05) is far above
    # what is left of $0.003, so the child must stop on the parent's remainder.
    state, _ = run_scenario("research_runaway", budget=0.003)
    events = trace.read(tmp_path / "trace.jsonl")
    child_stop = next(e for e in events if e["event"] == "run_stopped" and e.get("sub_agent"))
    assert child_stop["status"] == "budget_exceeded" and child_stop["turns"] < 6
    parent_first_turn = next(e for e in events if e["event"] == "turn" and not e.get("sub_agent"))
    left = 0.003 - parent_first_turn["cost_usd"]
    child_turns = [e for e in events if e["event"] == "turn" and e.get("sub_agent")]
    last_turn = child_turns[-1]["cost_usd"] - child_turns[-2]["cost_usd"]
    assert left <= child_stop["cost_usd"] < left + last_turn
    assert state.status is AgentStatus.BUDGET_EXCEEDED  # the parent then stops on its own budget
