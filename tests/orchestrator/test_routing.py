"""The router's reply read leniently (what real models write) and decided strictly (only
claimed ids, only allowed categories, and a record of how each ticket was decided)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator import routing
from tests.orchestrator.conftest import Cli, demo_scripts, state, write_scenarios

ALLOWED = ["billing", "bug", "other"]


@pytest.mark.parametrize(
    "line",
    [
        "T-1001: billing",
        "- T-1001: billing",
        "* T-1001: billing",
        "1. T-1001: billing",
        "2) T-1001: billing",
        "**T-1001**: billing",
        "**T-1001: billing**",
        "`T-1001`: `billing`",
        '"T-1001": "billing"',
        "T-1001: Billing",
        "T-1001: BILLING.",
        "T-1001 - billing",
        "T-1001 — billing",
        "T-1001 → billing",
        "T-1001 -> billing",
        "T-1001 = billing",
        "  T-1001 :  billing  ",
    ],
)
def test_every_common_format_of_a_route_line_is_read(line: str) -> None:
    routes = routing.parse(line, ["T-1001"], ALLOWED)
    assert routes.decisions["T-1001"] == routing.Decision("billing", "matched")


def test_each_ticket_records_how_it_was_decided() -> None:
    text = "T-1: bug\nT-2: refund\nT-9: billing\nnot a line\nT-4: bug extra"
    routes = routing.parse(text, ["T-1", "T-2", "T-3", "T-4"], ALLOWED)
    assert routes.decisions == {
        "T-1": routing.Decision("bug", "matched"),
        "T-2": routing.Decision("other", "clamped", "refund"),
        "T-3": routing.Decision("other", "missing"),
        "T-4": routing.Decision("other", "missing"),  # not a route line
    }
    assert routes.unclaimed == ["T-9"]


def test_a_sloppy_router_still_routes_the_demo_and_the_report_says_what_it_guessed(
    demo: Path, cli: Cli
) -> None:
    """The issue's observed slips: bullets, bold ids, a capitalised label, a trailing dot,
    one ticket left out, one id that was never claimed."""
    sloppy = (
        "- T-1001: billing\n**T-1002**: bug\nT-1004: Billing\nT-1005: bug.\n"
        "T-1006: complaint\nT-7777: bug"
    )
    scripts = demo_scripts()
    router = next(s for s in scripts if s["name"] == "router")
    router["replies"][0]["text"] = sloppy
    write_scenarios(demo / "scenarios" / "demo.yaml", scripts)
    done = cli("run", cwd=demo)
    assert done.returncode == 1, done.stderr
    tickets = state(demo)["tickets"]
    decided = {i: (t["category"], t["routing"]) for i, t in tickets.items()}
    assert decided == {
        "T-1001": ("billing", "matched"),
        "T-1002": ("bug", "matched"),
        "T-1003": ("other", "missing"),
        "T-1004": ("billing", "matched"),
        "T-1005": ("bug", "matched"),
        "T-1006": ("other", "clamped"),
    }
    assert tickets["T-1006"]["routed_as"] == "complaint"
    run_dir = demo / "runs" / state(demo)["run_id"]
    events = (run_dir / "run.jsonl").read_text()
    assert '"event": "route_missing"' in events and '"unclaimed"' in events
    report = (run_dir / "report.txt").read_text()
    assert "T-1003: not named" in report and "T-1006: the router said 'complaint'" in report
