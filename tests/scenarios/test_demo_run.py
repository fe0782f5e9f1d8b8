"""The demo workspace end to end through the CLI, embedded broker and worker."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest

from orchestrator.config.workspace import init_demo
from orchestrator.run.store import RunStore
from orchestrator.steps.context import Context
from orchestrator.steps.review import ReviewLoop
from tests.conftest import (
    DEMO_SCENARIOS,
    GRAPH_EVENTS,
    REFERENCE_NODES,
    REFERENCE_TICKETS,
    Cli,
    demo_scripts,
    events,
    node_numbers,
    orphaned_redis_servers,
    state,
    ticket_rows,
    variant,
    write_scenarios,
)
from workers import versions
from workers.provider import running_provider
from workers.settings import HarnessSettings


def test_demo_run_reproduces_the_reference_table(demo: Path, cli: Cli) -> None:
    before = orphaned_redis_servers()
    done = cli("run", cwd=demo)
    assert done.returncode == 1, done.stderr
    record = state(demo)
    assert node_numbers(record) == REFERENCE_NODES
    assert ticket_rows(record) == REFERENCE_TICKETS
    t1004, t1005 = record["tickets"]["T-1004"], record["tickets"]["T-1005"]
    assert t1004["gate_reports"] == ["filler_word:please wait a moment"] * 2
    assert t1005["gate_reports"] == ["missing_ticket_id"]
    assert sorted(p.name for p in (demo / "out").glob("*.txt")) == [
        f"T-100{i}.txt" for i in range(1, 7)
    ]
    trace = events(demo)
    assert all(e["ts"] and e["run_id"] == record["run_id"] for e in trace)
    clamped = [e for e in trace if e["event"] == "clamped"]
    assert [(e["ticket"], e["raw"], e["category"]) for e in clamped] == [
        ("T-1006", "complaint", "other")
    ]
    assert sum(e["event"] in GRAPH_EVENTS for e in trace) == 39  # as in the seed's run
    # No worker declares angles: no vote, one draft state per drafted ticket.
    assert not [e for e in trace if e["event"] == "voted"]
    assert all(t["vote"] is None for t in record["tickets"].values())
    harness = [
        e for e in trace if e["event"] in ("turn", "tool_start", "tool_result", "run_stopped")
    ]
    assert harness and all(e["node"] in ("route", "fanout", "review") for e in harness)
    assert all(e.get("ticket") for e in harness if e["node"] != "route")
    out = done.stdout
    assert "=== Graph run summary ===" in out and "=== Per ticket ===" in out
    assert "T-1004 (no_progress)" in out and record["run_id"] in out
    routes = (
        "[route] T-1001=billing  T-1002=bug  T-1003=other  T-1004=billing  T-1005=bug  T-1006=other"
    )
    marks = [routes, "[fanout] pool size 2, 6 drafts", "[merge] wrote 6 files", "[review]", "==="]
    positions = [out.index(mark) for mark in marks]
    assert positions == sorted(positions), "progress lines print once each, in node order"
    assert orphaned_redis_servers() <= before, "the embedded redis-server outlived the run"


def test_all_pass_exits_zero(demo: Path, cli: Cli) -> None:
    (demo / "inbox" / "T-1004.txt").unlink()  # the router still names it: that line is ignored
    done = cli("run", cwd=demo)
    assert done.returncode == 0, done.stderr
    assert set(state(demo)["tickets"]) == set(REFERENCE_TICKETS) - {"T-1004"}


def test_stop_after_merge_then_resume_pays_only_for_review(demo: Path, cli: Cli) -> None:
    with running_provider(DEMO_SCENARIOS) as url:
        stopped = cli("run", "--stop-after", "merge", cwd=demo, env={"LLM_BASE_URL": url})
        assert stopped.returncode == 2, stopped.stderr
        record = state(demo)
        assert {t["status"] for t in record["tickets"].values()} == {"drafted"}
        assert "review" not in record["nodes"]
        drafts = demo / "runs" / record["run_id"] / "drafts"
        replies = sorted(p.name for p in (demo / "out").iterdir())
        assert replies == sorted(p.name for p in drafts.iterdir()) and len(replies) == 6
        for name in replies:  # merge published each draft as a second name of its file
            assert os.path.samefile(demo / "out" / name, drafts / name)
        firsts = {name: (drafts / name).read_text() for name in replies}
        stats = httpx.get(url.replace("/v1", "/stats")).json()
        assert stats["requests"] == 9  # the router once, eight drafting turns
        httpx.post(url.replace("/v1", "/stats/reset"))

        resumed = cli("resume", record["run_id"], cwd=demo, env={"LLM_BASE_URL": url})
        assert resumed.returncode == 1, resumed.stderr
        stats = httpx.get(url.replace("/v1", "/stats")).json()
    assert stats["requests"] == 2 and set(stats["scripts"]) == {"T-1004#2", "T-1005#2"}
    final = state(demo)
    assert final["run_id"] == record["run_id"]
    assert ticket_rows(final) == REFERENCE_TICKETS
    assert node_numbers(final) == REFERENCE_NODES
    # Review's rewrites replaced their out/ files; the run's first drafts are as they were.
    assert {name: (drafts / name).read_text() for name in firsts} == firsts
    assert (demo / "out" / "T-1005.txt").read_text() != firsts["T-1005.txt"]


def test_pool_size_bounds_requests_in_flight(tmp_path: Path, cli: Cli) -> None:
    seen = {}
    # Turns of 300 ms, not the demo's 60: a run's own work beside them (a few hundred ms on a
    # loaded machine) must not decide the ratio below.
    scripts = demo_scripts()
    for script in scripts:
        if "latency_ms" in script:
            script["latency_ms"] = 300
    slow = write_scenarios(tmp_path / "slow.yaml", scripts)
    with running_provider(slow) as url:
        for pool in (1, 2):
            demo = tmp_path / f"demo-{pool}"  # a run drains its inbox: one workspace each
            init_demo(demo)
            httpx.post(url.replace("/v1", "/stats/reset"))
            done = cli("run", cwd=demo, env={"LLM_BASE_URL": url, "POOL_SIZE": str(pool)})
            assert done.returncode == 1, done.stderr
            stats = httpx.get(url.replace("/v1", "/stats")).json()
            seen[pool] = (stats["max_in_flight"], state(demo)["nodes"]["fanout"]["ms"])
    assert seen[1][0] == 1 and seen[2][0] == 2
    # Eight 300 ms turns on one lane or two: about twice the wall time on one.
    assert seen[1][1] > 1.5 * seen[2][1]


def test_a_failing_ticket_is_recorded_and_the_batch_goes_on(
    demo: Path, cli: Cli, tmp_path: Path
) -> None:
    scripts = variant(demo_scripts(), "T-1002#1", faults=[{"status": 500}])
    with running_provider(write_scenarios(tmp_path / "faulty.yaml", scripts)) as url:
        done = cli("run", cwd=demo, env={"LLM_BASE_URL": url})
    assert done.returncode == 1, done.stderr
    record = state(demo)
    failed = record["tickets"]["T-1002"]
    assert (failed["stop"], failed["status"]) == ("worker_failed", "needs_human")
    assert "HTTP 500" in failed["error"]
    rows = ticket_rows(record)
    for ticket in ("T-1001", "T-1003", "T-1004", "T-1005", "T-1006"):
        assert rows[ticket] == REFERENCE_TICKETS[ticket]
    assert {"merge", "review", "report"} <= set(record["nodes"])
    assert not (demo / "out" / "T-1002.txt").exists()
    assert "T-1002 (worker_failed)" in done.stdout


def test_a_router_failure_crashes_the_run_with_exit_3(demo: Path, cli: Cli, tmp_path: Path) -> None:
    scripts = variant(demo_scripts(), "router", faults=[{"status": 500}])
    with running_provider(write_scenarios(tmp_path / "faulty.yaml", scripts)) as url:
        done = cli("run", cwd=demo, env={"LLM_BASE_URL": url})
    assert done.returncode == 3
    assert "HTTP 500" in done.stderr
    record = state(demo)
    assert record["status"] == "crashed" and "HTTP 500" in record["error"]
    assert [e for e in events(demo) if e["event"] == "run_crashed"]


def test_request_settings_per_role_and_their_environment_overrides(
    demo: Path, cli: Cli, tmp_path: Path
) -> None:
    """The router asks with [harness.router]'s settings, the workers with [harness]'s;
    LLM_MODEL and LLM_MAX_TOKENS override both, and the reference verdict is unchanged
    (the scripted provider cuts a reply at max_tokens: 128 holds the demo's longest)."""
    with running_provider(DEMO_SCENARIOS) as url:
        assert cli("run", cwd=demo, env={"LLM_BASE_URL": url}).returncode == 1
        params = httpx.get(url.replace("/v1", "/stats")).json()["params"]
        assert params["router: max_tokens=512 temperature=0.0"] == 1
        assert params["T-1001#1: max_tokens=1024 temperature=0.2"] == 2
        other = tmp_path / "other"
        init_demo(other)
        httpx.post(url.replace("/v1", "/stats/reset"))
        env = {"LLM_BASE_URL": url, "LLM_MODEL": "small-1", "LLM_MAX_TOKENS": "128"}
        assert cli("run", cwd=other, env=env).returncode == 1
        params = httpx.get(url.replace("/v1", "/stats")).json()["params"]
    assert params["router: max_tokens=128 temperature=0.0"] == 1
    assert params["T-1001#1: max_tokens=128 temperature=0.2"] == 2
    assert ticket_rows(state(other)) == REFERENCE_TICKETS
    agents = other / "runs" / state(other)["run_id"] / "agents"
    models = {versions.read_json(p)["model"] for p in agents.glob("*.json")}
    assert models == {"small-1"}


ROLE_KEYS = {
    "bug": "max_turns = 1  # the bug worker needs two turns (read_file, then the reply)",
    "billing": "budget_usd = 0.002         # its first reply costs about $0.0027: no second call\n"
    'model = "billing-large"',
}


def with_keys(text: str, table: str, keys: str) -> str:
    """ticketgraph.toml's `text` with `keys` added to its table `table`."""
    return text.replace(f"[{table}]\n", f"[{table}]\n{keys}\n", 1)


def test_turn_caps_budgets_models_and_prompts_per_role(demo: Path, cli: Cli) -> None:
    """[workers.bug] and [workers.billing] set their own turn cap, budget and model, and
    [harness.router] its own prompt; each stop keeps its own reason (not worker_failed),
    and the other roles keep [harness]'s settings."""
    (demo / "prompts").mkdir(exist_ok=True)
    (demo / "prompts" / "router.md").write_text(
        "You are the ticket router of ACME. Use only: {categories}.\n"
        "Output: one `<ticket id>: <category>` line per ticket.\n"
    )
    config = demo / "ticketgraph.toml"
    text = config.read_text().replace(
        "[harness.router]", '[harness.router]\nprompt_file = "prompts/router.md"\n#', 1
    )
    for worker, keys in ROLE_KEYS.items():
        text = with_keys(text, f"workers.{worker}", keys)
    config.write_text(text)
    done = cli("run", cwd=demo)
    assert done.returncode == 1, done.stderr
    record = state(demo)
    stops = {i: (t["stop"], t["status"]) for i, t in record["tickets"].items()}
    assert stops["T-1002"] == stops["T-1005"] == ("max_turns", "needs_human")
    assert stops["T-1001"] == stops["T-1004"] == ("budget", "needs_human")
    assert stops["T-1003"] == stops["T-1006"] == ("gate_pass", "pass")
    agents = demo / "runs" / record["run_id"] / "agents"

    def agent(name: str) -> dict:
        return versions.read_json(agents / f"{name}.json")

    router = agent("_router.route")
    assert router["messages"][0]["content"].startswith(  # each worker's description too
        "You are the ticket router of ACME. Use only: billing (charges, refunds, invoices and "
        "payment), bug (a product defect or an error in the app), other."
    )
    assert router["model"] == "demo" and agent("T-1002.draft")["model"] == "demo"
    assert agent("T-1001.draft")["model"] == "billing-large"
    assert agent("T-1001.draft")["usage"]["requests"] == 1
    assert agent("T-1002.draft")["usage"]["requests"] == 1
    assert "T-1002 (max_turns)" in done.stdout and "T-1001 (budget)" in done.stdout


def test_a_prompt_file_that_cannot_be_read_is_a_configuration_error(demo: Path, cli: Cli) -> None:
    config = demo / "ticketgraph.toml"
    text = config.read_text().replace(
        'prompt_file = "prompts/bug.md"', 'prompt_file = "prompts/none.md"'
    )
    config.write_text(text)
    done = cli("run", cwd=demo)
    assert done.returncode == 78
    assert "[workers.bug] prompt_file 'prompts/none.md'" in done.stderr
    assert done.stderr.count("\n") == 1
    assert len(list((demo / "inbox").iterdir())) == 6  # nothing claimed


def test_the_report_shows_cost_per_node_ticket_and_run_at_the_configured_prices(
    demo: Path, cli: Cli, tmp_path: Path
) -> None:
    """$2/$12 per million by default: route is 624 in + 96 out = $0.0024. A local model
    priced at zero in [prices.models] costs nothing; LLM_PRICES overrides the file."""
    assert cli("run", cwd=demo).returncode == 1
    record = state(demo)
    assert record["nodes"]["route"]["cost_usd"] == pytest.approx((624 * 2 + 96 * 12) / 1e6)
    per_ticket = sum(
        t["draft"]["cost_usd"] + t["review"]["cost_usd"] for t in record["tickets"].values()
    )
    nodes_total = sum(n["cost_usd"] for n in record["nodes"].values())
    assert nodes_total == pytest.approx(per_ticket + record["nodes"]["route"]["cost_usd"])
    report = (demo / "runs" / record["run_id"] / "report.txt").read_text()
    assert f"Cost of the run: ${nodes_total:.4f}" in report and "~" not in report

    free = tmp_path / "free"
    init_demo(free)
    config = free / "ticketgraph.toml"
    config.write_text(config.read_text().replace('# "qwen2.5-coder:0.5b"', '"demo"'))
    assert cli("run", cwd=free).returncode == 1
    assert sum(n["cost_usd"] for n in state(free)["nodes"].values()) == 0

    pricey = tmp_path / "pricey"
    init_demo(pricey)
    prices = '{"default": {"input_per_million": 4.0, "output_per_million": 24.0}}'
    assert cli("run", cwd=pricey, env={"LLM_PRICES": prices}).returncode == 1
    doubled = sum(n["cost_usd"] for n in state(pricey)["nodes"].values())
    assert doubled == pytest.approx(2 * nodes_total)


def test_costs_counted_from_replies_without_usage_are_marked(demo: Path, cli: Cli) -> None:
    from orchestrator.run.records import RunRecord
    from orchestrator.steps import report

    assert cli("run", cwd=demo).returncode == 1
    record = RunRecord.model_validate(state(demo))
    record.nodes["fanout"].estimated = 2
    text = report.render(record)
    assert "~$0.0273" in text and "(~: 2 replies came without usage" in text


def test_the_demo_over_anthropic_messages_gives_the_reference_table(demo: Path, cli: Cli) -> None:
    """LLM_API=anthropic: every call goes to /v1/messages (tool_use / tool_result blocks,
    input_tokens / output_tokens), and the run is the same as over chat completions."""
    with running_provider(DEMO_SCENARIOS) as url:
        env = {"LLM_BASE_URL": url, "LLM_API": "anthropic", "LLM_API_KEY": "test"}
        done = cli("run", cwd=demo, env=env)
        params = httpx.get(url.replace("/v1", "/stats")).json()["params"]
    assert done.returncode == 1, done.stderr
    record = state(demo)
    assert node_numbers(record) == REFERENCE_NODES
    assert ticket_rows(record) == REFERENCE_TICKETS
    assert params["router: max_tokens=512 temperature=0.0"] == 1  # Messages' own fields


def test_a_worker_that_writes_its_tool_call_as_text_still_gets_its_facts(
    demo: Path, cli: Cli
) -> None:
    """T-1001's billing worker writes `<tool_call>{...}</tool_call>` instead of a structured
    call (as small models do): the lookup runs, the draft passes, and the trace says the call
    was parsed from text. With tool_call_text_fallback = false it would be the answer."""
    scripts = demo_scripts()
    t1001 = next(s for s in scripts if s["name"] == "T-1001#1")
    call = '{"name": "lookup_order", "arguments": {"order_id": "A-77301"}}'
    t1001["replies"][0] = {
        "text": f"<tool_call>{call}</tool_call>",
        "usage": {"prompt_tokens": 781, "completion_tokens": 92},
    }
    write_scenarios(demo / "scenarios" / "demo.yaml", scripts)
    assert cli("run", cwd=demo).returncode == 1
    assert ticket_rows(state(demo)) == REFERENCE_TICKETS
    parsed = [e for e in events(demo) if e["event"] == "tool_call_parsed"]
    assert [(e["ticket"], e["tool"], e["parsed_from_text"]) for e in parsed] == [
        ("T-1001", "lookup_order", True)
    ]


def test_a_worker_that_hits_its_own_turn_cap_says_so(demo: Path, cli: Cli) -> None:
    """max_turns = 1: each worker's first turn is a tool call, so every worker stops at its
    cap; the ticket's stop is `max_turns`, not `worker_failed` (a dead provider)."""
    config = demo / "ticketgraph.toml"
    config.write_text(config.read_text().replace("max_turns = 6", "max_turns = 1"))
    assert cli("run", cwd=demo).returncode == 1
    tickets = state(demo)["tickets"]
    assert {i: t["stop"] for i, t in tickets.items() if t["handler"] != "template"} == {
        "T-1001": "max_turns",
        "T-1002": "max_turns",
        "T-1004": "max_turns",
        "T-1005": "max_turns",
    }
    assert "max_turns_exceeded" in tickets["T-1001"]["error"]


def test_the_report_gives_a_person_what_to_act_on(demo: Path, cli: Cli) -> None:
    """Needs-human tickets: the stop reason, the reply's first sentence up to 100
    characters (the record's one_line stays the seed's 22), and the last gate report."""
    assert cli("run", cwd=demo).returncode == 1
    record = state(demo)
    report = (demo / "runs" / record["run_id"] / "report.txt").read_text()
    line = next(x for x in report.splitlines() if x.startswith("  - T-1004 (no_progress): "))
    summary = line.removeprefix("  - T-1004 (no_progress): ")
    assert summary.startswith("Ticket T-1004: changing the recipient") and len(summary) == 101
    assert "      gate: filler_word:please wait a moment" in report
    assert record["tickets"]["T-1004"]["one_line"] == "Ticket T-1004: changin…"


def test_a_rewrites_own_tool_results_are_facts_at_the_next_check(demo: Path, cli: Cli) -> None:
    """The gate reads the ticket's facts when a check needs them, as they are then: an
    amount a rewrite looked up is supported at the check after that rewrite (a copy taken at
    the first check sent it back as unsupported, and the ticket ended `no_progress`)."""
    assert cli("run", cwd=demo).returncode == 1
    store = RunStore(demo / "runs" / state(demo)["run_id"])
    ctx = Context(store, HarnessSettings(), "review", "review")
    loop = ReviewLoop(ctx, "T-1002", store.ticket("T-1002"), ctx.tracer())
    loop.text = (
        "Ticket T-1002: the export job was stuck; we have refunded 123.45 for the month's "
        "plan while it was down."
    )
    assert loop.check().report == "unsupported_fact:123.45"
    lookup = {"role": "tool", "content": '{"invoice": "INV-9", "amount_cents": 12345}'}
    store.agent_path("T-1002", "review-1").write_text(json.dumps({"messages": [lookup]}))
    assert loop.check().passed


def test_review_finds_a_tickets_tool_results_by_name_without_listing_agents(
    demo: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gate's facts are the ticket and every tool result its worker runs got. Review
    finds those runs by name: listing agents/ (every ticket's states) made each review cost
    grow with the run's size (16 ms a review at 15,000 files)."""
    assert cli("run", cwd=demo).returncode == 1
    store = RunStore(demo / "runs" / state(demo)["run_id"])
    ctx = Context(store, HarnessSettings(), "review", "review")
    other = store.agent_path("T-1002", "draft").read_bytes()
    store.agent_path("T-1001", "review-9").write_bytes(other)  # past max_rounds: not its own
    listed: list[str] = []

    def no_listing(path: object = ".") -> None:
        listed.append(str(path))
        raise AssertionError(f"review listed {path}")

    monkeypatch.setattr(os, "scandir", no_listing)
    monkeypatch.setattr(os, "listdir", no_listing)
    loop = ReviewLoop(ctx, "T-1001", store.ticket("T-1001"), ctx.tracer())
    facts = loop.sources.facts
    monkeypatch.undo()
    assert listed == []
    assert facts[0] == ctx.ticket_text("T-1001")
    assert any('"order_id": "A-77301"' in f or "A-77301" in f for f in facts[1:]), facts
    t1002 = [
        m["content"]
        for m in versions.newest(other, json.loads)["messages"]
        if m.get("role") == "tool"
    ]
    assert t1002 and not set(t1002) & set(facts)  # another ticket's results are not its facts
    names = [p.name for p in loop.worker_states()]
    assert names == ["T-1001.draft.json", *(f"T-1001.review-{k}.json" for k in (1, 2, 3))]
