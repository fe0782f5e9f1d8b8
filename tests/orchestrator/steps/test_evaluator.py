"""The optional model-based evaluator: after the deterministic gate, on drafts that pass it,
with its own model, prompt and budget, and a verdict read strictly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.config.workspace import CONFIG_FILE
from tests.conftest import (
    REFERENCE_TICKETS,
    Cli,
    demo_scripts,
    events,
    state,
    ticket_rows,
    write_scenarios,
)
from workers import versions

# The demo's [evaluator] table, turned on, with a model of its own.
ON = 'enabled = true\nmodel = "judge"'


def _evaluator(name: str, answer: str, ticket: str = "\\S+") -> dict[str, Any]:
    return {
        "name": name,
        "when": {"system": "last check before a support reply", "user": f"^Ticket {ticket}:"},
        "replies": [{"text": answer, "usage": {"prompt_tokens": 300, "completion_tokens": 3}}],
    }


def _run(demo: Path, cli: Cli, *evaluators: dict[str, Any], extra: list[Any] | None = None) -> int:
    config = demo / CONFIG_FILE
    config.write_text(config.read_text().replace("enabled = false", ON, 1))
    write_scenarios(
        demo / "scenarios" / "demo.yaml", [*evaluators, *(extra or []), *demo_scripts()]
    )
    return cli("run", cwd=demo).returncode


def test_an_evaluator_that_passes_everything_changes_no_verdict_and_is_paid_in_review(
    demo: Path, cli: Cli
) -> None:
    assert _run(demo, cli, _evaluator("judge", "PASS")) == 1
    record = state(demo)
    assert ticket_rows(record) == REFERENCE_TICKETS
    # Five drafts pass the gate (T-1004 never does): five evaluations, plus the 2 rewrites.
    assert record["nodes"]["review"]["calls"] == 2 + 5
    evaluated = [e for e in events(demo) if e["event"] == "evaluated"]
    assert len(evaluated) == 5 and {e["verdict"] for e in evaluated} == {"PASS"}
    agents = demo / "runs" / record["run_id"] / "agents"
    models = {versions.read_json(p)["model"] for p in agents.glob("*.evaluate-*.json")}
    assert models == {"judge"}


def test_a_verdict_that_is_not_pass_or_fail_stops_the_ticket_for_a_human(
    demo: Path, cli: Cli
) -> None:
    vague = _evaluator("vague", "Looks good to me, ship it!", "T-1002")
    assert _run(demo, cli, vague, _evaluator("judge", "PASS")) == 1
    t1002 = state(demo)["tickets"]["T-1002"]
    assert (t1002["status"], t1002["stop"]) == ("needs_human", "evaluator_unclear")
    assert "Looks good" in t1002["error"]
    assert state(demo)["tickets"]["T-1001"]["status"] == "pass"


def test_a_fail_goes_back_to_the_writer_like_a_gate_report(demo: Path, cli: Cli) -> None:
    strict = _evaluator("strict", "FAIL: promises a refund date no source gave", "T-1001")
    rewrite = {
        "name": "T-1001#2",
        "when": {"user": "^Your previous draft for ticket T-1001"},
        "replies": [{"text": "Ticket T-1001: order A-77301 was charged twice; refund requested."}],
    }
    assert _run(demo, cli, strict, _evaluator("judge", "PASS"), extra=[rewrite]) == 1
    t1001 = state(demo)["tickets"]["T-1001"]
    assert t1001["status"] == "needs_human" and t1001["stop"] == "no_progress"
    assert t1001["gate_reports"][0] == "evaluator:promises a refund date no source gave"
    assert t1001["gate_rounds"] == 1
