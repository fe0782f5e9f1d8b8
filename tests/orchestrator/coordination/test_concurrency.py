"""Bounded concurrency without lanes: at most POOL_SIZE tickets in flight across workers, and
a slow ticket holds up nobody but itself."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from orchestrator.broker.redis_server import RedisServer
from tests.conftest import Cli, drop, events, state, worker_processes, write_scenarios
from workers.provider import running_provider


def _inbox(workspace: Path, ids: list[str]) -> None:
    for old in (workspace / "inbox").iterdir():
        old.unlink()
    for ticket in ids:
        drop(workspace / "inbox", f"{ticket}.txt", f"Customer text of {ticket}.\n")


def _scripts(ids: list[str], latency_ms: dict[str, float]) -> list[dict[str, Any]]:
    """Every ticket is a bug answered in one turn after `latency_ms[ticket]`."""
    routes = "\n".join(f"{t}: bug" for t in ids)
    scripts: list[dict[str, Any]] = [
        {"name": "router", "when": {"system": "ticket router"}, "replies": [{"text": routes}]}
    ]
    for ticket in ids:
        scripts.append(
            {
                "name": ticket,
                "when": {"user": f"^Ticket id: {ticket}\\b"},
                "latency_ms": latency_ms[ticket],
                "replies": [{"text": f"Ticket {ticket}: known issue KI-88, use Export XLSX."}],
            }
        )
    return scripts


def _stats(url: str) -> dict[str, Any]:
    return httpx.get(url.replace("/v1", "/stats")).json()


def test_pool_size_bounds_tickets_in_flight_across_two_workers(
    demo: Path, cli: Cli, tmp_path: Path
) -> None:
    """Two worker processes with four threads each (8 slots) run a pool of 3: the provider
    never sees more than 3 drafting requests at once, and it does see 3."""
    ids = [f"T-{3000 + i}" for i in range(12)]
    _inbox(demo, ids)
    scenario = write_scenarios(tmp_path / "s.yaml", _scripts(ids, dict.fromkeys(ids, 150)))
    with RedisServer(tcp=True) as redis, running_provider(scenario) as url:
        env = {"TICKETGRAPH_BROKER_URL": redis.url, "LLM_BASE_URL": url}
        with worker_processes(env, tmp_path, ["a", "b"], processes=1, threads=4):
            done = cli("run", cwd=demo, env={**env, "POOL_SIZE": "3"})
            stats = _stats(url)
    assert done.returncode == 0, done.stderr + done.stdout
    assert stats["requests"] == 1 + len(ids)
    assert stats["max_in_flight"] == 3
    assert {t["status"] for t in state(demo)["tickets"].values()} == {"pass"}
    for name in ("a", "b"):  # both workers took drafting tasks
        assert "orchestrator.draft[" in (tmp_path / f"{name}.log").read_text(), name


def _at(event: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(event["ts"].replace("Z", "+00:00"))


def test_a_slow_ticket_delays_no_other_ticket(demo: Path, cli: Cli, tmp_path: Path) -> None:
    """Ten tickets, pool 2, one of them 20 times slower: the nine others are all drafted
    while the slow one is still with the model (no lane waits behind it)."""
    ids = [f"T-{4000 + i}" for i in range(10)]
    slow = ids[0]  # the first ticket: with lanes, every other ticket of its lane waits
    latency = {t: (3000 if t == slow else 150) for t in ids}
    _inbox(demo, ids)
    scenario = write_scenarios(tmp_path / "s.yaml", _scripts(ids, latency))
    with running_provider(scenario) as url:
        done = cli("run", cwd=demo, env={"LLM_BASE_URL": url, "POOL_SIZE": "2"})
    assert done.returncode == 0, done.stderr + done.stdout
    drafted = {e["ticket"]: _at(e) for e in events(demo) if e["event"] == "worker_done"}
    assert set(drafted) == set(ids)
    others_done = max(at for ticket, at in drafted.items() if ticket != slow)
    assert others_done < drafted[slow]
    fanout_ms = state(demo)["nodes"]["fanout"]["ms"]
    assert fanout_ms < 2 * latency[slow], fanout_ms
