"""Gate, router parsing, inbox, workspace init, the report's one-liners and the shared model
client."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.config.workspace import init_demo
from orchestrator.steps import agent, gate, report, route
from workers.settings import HarnessSettings
from workers.trace import Tracer, read

FILLER = ["please wait a moment", "we will resolve this soon"]


def test_gate_reports_each_problem_in_a_stable_order() -> None:
    done = "Ticket T-1: your export is fixed; run it again from the reports page."
    assert gate.check("T-1", done, FILLER) == gate.GateResult(True, "")
    missing = gate.check("T-1", "Done. Please wait a moment.", FILLER)
    assert missing == gate.GateResult(
        False, "missing_ticket_id | filler_word:please wait a moment | too_short:27<40"
    )


def test_router_output_is_clamped_to_known_categories(tmp_path: Path) -> None:
    trace_file = tmp_path / "t.jsonl"
    text = "T-1: billing\nT-2: refund\n  T-3 :  bug  \nT-9: bug\nnot a line\nT-4: maybe a bug"
    found = route.parse(
        text,
        ["T-1", "T-2", "T-3", "T-4", "T-5"],
        ["billing", "bug", "other"],
        Tracer(trace_file, "r"),
    )
    # T-9 was not claimed; T-4's line is prose, no label; T-5 has no line: neither has a category.
    assert found == {"T-1": "billing", "T-2": "other", "T-3": "bug", "T-4": "", "T-5": ""}
    clamped = [e for e in read(trace_file) if e["event"] == "clamped"]
    assert [(e["ticket"], e["raw"]) for e in clamped] == [("T-2", "refund")]


def test_one_line_is_the_first_sentence_cut_at_22_characters() -> None:
    assert (
        report.one_line("Ticket T-1004: changing the invoice. More.") == "Ticket T-1004: changin…"
    )
    assert report.one_line("Short. Rest.") == "Short"


def test_init_never_overwrites_a_users_files(tmp_path: Path) -> None:
    created, kept = init_demo(tmp_path / "ws")
    assert len(created) >= 10 and not kept
    mine = tmp_path / "ws" / "inbox" / "T-1001.txt"
    mine.write_text("my own ticket")
    created, kept = init_demo(tmp_path / "ws")
    assert not created and mine in kept
    assert mine.read_text() == "my own ticket"


def test_the_soft_time_limit_must_stay_below_the_hard_one() -> None:
    from pydantic import ValidationError

    from orchestrator.config.environment import GraphSettings

    # Limits longer than the visibility timeout are fine: live workers' heartbeats keep
    # their messages from coming back.
    GraphSettings(soft_time_limit_s=50, time_limit_s=60, visibility_timeout_s=30)
    rule = "SOFT_TIME_LIMIT_S (60) must be less than TICKETGRAPH_TIME_LIMIT_S (60)"
    with pytest.raises(ValidationError, match=re.escape(rule)):
        GraphSettings(soft_time_limit_s=60, time_limit_s=60)


def test_one_model_client_per_endpoint_whichever_settings_object_names_it() -> None:
    """The same object, an equal one and the first again share a client; another endpoint
    gets its own, and naming the first after it does not hand back the other's."""
    first = HarnessSettings(base_url="http://127.0.0.1:9/v1")
    equal = HarnessSettings(base_url="http://127.0.0.1:9/v1")
    other = HarnessSettings(base_url="http://127.0.0.1:10/v1")
    client = agent.shared_client(first)
    assert agent.shared_client(first) is client and agent.shared_client(equal) is client
    elsewhere = agent.shared_client(other)
    assert elsewhere is not client and str(elsewhere.settings.base_url).endswith(":10/v1")
    assert agent.shared_client(first) is client and agent.shared_client(other) is elsewhere
