"""A live run's page counts what its tickets paid while a step still works on them: a
ticket's record is written when its step ends, its agent's state after every paid turn.
`ticketgraph run` and `ticketgraph web` run as real processes over a scripted model whose
T-1001 draft takes long turns; the page is read while that draft is in its second turn."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from bench.web import big_run
from orchestrator.config.workspace import Workspace, init_demo
from orchestrator.run.records import ticket_spend
from orchestrator.web.catalog import Catalog
from tests.conftest import clean_env, demo_scripts, write_scenarios
from tests.orchestrator.web.conftest import PASSWORD, USER, command, run_id_of, web_server
from workers import versions
from workers.state import RunState
from workers.usage import RunUsage

pytestmark = pytest.mark.slow
TURN_MS = 6000  # each turn of T-1001's draft: the page is read inside the second


def slow_t1001(root: Path) -> Path:
    """The demo workspace, with T-1001's draft (a tool call, then the reply) slow."""
    init_demo(root)
    scripts = demo_scripts()
    next(s for s in scripts if s["name"] == "T-1001#1")["latency_ms"] = TURN_MS
    write_scenarios(root / "scenarios" / "demo.yaml", scripts)
    return root


def in_second_turn(state: Path, running: subprocess.Popen[str]) -> dict:
    """T-1001's draft state once its first turn is paid (its second is then under way)."""
    deadline = time.monotonic() + 90
    while True:
        assert running.poll() is None, running.communicate()
        assert time.monotonic() < deadline, "T-1001's draft did not pay its first turn"
        try:
            saved = versions.read_json(state)
        except (OSError, ValueError):
            saved = {}
        if saved.get("usage", {}).get("requests") == 1:
            return saved
        time.sleep(0.05)


def ticket_rows(page: str) -> dict[str, dict[str, str]]:
    """The tickets table: id -> calls, tokens, cost (data attributes) and the status shown."""
    rows = re.findall(
        r'data-calls="(\d+)" data-tokens="(\d+)" data-cost="([\d.e-]+)" data-ticket="([^"]+)">'
        r'.*?<td class="status"[^>]*>([^<]+)',
        page,
        re.S,
    )
    return {
        ticket: {"calls": calls, "tokens": tokens, "cost": cost, "status": status.strip()}
        for calls, tokens, cost, ticket, status in rows
    }


def summary(page: str) -> tuple[int, int, float]:
    found = re.search(
        r'class="summary" data-calls="(\d+)" data-tokens="(\d+)" data-cost="([^"]+)"', page
    )
    assert found, "the page has no summary"
    return int(found.group(1)), int(found.group(2)), float(found.group(3))


def step_rows(page: str) -> dict[str, tuple[int, int]]:
    """The steps table: node -> calls, tokens (a step counted later has none)."""
    table = page.split('<table class="steps">', 1)[1].split("</table>", 1)[0]
    rows = re.findall(r"<tr><td>(\w+)</td><td>\d+ ms</td><td>(\d+)</td><td>(\d+)</td>", table)
    return {name: (int(calls), int(tokens)) for name, calls, tokens in rows}


