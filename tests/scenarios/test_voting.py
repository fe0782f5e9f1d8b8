"""Voting between a worker's angles (seed 003, Level 2) end to end: the demo workspace whose
billing worker declares two angles, `plain` (the demo's billing prompt) and `warm`, run by
the CLI as a subprocess over the scripted provider; the trace, the report, the records, the
web view (a real `ticketgraph web` process) and `ticketgraph eval --ablate voting`.

The scripts: `warm` answers T-1001 and T-1004 with its own longer replies, every other
billing ticket as `plain` does (the demo's script matches the ticket, not the prompt).
T-1004: plain's draft has a filler phrase, warm's passes though longer -> warm wins.
T-1001: both pass -> the shorter, plain's, wins.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator.config.workspace import init_demo
from tests.conftest import Cli, demo_scripts, events, state, write_scenarios
from tests.orchestrator.web.conftest import run_id_of, web_server
from workers import versions

WARM_PROMPT = """\
You are a billing specialist who answers warmly, handling one ticket at a time.
Goal: establish the billing facts of this ticket and write a complete, kind reply in English.
Output format: one plain-text paragraph starting with "Ticket <ticket id>:".
Tool guidance: billing facts must come from lookup_order, called with the order id exactly \
as the ticket gives it.
Task limits: handle only the billing part; do not write filler such as "please wait a moment".
"""
WARM = "answers warmly"  # what the warm angle's scripts find in its system prompt
ORDERS = {"T-1001": "A-77301", "T-1004": "A-77420"}
WARM_REPLIES = {
    "T-1001": (
        "Ticket T-1001: I am sorry for the trouble a double charge causes. Order A-77301 was "
        "indeed charged twice this month, and the system flagged the second charge as a "
        "duplicate. The extra charge has been sent for refund to the same payment method; "
        "the timing depends on your card issuer, usually 3 to 5 business days. If it has not "
        "arrived by the fifth business day, reply to this ticket and we will take the "
        "transaction ID to the payment provider for you."
    ),
    "T-1004": (
        "Ticket T-1004: I understand how much a correct invoice matters for your records. "
        "Changing the recipient from a person to the company needs finance to cancel and "
        "reissue the invoice of order A-77420; that request is filed, and the new invoice "
        "will be sent in this ticket as soon as finance has reissued it."
    ),
}
WARM_USAGE = [
    {"prompt_tokens": 801, "completion_tokens": 93},
    {"prompt_tokens": 1150, "completion_tokens": 170},
]


def warm_scripts() -> list[dict[str, Any]]:
    """The warm angle's scripts for T-1001 and T-1004: a lookup, then its reply."""
    scripts = []
    for ticket, order in ORDERS.items():
        call = {"id": f"warm_{ticket}", "name": "lookup_order", "arguments": {"order_id": order}}
        reply = WARM_REPLIES[ticket]
        scripts.append(
            {
                "name": f"warm-{ticket}",
                "when": {"system": WARM, "user": f"^Ticket id: {ticket}\\b"},
                "replies": [
                    {"tool_calls": [call], "usage": WARM_USAGE[0]},
                    {"text": reply, "usage": WARM_USAGE[1]},
                ],
            }
        )
    return scripts


def with_angles(root: Path) -> Path:
    """Give a demo workspace's billing worker the angles plain and warm, and their scripts."""
    config = root / "ticketgraph.toml"
    text = config.read_text()
    assert text.count('prompt_file = "prompts/billing.md"\n') == 1
    text = text.replace('prompt_file = "prompts/billing.md"\n', "")
    text += (
        '\n[workers.billing.angles.plain]\nprompt_file = "prompts/billing.md"\n'
        '\n[workers.billing.angles.warm]\nprompt_file = "prompts/billing-warm.md"\n'
    )
    config.write_text(text)
    (root / "prompts" / "billing-warm.md").write_text(WARM_PROMPT)
    write_scenarios(root / "scenarios" / "demo.yaml", [*warm_scripts(), *demo_scripts()])
    return root


