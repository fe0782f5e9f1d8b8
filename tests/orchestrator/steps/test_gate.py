"""The gate that junk cannot pass: each check on its own, then a real run where the workers
echo their prompt back."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config.workspace import CONFIG_FILE
from orchestrator.steps import gate, prompts
from tests.conftest import Cli, demo_scripts, state, write_scenarios

CUSTOMER = (
    'On the reports page I click "Export CSV" and the button keeps spinning; I waited five '
    "minutes and nothing happened. Chrome, company network."
)
SOURCES = gate.Sources(
    task=prompts.draft_input("T-1002", CUSTOMER),
    facts=[CUSTOMER, '{"order_id": "A-77301", "amount_cents": 39900, "charged_times": 2}'],
)
GOOD = (
    "Ticket T-1002: this is the known issue KI-88; the fix ships in 3.4.2. Until then use "
    "Export XLSX on the same page."
)


def _report(draft: str, **rules: object) -> str:
    return gate.check("T-1002", draft, [], SOURCES, gate.Rules(**rules)).report  # type: ignore[arg-type]


def test_a_good_reply_passes_every_check() -> None:
    assert _report(GOOD) == ""


@pytest.mark.parametrize(
    "echo",
    [
        prompts.draft_input("T-1002", CUSTOMER),  # the prompt itself
        f"Ticket T-1002: {CUSTOMER}",  # the customer's text back
        "Ticket id: T-1002\nCustomer's text: the export spins.",  # the prompt's labels
    ],
)
def test_an_echo_of_the_prompt_or_the_customer_fails(echo: str) -> None:
    assert "echo" in _report(echo).split(" | ")


def test_quoting_a_few_words_of_the_customer_is_not_an_echo() -> None:
    quoting = f"{GOOD} You said the button keeps spinning; that is the export queue."
    assert _report(quoting) == ""


@pytest.mark.parametrize(
    "junk",
    [
        '{"name": "lookup_order", "arguments": {"order_id": "A-77301"}}',
        '<tool_call>{"name": "read_file"}</tool_call> Ticket T-1002',
        '```json\n{"reply": "Ticket T-1002"}\n```',
    ],
)
def test_json_and_tool_calls_are_not_a_reply(junk: str) -> None:
    assert "not_prose" in _report(junk)


def test_length_bounds() -> None:
    assert _report("Ticket T-1002: ok.") == "too_short:18<40"
    assert _report(GOOD, max_chars=50).startswith("too_long:")


def test_facts_must_come_from_the_ticket_or_a_tool_result() -> None:
    supported = "Ticket T-1002: order A-77301 was charged twice, 399.00 each time; refunded."
    assert _report(supported) == ""
    invented = "Ticket T-1002: order A-99999 gets a refund of 120.00 today, as promised."
    assert _report(invented) == "unsupported_fact:A-99999 | unsupported_fact:120.00"


def test_facts_are_read_only_for_a_reply_that_names_an_id_or_an_amount() -> None:
    """Reading the facts means reading every agent state of the ticket: a review does it only
    when the reply names something to look up, and once a check."""
    reads: list[int] = []

    def load() -> list[str]:
        reads.append(1)
        return list(SOURCES.facts)

    def lazy_report(draft: str) -> str:
        sources = gate.Sources(task=SOURCES.task, load=load)
        return gate.check("T-1002", draft, [], sources, gate.Rules()).report

    assert lazy_report(GOOD) == "" and reads == []
    invented = "Ticket T-1002: order A-99999 gets a refund of 120.00 today, as promised."
    assert lazy_report(invented) == "unsupported_fact:A-99999 | unsupported_fact:120.00"
    assert reads == [1]
    supported = "Ticket T-1002: order A-77301 was charged twice, 399.00 each time; refunded."
    assert lazy_report(supported) == "" and reads == [1, 1]


def test_each_check_can_be_turned_off() -> None:
    junk = "Ticket T-1002: A-99999"
    assert _report(junk) == "too_short:22<40 | unsupported_fact:A-99999"
    assert _report(junk, off=frozenset(gate.CHECKS)) == ""


def test_an_unknown_check_in_the_config_is_a_configuration_error(demo: Path, cli: Cli) -> None:
    config = demo / CONFIG_FILE
    config.write_text(config.read_text().replace("off = []", 'off = ["echoes"]'))
    done = cli("run", cwd=demo)
    assert done.returncode == 78 and "echoes" in done.stderr


def test_workers_that_echo_their_prompt_need_a_human(demo: Path, cli: Cli) -> None:
    """The scripted bug worker answers T-1002 with its own prompt, drafts and rewrites: the
    run exits 1 with T-1002 needing a human and the echo check in its gate report."""
    echo = "Ticket id: T-1002\nCustomer's text: " + CUSTOMER
    scripts = demo_scripts()
    t1002 = next(s for s in scripts if s["name"] == "T-1002#1")
    t1002["replies"][1]["text"] = echo
    rewrite = {
        "name": "T-1002#2",
        "when": {"user": "^Your previous draft for ticket T-1002"},
        "replies": [{"text": echo}],
    }
    scripts.insert(0, rewrite)
    write_scenarios(demo / "scenarios" / "demo.yaml", scripts)
    done = cli("run", cwd=demo)
    assert done.returncode == 1, done.stderr
    ticket = state(demo)["tickets"]["T-1002"]
    assert ticket["status"] == "needs_human"
    assert ticket["stop"] == "no_progress" and "echo" in ticket["gate_reports"][0]
    others = {i: t["status"] for i, t in state(demo)["tickets"].items() if i != "T-1002"}
    assert others["T-1001"] == others["T-1005"] == "pass"
