"""The scaled workload: its workspace, its expected totals, and its templated scenario."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.workload import Workload, build
from orchestrator.config import layers
from orchestrator.config.workspace import Workspace
from orchestrator.steps import batches, prompts
from workers import tokens
from workers.provider import load_scenario, running_provider

DEMO_INBOX = Path(__file__).resolve().parents[2] / "orchestrator" / "demo" / "inbox"


@pytest.fixture(scope="module")
def workloads(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Workload]:
    """Workspaces of 6, 12 and 1,000 tickets, built once for the module."""
    root = tmp_path_factory.mktemp("workloads")
    return {n: build(root / f"n{n}", n) for n in (6, 12, 1000)}


def test_the_inbox_holds_n_clones_of_the_demo_tickets(workloads: dict[int, Workload]) -> None:
    demo = sorted(DEMO_INBOX.glob("*.txt"))
    for n, workload in workloads.items():
        files = sorted((workload.root / "inbox").iterdir())
        assert [f.name for f in files] == [f"T-{100000 + k}.txt" for k in range(1, n + 1)]
        for k, path in enumerate(files, start=1):
            assert path.read_text() == demo[(k - 1) % 6].read_text()
    assert Workspace(workloads[12].root).config().graph.pool_size == 16


def test_six_clones_cost_what_the_reference_run_costs(workloads: dict[int, Workload]) -> None:
    six = workloads[6]
    assert six.calls == {"route": 1, "fanout": 8, "review": 2}
    assert six.tokens == 720 + 8903 + 3033  # DESIGN.md's reference run, node by node


def test_a_thousand_tickets_match_the_design_totals(workloads: dict[int, Workload]) -> None:
    """DESIGN.md's totals are a peer's, which routes in one call; ticketgraph routes in
    batches that fit the router's max_tokens, each paid like the one (624 + 96)."""
    thousand = workloads[1000]
    assert thousand.calls | {"route": 1} == {"route": 1, "fanout": 1334, "review": 333}
    assert (thousand.peer_calls, thousand.peer_tokens) == (1 + 1334 + 333, 1_990_100)
    routed = thousand.route_calls
    assert routed > 1 and thousand.tokens == 1_990_100 + (routed - 1) * 720
    # DESIGN.md's ideal, 5.26 s, is every stage's calls spread evenly over the 16 slots, after
    # one routing call; whole tickets on a greedy list schedule take 0.05 + 42 × 0.1 +
    # 21 × 0.05 s. ticketgraph's routing calls go 16 at a time: a wave of 50 ms each.
    waves = -(-routed // 16)
    assert thousand.critical_path_s(50, 16) == pytest.approx(5.26 + (waves - 1) * 0.05, abs=0.005)
    assert thousand.list_schedule_s(50, 16) == pytest.approx(5.30 + (waves - 1) * 0.05)
    assert thousand.critical_path_s(0, 16) == 0


def test_each_routing_batch_is_answered_about_its_own_tickets_within_max_tokens(
    workloads: dict[int, Workload],
) -> None:
    """The router answers each ticket line of a request with its demo ticket's label, so
    a batch of any size gets exactly its lines; ticketgraph's batches of the 1,000 fit
    the router's max_tokens."""
    thousand = workloads[1000]
    config = layers.declared(Workspace(thousand.root))
    texts = {t: d.text for t, d in zip(thousand.clone_ids(), thousand.clones(), strict=True)}
    plan = batches.for_run(config, texts).plan(thousand.clone_ids())
    assert len(plan) == thousand.route_calls
    with running_provider(Workspace(thousand.root).scenarios) as url:
        for batch in (plan[0], plan[-1], thousand.clone_ids()[5:8]):
            task = prompts.router_input([(t, texts[t]) for t in batch])
            body = ask(url, prompts.ROUTER, [{"role": "user", "content": task}], max_tokens=512)
            lines = body["choices"][0]["message"]["content"].splitlines()
            assert [line.split(": ")[0] for line in lines] == batch
            assert body["choices"][0]["finish_reason"] == "stop"
            assert tokens.count("\n".join(lines)) <= config.router_max_tokens
    labels = [line.split(": ")[1] for line in lines]
    assert labels == [d.label for d in thousand.clones()[5:8]]  # T-1006, T-1001, T-1002


def test_the_scenario_keeps_its_script_count_for_any_n(workloads: dict[int, Workload]) -> None:
    scenarios = {n: load_scenario(Workspace(w.root).scenarios) for n, w in workloads.items()}
    assert len({len(s.scripts) for s in scenarios.values()}) == 1
    for scenario in scenarios.values():
        assert {script.latency_ms for script in scenario.scripts} == {50}


def test_refuses_a_workspace_that_is_not_empty(tmp_path: Path) -> None:
    (tmp_path / "x").write_text("x")
    with pytest.raises(FileExistsError):
        build(tmp_path, 3)


# --- the templated scripts through a real provider -----------------------------------------


def ask(url: str, system: str, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """One chat completion in the workspace's model; the response body."""
    body = {"model": "demo", "messages": [{"role": "system", "content": system}, *messages]}
    body |= extra
    response = httpx.post(f"{url}/chat/completions", json=body, timeout=10)
    assert response.status_code == 200, response.text
    return response.json()


def test_a_clone_is_answered_under_its_own_id(tmp_path: Path) -> None:
    workload = build(tmp_path / "ws", 12, latency_ms=0)
    text = (workload.root / "inbox" / "T-100010.txt").read_text().strip()  # a T-1004 clone
    draft = [{"role": "user", "content": prompts.draft_input("T-100010", text)}]
    billing = layers.declared(Workspace(workload.root)).workers["billing"].prompt
    with running_provider(Workspace(workload.root).scenarios) as url:
        texts = [
            (t, (workload.root / "inbox" / f"{t}.txt").read_text()) for t in workload.clone_ids()
        ]
        routes = ask(
            url, prompts.ROUTER, [{"role": "user", "content": prompts.router_input(texts)}]
        )
        first = ask(url, billing, draft)["choices"][0]["message"]
        call = first["tool_calls"][0]
        tool = {"role": "tool", "tool_call_id": call["id"], "content": "{}"}
        second = ask(url, billing, [*draft, first, tool])
        previous = second["choices"][0]["message"]["content"]
        rewrite = prompts.rewrite_input("T-100010", previous, "filler: please wait a moment")
        again = ask(url, billing, [{"role": "user", "content": rewrite}])
    lines = routes["choices"][0]["message"]["content"].splitlines()
    assert len(lines) == 12 and lines[9] == "T-100010: billing"
    assert routes["usage"]["total_tokens"] == 720
    assert previous.startswith("Ticket T-100010: changing the invoice recipient")
    assert second["usage"] == {"prompt_tokens": 1133, "completion_tokens": 96, "total_tokens": 1229}
    assert again["choices"][0]["message"]["content"].startswith("Ticket T-100010: changing the")