@pytest.fixture(scope="module")
def voted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The angled demo workspace after one real run, and what the run printed; the module's
    tests only read it."""
    from tests.orchestrator.web.conftest import run_cli

    root = with_angles(init_demo_at(tmp_path_factory.mktemp("voting") / "demo"))
    done = run_cli("run", cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr  # T-1004 passes now
    return root, done.stdout


def init_demo_at(root: Path) -> Path:
    init_demo(root)
    return root


def usage_of(name: str) -> tuple[int, int]:
    """(calls, tokens) a script's replies are scripted to cost, in the demo's file."""
    script = next(s for s in demo_scripts() if s["name"] == name)
    return len(script["replies"]), sum(sum(r["usage"].values()) for r in script["replies"])


def warm_usage(ticket: str) -> tuple[int, int]:
    """(calls, tokens) of the warm angle's draft of `ticket`."""
    replies = next(s for s in warm_scripts() if s["name"] == f"warm-{ticket}")["replies"]
    return len(replies), sum(sum(r["usage"].values()) for r in replies)


def test_the_gate_eliminates_a_draft_with_a_filler_phrase_even_if_shorter(
    voted: tuple[Path, str],
) -> None:
    root, _ = voted
    t1004 = state(root)["tickets"]["T-1004"]
    vote = t1004["vote"]
    assert vote["angle"] == "warm"
    plain, warm = vote["candidates"]
    assert (plain["angle"], plain["passed"]) == ("plain", False)
    assert plain["report"] == "filler_word:please wait a moment"
    assert (warm["angle"], warm["passed"], warm["report"]) == ("warm", True, "")
    assert plain["chars"] < warm["chars"]  # shorter, and still out
    assert "the only draft the gate passed" in vote["why"]
    assert "plain: filler_word:please wait a moment" in vote["why"]
    reply = (root / "out" / "T-1004.txt").read_text().strip()
    assert reply == WARM_REPLIES["T-1004"]
    assert (t1004["status"], t1004["stop"], t1004["gate_rounds"]) == ("pass", "gate_pass", 0)


def test_when_both_drafts_pass_the_shorter_wins(voted: tuple[Path, str]) -> None:
    root, _ = voted
    vote = state(root)["tickets"]["T-1001"]["vote"]
    plain, warm = vote["candidates"]
    assert plain["passed"] and warm["passed"]
    assert plain["chars"] < warm["chars"] and vote["angle"] == "plain"
    assert vote["why"].startswith("the shortest draft the gate passed (plain ")
    assert (root / "out" / "T-1001.txt").read_text().strip() != WARM_REPLIES["T-1001"]


def test_voted_is_in_run_jsonl_with_every_candidates_gate_report(voted: tuple[Path, str]) -> None:
    root, _ = voted
    trace = [e for e in events(root) if e["event"] == "voted"]
    by_ticket = {e["ticket"]: e for e in trace}
    assert sorted(by_ticket) == ["T-1001", "T-1004"] and len(trace) == 2  # billing's tickets
    t1004 = by_ticket["T-1004"]
    assert t1004["angle"] == "warm" and t1004["why"]
    reports = {c["angle"]: (c["passed"], c["report"]) for c in t1004["candidates"]}
    assert reports == {"plain": (False, "filler_word:please wait a moment"), "warm": (True, "")}
    assert all(e["run_id"] == state(root)["run_id"] and e["ts"] for e in trace)


