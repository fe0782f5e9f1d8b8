"""A run's totals are what was paid, however it ended, and every view shows the same numbers;
and a broker that lost the run's keys without an error (FLUSHALL) is noticed.

Real processes: a private Redis, the scripted provider (its /stats is the bill), a
`ticketgraph worker` process, `run`, `cancel`, `status`, `runs` and `resume` as subprocesses,
and `ticketgraph web` serving its pages and /metrics over HTTP.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.broker.redis_server import RedisServer
from orchestrator.run.records import RunMeta
from tests.conftest import (
    REFERENCE_TICKETS,
    Cli,
    demo_scripts,
    start_run,
    state,
    ticket_rows,
    wait_for,
    worker_processes,
    write_scenarios,
)
from tests.orchestrator.web.conftest import PASSWORD, USER, web_server
from workers.pricing import PER_MILLION
from workers.provider import running_provider

HANG_MS = 30_000
OUTAGE_S = 15  # TICKETGRAPH_BROKER_OUTAGE_S of the FLUSHALL test: the loss is noticed within it


def _scripts(hang_turn: int, tickets: tuple[str, ...], latency_ms: float = 0) -> Any:
    """The demo's scripts; `tickets`' drafts hang HANG_MS at their request `hang_turn`
    (0: the first), once; every request takes `latency_ms` besides."""
    scripts = demo_scripts()
    for script in scripts:
        script["latency_ms"] = max(script.get("latency_ms", 0), latency_ms)
        if script["name"] in {f"{t}#1" for t in tickets}:
            script["faults"] = [{"turn": hang_turn, "hang_ms": HANG_MS, "times": 1}]
    return scripts


def _stats(llm: str) -> dict[str, Any]:
    return httpx.get(llm.replace("/v1", "/stats")).json()  # type: ignore[no-any-return]


def _bill(llm: str, run_dir: Path) -> tuple[int, int, float]:
    """What the provider served and charged for: (replies, tokens, USD at the run's prices).
    Every request of the demo is for one model, at one price."""
    stats = _stats(llm)
    config = RunMeta.model_validate_json((run_dir / "run.json").read_bytes()).config
    assert config.prices is not None and not config.prices.models
    price = config.prices.default
    usd = (
        stats["prompt_tokens"] * price.input_per_million
        + stats["completion_tokens"] * price.output_per_million
    ) / PER_MILLION
    replies = stats["requests"] - stats["abandoned"]
    return replies, stats["prompt_tokens"] + stats["completion_tokens"], usd


def _metrics(url: str, run_id: str) -> dict[str, float]:
    """The run's own series of /metrics (name without `ticketgraph_run_`), and the tickets by
    status across the workspace (`tickets:<status>`)."""
    text = httpx.get(f"{url}/metrics", auth=(USER, PASSWORD)).text
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("run_id") == run_id:
                found[sample.name.removeprefix("ticketgraph_run_")] = sample.value
            elif sample.name == "ticketgraph_tickets":
                found[f"tickets:{sample.labels['status']}"] = sample.value
    return found


def test_a_run_cancelled_mid_fan_out_costs_what_the_provider_billed_in_every_view(
    broker: str, demo: Path, tmp_path: Path, cli: Cli
) -> None:
    # T-1001's and T-1002's drafts pay their first request; their second hangs until the
    # cancel cuts it (the provider bills nothing for a request its client left).
    scenario = write_scenarios(tmp_path / "s.yaml", _scripts(1, ("T-1001", "T-1002"), 50))
    with running_provider(scenario) as llm:
        env = {"TICKETGRAPH_BROKER_URL": broker, "LLM_BASE_URL": llm}
        with worker_processes(env, tmp_path, ["w1"], threads=2):
            run = start_run(demo, env, tmp_path / "run.log")
            wait_for("two second requests in flight", lambda: _stats(llm)["in_flight"] >= 2)
            run_dir = next((demo / "runs").glob("run-*"))
            cancelled = cli("cancel", run_dir.name, "--reason", "drill", cwd=demo, env=env)
            assert cancelled.returncode == 0, cancelled.stderr
            assert run.wait(60) == 2, (tmp_path / "run.log").read_text()
        replies, tokens, bill = _bill(llm, run_dir)
        assert _stats(llm)["abandoned"] == 2 and replies == 3  # the router, two first turns
    assert bill > 0.0024  # more than the router's call: what the old totals showed

    shown = json.loads(cli("status", "--json", cwd=demo).stdout)
    assert shown["verdict"] == "stopped"
    assert shown["cost_usd"] == pytest.approx(bill, abs=1e-9)
    assert shown["by_status"].get("needs_human") == 2  # the two cancelled in flight
    listed = json.loads(cli("runs", "--json", cwd=demo).stdout)
    assert listed[0]["cost_usd"] == pytest.approx(bill, abs=1e-9)
    assert listed[0]["need_a_human"] == 2
    verdict_line = (tmp_path / "run.log").read_text().strip().splitlines()[-1]
    assert verdict_line.endswith(f"${bill:.4f}"), verdict_line
    assert "2 needs_human" in verdict_line
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["totals"]["calls"] == replies and meta["totals"]["tokens"] == tokens

    with web_server(demo) as url:
        page = httpx.get(f"{url}/runs/{run_dir.name}", auth=(USER, PASSWORD)).text
        metrics = _metrics(url, run_dir.name)
    head = re.search(r"(\d+) tickets · (\d+) model calls · (\d+) tokens\s+· \$([\d.]+)", page)
    assert head is not None, page
    assert head.groups() == ("6", str(replies), str(tokens), f"{bill:.4f}")
    # The counts (run.json's totals) and the table (the records) say the same.
    assert '<span data-status="needs_human">2</span>' in page
    assert page.count('<td class="status">needs_human</td>') == 2
    assert metrics["cost_usd"] == pytest.approx(bill, abs=1e-9)
    assert (metrics["model_calls"], metrics["tokens"]) == (replies, tokens)
    assert metrics["need_a_human"] == 2 == metrics["tickets:needs_human"]


def test_a_flushed_broker_stops_the_run_within_the_outage_window_and_resume_finishes_it(
    demo: Path, tmp_path: Path, cli: Cli
) -> None:
    """FLUSHALL mid fan-out raises no error anywhere: the waiting `run` looks for its keys
    every second, ends stopped (exit 2, the trace says why) well within the outage window
    and the --timeout, and `resume` finishes the run. The ledger went with the data: the
    budget block still says what was paid, as the run's totals and the provider's bill do."""
    scenario = write_scenarios(tmp_path / "s.yaml", _scripts(0, (), latency_ms=800))
    with RedisServer(tcp=True) as server, running_provider(scenario) as llm:
        env = {
            "TICKETGRAPH_BROKER_URL": server.url,
            "LLM_BASE_URL": llm,
            "TICKETGRAPH_BROKER_OUTAGE_S": str(OUTAGE_S),
        }
        with worker_processes(env, tmp_path, ["w1"], threads=2):
            log = tmp_path / "run.log"
            run = start_run(demo, env, log, "--budget", "1", "--timeout", "600")
            wait_for("drafting", lambda: _stats(llm)["requests"] >= 2, timeout=60)
            server.client().flushall()
            flushed = time.monotonic()
            assert run.wait(OUTAGE_S + 30) == 2, log.read_text()
            noticed_s = time.monotonic() - flushed
            run_id = state(demo)["run_id"]
            run_dir = demo / "runs" / run_id
            wait_for("the drafts in flight to end", lambda: _stats(llm)["in_flight"] == 0)
            replies, _tokens, bill = _bill(llm, run_dir)

            def shown() -> dict[str, Any] | None:  # once the late records are counted in
                doc = json.loads(cli("status", "--json", cwd=demo).stdout)
                return doc if doc["cost_usd"] == pytest.approx(bill, abs=1e-9) else None

            doc = wait_for("the cost to be the bill", shown, timeout=30)
            resumed = cli("resume", run_id, "--wait-for-workers", "30", cwd=demo, env=env)
    assert noticed_s < OUTAGE_S
    assert "lost this run's queued work" in log.read_text()
    lines = [json.loads(line) for line in (run_dir / "run.jsonl").read_text().splitlines()]
    why = [e["error"] for e in lines if e["event"] == "run_interrupted"]
    assert why and "keys are gone" in why[0]
    assert doc["status"] == "stopped_early"
    budget = doc["budget"]
    assert budget["settled_usd"] == pytest.approx(bill, abs=1e-9)
    assert budget["calls"] == replies
    assert budget["remaining_usd"] == pytest.approx(1 - bill, abs=1e-9)
    assert resumed.returncode == 1, resumed.stdout + resumed.stderr
    assert ticket_rows(state(demo)) == REFERENCE_TICKETS
