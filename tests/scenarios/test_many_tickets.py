"""Many tickets in parallel: every record and every trace line survives concurrent writers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.conftest import Cli, drop, events, state, write_scenarios
from workers.provider import running_provider

COUNT, POOL = 30, 8
CATEGORIES = ("billing", "bug", "other")


def _scenarios(ids: list[str]) -> list[dict[str, Any]]:
    routes = "\n".join(f"{t}: {CATEGORIES[i % 3]}" for i, t in enumerate(ids))
    scripts: list[dict[str, Any]] = [
        {"name": "router", "when": {"system": "ticket router"}, "replies": [{"text": routes}]}
    ]
    for i, ticket in enumerate(ids):
        answer = {"text": f"Ticket {ticket}: this is known issue KI-88; use Export XLSX meanwhile."}
        first = (
            {
                "tool_calls": [
                    {"id": f"c{i}", "name": "lookup_order", "arguments": {"order_id": "A-77301"}}
                ]
            }
            if CATEGORIES[i % 3] == "billing"
            else answer
        )
        replies = [first, answer] if "tool_calls" in first else [first]
        scripts.append(
            {
                "name": ticket,
                "when": {"user": f"^Ticket id: {ticket}\\b"},
                "latency_ms": 20,
                "replies": replies,
            }
        )
    return scripts


def test_thirty_parallel_tickets_keep_every_record_and_line(
    demo: Path, cli: Cli, tmp_path: Path
) -> None:
    for old in (demo / "inbox").iterdir():
        old.unlink()
    ids = [f"T-{2000 + i}" for i in range(COUNT)]
    for ticket in ids:
        drop(demo / "inbox", f"{ticket}.txt", f"Customer text of {ticket}.\n")
    with running_provider(write_scenarios(tmp_path / "many.yaml", _scenarios(ids))) as url:
        done = cli("run", cwd=demo, env={"LLM_BASE_URL": url, "POOL_SIZE": str(POOL)})
        in_flight = httpx.get(url.replace("/v1", "/stats")).json()["max_in_flight"]
    assert done.returncode == 0, done.stderr + done.stdout
    assert 2 <= in_flight <= POOL
    # Many tickets are counted on the console, not listed (the list is in run-state.json).
    assert "[route] 30 tickets: billing=10  bug=10  other=10" in done.stdout
    assert "inbox/ received 30 tickets: T-2000 … T-2029" in done.stdout
    record = state(demo)
    assert sorted(record["tickets"]) == ids
    assert {t["status"] for t in record["tickets"].values()} == {"pass"}
    assert len(list((demo / "out").glob("T-2*.txt"))) == COUNT
    trace = events(demo)  # every line parses
    kinds = [e["event"] for e in trace]
    assert kinds.count("routed") == kinds.count("collected") == kinds.count("gate") == COUNT
    assert kinds.count("node_start") == kinds.count("node_end") == 5
    assert kinds.count("worker_done") == 2 * COUNT // 3
    assert {e["run_id"] for e in trace} == {record["run_id"]}