def test_each_angle_ran_its_own_agent_loop_and_every_angle_is_paid_for(
    voted: tuple[Path, str],
) -> None:
    root, _ = voted
    record = state(root)
    agents = root / "runs" / record["run_id"] / "agents"
    for ticket in ORDERS:
        plain = versions.read_json(agents / f"{ticket}.draft-plain.json")
        warm = versions.read_json(agents / f"{ticket}.draft-warm.json")
        assert plain["status"] == warm["status"] == "completed"
        assert plain["run_id"] != warm["run_id"]  # two agent runs, each with its own trace
        assert (
            WARM in warm["messages"][0]["content"] and WARM not in plain["messages"][0]["content"]
        )
        assert not (agents / f"{ticket}.draft.json").exists()
    calls, tokens = (a + b for a, b in zip(usage_of("T-1001#1"), warm_usage("T-1001"), strict=True))
    draft = record["tickets"]["T-1001"]["draft"]
    assert (draft["calls"], draft["tokens"]) == (calls, tokens)
    costs = [c["usage"]["cost_usd"] for c in record["tickets"]["T-1001"]["vote"]["candidates"]]
    assert all(c > 0 for c in costs) and draft["cost_usd"] == pytest.approx(sum(costs))
    tickets = record["tickets"].values()
    fanout = record["nodes"]["fanout"]
    assert fanout["calls"] == sum(t["draft"]["calls"] for t in tickets)
    assert fanout["tokens"] == sum(t["draft"]["tokens"] for t in tickets)


def test_the_report_names_the_chosen_angle(voted: tuple[Path, str]) -> None:
    _, printed = voted
    assert "voted between a worker's angles:" in printed
    assert "  - T-1004: angle warm, the only draft the gate passed" in printed
    assert "  - T-1001: angle plain, the shortest draft the gate passed" in printed


def test_the_tickets_web_page_names_the_chosen_angle(voted: tuple[Path, str]) -> None:
    root, _ = voted
    run_id = run_id_of(root)
    with web_server(root, "--no-auth") as url:
        page = httpx.get(f"{url}/runs/{run_id}/tickets/T-1004")
        plain_page = httpx.get(f"{url}/runs/{run_id}/tickets/T-1002")
    assert page.status_code == 200
    assert '<dd class="angle">warm (the only draft the gate passed' in page.text
    assert "<h2>Vote</h2>" in page.text and "filler_word:please wait a moment" in page.text
    assert "draft-warm" in page.text and "draft-plain" in page.text  # both agent runs listed
    assert plain_page.status_code == 200 and "<h2>Vote</h2>" not in plain_page.text


def test_eval_ablate_voting_shows_what_the_vote_earns_and_costs(demo: Path, cli: Cli) -> None:
    with_angles(demo)
    done = cli("eval", "datasets/demo", "--ablate", "voting", "--json", cwd=demo, timeout=300)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["per_ticket"]["T-1004"]["statuses"] == ["pass"]  # warm's draft won
    without = document["ablations"]["voting"]
    # Without the vote T-1004 has only plain's draft, with its filler phrase: it needs a person.
    one = 1 / document["tickets"]
    assert without["deltas"]["pass_rate"]["delta"] == pytest.approx(-one)
    assert without["deltas"]["needs_person_rate"]["delta"] == pytest.approx(one)
    low, high = without["deltas"]["pass_rate"]["ci95"]
    assert low < -one < high
    assert without["cost_delta_per_ticket_usd"] < 0  # one angle's drafts fewer


def test_ablate_voting_without_angles_is_a_usage_error(demo: Path, cli: Cli) -> None:
    done = cli("eval", "datasets/demo", "--ablate", "voting", cwd=demo)
    assert done.returncode == 64
    assert "no worker of this workspace declares angles" in done.stderr


def test_check_lints_every_angle_and_refuses_a_lone_angle(demo: Path, cli: Cli) -> None:
    with_angles(demo)
    (demo / "prompts" / "billing-warm.md").write_text("Goal: be kind. Reply in English.\n")
    done = cli("check", cwd=demo)
    assert done.returncode == 0, done.stderr
    assert "angles, voted between: plain " in done.stdout
    assert (
        "warning: angle warm of worker billing's prompt states no tool guidance, no task limits"
        in done.stdout
    )
    assert "angle plain of worker billing's prompt" not in done.stdout
    assert "note: request_refund writes, and each angle runs its own calls" in done.stdout
    config = demo / "ticketgraph.toml"
    text = config.read_text()
    config.write_text(text[: text.index("\n[workers.billing.angles.warm]")] + "\n")
    lone = cli("check", cwd=demo)
    assert lone.returncode == 78
    assert "one angle is no vote" in lone.stderr