def test_a_ticket_being_drafted_shows_its_paid_turn_and_the_rows_add_up(tmp_path: Path) -> None:
    workspace = slow_t1001(tmp_path / "live")
    with web_server(workspace) as url:
        running = subprocess.Popen(
            command("run", "--quiet"),
            cwd=workspace,
            env={**clean_env(), "POOL_SIZE": "2"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            state = None
            deadline = time.monotonic() + 60
            while state is None:
                found = list((workspace / "runs").glob("run-*/agents/T-1001.draft.json"))
                state = found[0] if found else None
                assert running.poll() is None and time.monotonic() < deadline, "no draft started"
                time.sleep(0.05)
            run_dir = state.parent.parent
            first_turn = in_second_turn(state, running)
            page = httpx.get(f"{url}/runs/{run_dir.name}?per=100", auth=(USER, PASSWORD)).text
            still = versions.read_json(state)
            record = versions.read_json(run_dir / "records" / "T-1001.json")
            assert running.wait(timeout=120) == 1, running.communicate()
        finally:
            if running.poll() is None:
                running.kill()
                running.wait()
        ended = httpx.get(f"{url}/runs/{run_dir.name}?per=100", auth=(USER, PASSWORD)).text

    assert still["usage"]["requests"] == 1, "the page was not read during the second turn"
    assert record["status"] in ("claimed", "routed")  # the record is not written mid-step
    rows = ticket_rows(page)
    t1001 = rows["T-1001"]
    assert t1001["status"] == "drafting"
    assert int(t1001["calls"]) == 1
    usage = first_turn["usage"]
    assert int(t1001["tokens"]) == usage["prompt_tokens"] + usage["completion_tokens"] == 873
    assert first_turn["cost_usd"] > 0
    assert float(t1001["cost"]) == pytest.approx(first_turn["cost_usd"], abs=1e-8)

    calls, tokens, cost = summary(page)
    steps = step_rows(page)
    route_calls, route_tokens = steps["route"]
    assert sum(int(r["calls"]) for r in rows.values()) + route_calls == calls
    assert sum(int(r["tokens"]) for r in rows.values()) + route_tokens == tokens
    route_cost = json.loads((run_dir / "nodes" / "route.json").read_text())["cost_usd"]
    assert sum(float(r["cost"]) for r in rows.values()) + route_cost == pytest.approx(
        cost, abs=1e-6
    )
    assert "fanout" in steps, "the open draft step shows what it paid so far"
    assert sum(c for c, _ in steps.values()) == calls
    assert sum(t for _, t in steps.values()) == tokens

    done = ticket_rows(ended)
    assert done["T-1001"]["status"] == "pass" and int(done["T-1001"]["calls"]) == 2
    assert summary(ended)[0] == sum(c for c, _ in step_rows(ended).values())


def agent_state(path: Path, calls: int, tokens: int, cost: float) -> None:
    """An agent's saved state as the harness writes it (workers/state.py's RunState)."""
    usage = RunUsage(prompt_tokens=tokens - 1, completion_tokens=1, requests=calls)
    path.parent.mkdir(exist_ok=True)
    path.write_text(RunState(usage=usage, cost_usd=cost).model_dump_json())


def test_a_rewrite_in_flight_counts_and_final_or_ended_tickets_keep_their_records(
    tmp_path: Path, finished: Path
) -> None:
    """Review's rewrite of a drafted ticket adds what it paid, `in review`; a ticket with its
    verdict, and every ticket of an ended run, show their records only (agents unread)."""
    workspace = tmp_path / "live"
    (workspace / "runs").mkdir(parents=True)
    source = finished / "runs" / run_id_of(finished)
    run_dir = big_run(source, workspace / "runs", "run-20261201-000000-live", 6, live=True)
    drafted = versions.read_json(run_dir / "records" / "T-00001.json")
    drafted |= {
        "status": "drafted",
        "review": {},
        "draft": {"calls": 2, "tokens": 900, "cost_usd": 0.002},
    }
    (run_dir / "records" / "T-00001.json").write_text(json.dumps(drafted))
    agents = run_dir / "agents"
    agent_state(agents / "T-00001.draft.json", 2, 900, 0.002)  # counted in the record
    agent_state(agents / "T-00001.review-1.json", 1, 500, 0.001)  # its rewrite, paying
    final = versions.read_json(run_dir / "records" / "T-00002.json")
    assert final["status"] in ("pass", "needs_human")
    agent_state(agents / "T-00002.review-9.json", 50, 50_000, 5.0)  # not the record's

    view = Catalog(Workspace(workspace)).view(run_dir.name)
    rows = {row.id: row for row in view.tickets}
    assert rows["T-00001"].status == "drafted" and rows["T-00001"].shown_status == "in review"
    assert (rows["T-00001"].calls, rows["T-00001"].tokens) == (3, 1400)
    assert rows["T-00001"].cost_usd == pytest.approx(0.003)
    kept = ticket_spend(final)
    assert (rows["T-00002"].calls, rows["T-00002"].cost_usd) == (kept.calls, kept.cost_usd)
    assert rows["T-00002"].shown_status == final["status"]
    assert view.row.calls == sum(r.calls for r in view.tickets) + view.nodes["route"]["calls"]

    meta = json.loads((run_dir / "run.json").read_text())
    meta |= {"status": "stopped_early", "exit_code": 2}
    (run_dir / "run.json").write_text(json.dumps(meta))
    ended = {row.id: row for row in Catalog(Workspace(workspace)).view(run_dir.name).tickets}
    assert (ended["T-00001"].calls, ended["T-00001"].shown_status) == (2, "drafted")
