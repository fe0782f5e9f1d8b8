"""A run's budget across every worker, and one cap on an endpoint for all of them.

Real parts: a private Redis (the ledger and the caps are Lua scripts in it), the scripted
provider (its /stats is the witness of what was served and how many were in flight at
once), `ticketgraph worker` processes (3 processes x 8 threads), `run` and `resume` as
subprocesses, and holders SIGKILLed while their call is in flight.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from bench.caps import counted
from bench.workload import build
from orchestrator.coordination import budget, keys, ratecap
from orchestrator.run.store import RunStore
from tests.conftest import (
    REPO,
    Cli,
    clean_env,
    demo_scripts,
    state,
    worker_processes,
    write_scenarios,
)
from workers.meter import OverBudget, WorstCase
from workers.provider import running_provider
from workers.provider.app import TokenRate
from workers.settings import HarnessSettings
from workers.state import new_run
from workers.usage import Usage

LEASE_S = 3.0  # the workers' TICKETGRAPH_LEASE_S here: a dead holder's share is back by then


def _stats(url: str) -> dict[str, Any]:
    return httpx.get(url.replace("/v1", "/stats")).json()  # type: ignore[no-any-return]


def _run_dir(workspace: Path) -> Path:
    return workspace / "runs" / str(state(workspace)["run_id"])


def _document(cli: Cli, workspace: Path) -> dict[str, Any]:
    done = cli("status", "--json", cwd=workspace)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def _tokens(doc: dict[str, Any]) -> int:
    return sum(n["tokens"] for n in doc["record"]["nodes"].values())


# --- the ledger itself ------------------------------------------------------------------------


def test_the_ledger_holds_settles_refuses_and_stays_spent(broker: str, tmp_path: Path) -> None:
    r = redis.Redis.from_url(broker)
    ledger = budget.Ledger(r, "run-20261201-000000-aaaa")
    ledger.open(budget.Limits(0.010, ticket_usd=0.004), settled_usd=0.0)
    n = budget.to_nano
    assert ledger.hold("a", n(0.003), "T-1")[0] == "ok"
    assert ledger.hold("b", n(0.003), "T-1")[0] == "ticket"  # T-1 would pass 0.004
    assert ledger.hold("c", n(0.003), "T-2")[0] == "ok"
    assert all(0 < r.ttl(key) <= keys.RUN_TTL_S for key in ledger.keys)  # nothing outlives a run
    ledger.settle("a", n(0.001), "T-1", estimated=False)  # paid less than held: rest back
    totals = ledger.totals()
    assert totals is not None
    assert (totals.settled_usd, totals.reserved_usd, totals.remaining_usd) == (
        0.001,
        0.003,
        0.006,
    )
    assert ledger.hold("d", n(0.007), "T-3")[0] == "spent"  # 0.001 + 0.003 + 0.007 > 0.010
    assert ledger.hold("e", 1, "T-4")[0] == "spent"  # once spent, nothing more starts
    ledger.settle("c", -1, "T-2", estimated=False)  # no reply: released, nothing paid
    ledger.open(budget.Limits(0.020), settled_usd=99.0)  # a higher limit lifts `spent`
    totals = ledger.totals()
    assert totals is not None
    assert (totals.settled_usd, totals.reserved_usd, totals.refused, totals.spent) == (
        0.001,  # the ledger existed: the folder's figure does not replace it
        0.0,
        3,
        False,
    )
    assert ledger.hold("f", n(0.007), "T-3")[0] == "ok"


def test_a_meter_fails_closed_without_redis_and_reseeds_a_lost_ledger(
    broker: str, demo: Path
) -> None:
    store = RunStore(demo / "runs" / "run-20261201-000000-bbbb")
    store.dir.mkdir(parents=True)
    (store.dir / "agents").mkdir()
    paid = new_run("system", "task", "demo")
    paid.cost_usd = 0.25  # what an earlier attempt paid, saved in its agent's state
    paid.save(store.dir / "agents" / "T-1.draft.json")
    limits = budget.Limits(0.30)
    worst = WorstCase(prompt_tokens=1000, reply_tokens=1000, usd=0.04)
    dead = redis.Redis(port=1, socket_connect_timeout=0.5)
    with pytest.raises(OverBudget, match="cannot be reached"):
        budget.RunMeter(dead, store, limits, "T-1").hold(worst)
    r = redis.Redis.from_url(broker)
    meter = budget.RunMeter(r, store, limits, "T-1")  # no ledger in Redis: seeded from agents/
    meter.hold(worst).settle(0.01, Usage(prompt_tokens=1, completion_tokens=1))
    totals = budget.Ledger(r, store.run_id).totals()
    assert totals is not None and totals.settled_usd == pytest.approx(0.26)
    with pytest.raises(OverBudget, match=r"run budget: \$0\.0400 left of \$0\.3000"):
        meter.hold(WorstCase(1000, 1000, 0.05))


def test_a_refused_call_says_what_calls_in_flight_held(broker: str, demo: Path) -> None:
    """What is left when a call is refused is less than what the report shows left at the
    end, by what other calls held then: the refusal names it, so the two figures add up."""
    store = RunStore(demo / "runs" / "run-20261201-000000-eeee")
    (store.dir / "agents").mkdir(parents=True)
    meter = budget.RunMeter(redis.Redis.from_url(broker), store, budget.Limits(0.05), "T-1")
    meter.hold(WorstCase(1000, 1000, 0.02)).settle(
        0.01, Usage(prompt_tokens=1, completion_tokens=1)
    )
    in_flight = meter.hold(WorstCase(1000, 1000, 0.03))  # another call, not answered yet
    with pytest.raises(OverBudget) as refused:
        meter.hold(WorstCase(1000, 1000, 0.02))
    assert "$0.0100 left of $0.0500 while calls in flight held $0.0300" in str(refused.value)
    in_flight.settle(0.005, Usage(prompt_tokens=1, completion_tokens=1))
    totals = budget.Ledger(meter.ledger.r, store.run_id).totals()
    assert totals is not None and totals.remaining_usd == pytest.approx(0.035)


HOLDER = """
import sys, time, redis
from orchestrator.coordination import leases, ratecap
from orchestrator.config.environment import settings
from orchestrator.coordination import budget
from workers.meter import WorstCase
from orchestrator.run.store import RunStore
from pathlib import Path
leases.configure(settings().lease_s)  # as a worker's configuration does
r = redis.Redis.from_url(sys.argv[1])
store = RunStore(Path(sys.argv[2]))
budget.RunMeter(r, store, budget.Limits(1.0), "T-1").hold(WorstCase(1, 1, 0.5))
gate = ratecap.RedisGate(r, "http://model.invalid/v1", ratecap.Caps(1, None))
gate.enter("m", 0, None)
print("holding", flush=True)
time.sleep(600)
"""


def test_what_a_sigkilled_holder_held_comes_back_within_its_lease(broker: str, demo: Path) -> None:
    store = RunStore(demo / "runs" / "run-20261201-000000-cccc")
    store.dir.mkdir(parents=True)
    r = redis.Redis.from_url(broker)
    budget.open_ledger(r, store, budget.Limits(1.0))
    env = {**clean_env(), "TICKETGRAPH_LEASE_S": str(LEASE_S), "PYTHONPATH": str(REPO)}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, broker, str(store.dir)], env=env, stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"holding\n"
        time.sleep(LEASE_S * 1.5)  # alive: its renewals keep both
        gate = ratecap.RedisGate(r, "http://model.invalid/v1", ratecap.Caps(1, None))
        slots = keys.cap("http://model.invalid/v1", "m")[0]
        assert r.zcard(slots) == 1
        totals = budget.Ledger(r, store.run_id).totals()
        assert totals is not None and totals.reserved_usd == 0.5
        holder.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        holder.wait(10)
        gate.enter("m", 0, None).done(None)  # waits for the dead holder's slot
        slot_back = time.monotonic() - killed
        totals = budget.Ledger(r, store.run_id).totals()
        assert totals is not None
        assert (totals.reserved_usd, totals.remaining_usd, totals.expired) == (0.0, 1.0, 1)
        assert slot_back <= LEASE_S + 1.0, slot_back
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(10)


# --- the fleet ---------------------------------------------------------------------------------


def _fleet_env(broker: str, llm: str, **more: str) -> dict[str, str]:
    return {"TICKETGRAPH_BROKER_URL": broker, "LLM_BASE_URL": llm, **more}


def test_two_overlapping_runs_never_pass_their_budget_and_resume_pays_only_the_rest(
    broker: str, tmp_path: Path, cli: Cli
) -> None:
    first = build(tmp_path / "a", 48, latency_ms=20, pool_size=16)
    build(tmp_path / "b", 48, latency_ms=20, pool_size=16)  # the same tickets and scripts
    limit = 0.12  # about 40% of what one run costs in full
    with running_provider(first.root / "scenarios" / "demo.yaml") as llm:
        env = _fleet_env(broker, llm)
        with worker_processes(env, tmp_path, ["w1"], processes=3, threads=8):
            with ThreadPoolExecutor(2) as pool:
                runs = [
                    pool.submit(cli, "run", "--budget", str(limit), cwd=tmp_path / ws, env=env)
                    for ws in ("a", "b")
                ]
                done = [run.result(timeout=300) for run in runs]
            served = _stats(llm)
            docs = [_document(cli, tmp_path / ws) for ws in ("a", "b")]
            for run, doc in zip(done, docs, strict=True):
                assert run.returncode == 1, run.stdout + run.stderr
                spent = doc["budget"]
                assert spent["limit_usd"] == limit
                assert spent["settled_usd"] <= limit  # overshoot 0
                assert spent["reserved_usd"] == 0.0 and spent["refused"] >= 1
                assert spent["settled_usd"] == pytest.approx(doc["cost_usd"], abs=1e-8)
                stops = [t["stop"] for t in doc["record"]["tickets"].values()]
                assert "budget" in stops and None not in stops  # every ticket has an end
            # What the provider served is what the two reports count, to the token.
            assert (
                sum(_tokens(d) for d in docs)
                == served["prompt_tokens"] + served["completion_tokens"]
            )
            for ws in ("a", "b"):
                run_id = state(tmp_path / ws)["run_id"]
                again = cli("resume", run_id, "--budget", "10", cwd=tmp_path / ws, env=env)
                assert again.returncode == 1, again.stdout + again.stderr
            served = _stats(llm)
    docs = [_document(cli, tmp_path / ws) for ws in ("a", "b")]
    for doc in docs:
        assert doc["budget"]["limit_usd"] == 10
        assert not [t for t in doc["record"]["tickets"].values() if t["stop"] == "budget"]
        assert _tokens(doc) == first.tokens  # the whole run, nothing paid twice
    assert served["prompt_tokens"] + served["completion_tokens"] == 2 * first.tokens


def test_the_endpoint_cap_holds_requests_in_flight_across_the_fleet(
    broker: str, tmp_path: Path, cli: Cli
) -> None:
    work = build(tmp_path / "a", 48, latency_ms=100, pool_size=16)
    with running_provider(work.root / "scenarios" / "demo.yaml") as llm:
        env = _fleet_env(broker, llm, LLM_MAX_INFLIGHT="4")
        with worker_processes(env, tmp_path, ["w1"], processes=3, threads=8):
            done = cli("run", cwd=tmp_path / "a", env=env)
            served = _stats(llm)
    assert done.returncode == 1, done.stdout + done.stderr
    assert served["max_in_flight"] <= 4
    doc = _document(cli, tmp_path / "a")
    assert doc["budget"]["calls_waited"] > 0  # it did hold requests back
    assert _tokens(doc) == work.tokens


def test_a_token_rate_cap_keeps_a_rate_limited_endpoint_from_saying_429(
    broker: str, tmp_path: Path, cli: Cli
) -> None:
    work = build(tmp_path / "a", 32, latency_ms=20, pool_size=16)
    scenarios = work.root / "scenarios" / "demo.yaml"
    counted(scenarios)  # the provider counts every request, as a real API counts its own
    window, limit = 5.0, 8_000  # the endpoint's limit: 8,000 tokens per 5 s (a run needs 15 s)
    rate = TokenRate(limit, window)
    with running_provider(scenarios, rate=rate) as llm:
        env = _fleet_env(
            broker, llm, LLM_MAX_TPM=str(limit), LLM_TPM_WINDOW_S=str(window), LLM_MAX_RETRIES="8"
        )
        with worker_processes(env, tmp_path, ["w1"], processes=3, threads=8):
            done = cli("run", cwd=tmp_path / "a", env=env, timeout=300)
            served = _stats(llm)
    assert done.returncode == 1, done.stdout + done.stderr
    assert served["requests"] >= 50
    assert served["rate_limited"] / served["requests"] < 0.01, served
    doc = _document(cli, tmp_path / "a")
    assert _tokens(doc) == served["prompt_tokens"] + served["completion_tokens"]
    assert doc["budget"]["calls_waited"] > 0  # the cap held requests back
    # ... and the waiting command said so as they waited, not only in the report.
    said = [line for line in done.stdout.splitlines() if line.startswith("[wait] ")]
    assert said and "for the endpoint's cap (LLM_MAX_TPM) since " in said[0], done.stdout
    assert done.stdout.index(said[0]) < done.stdout.index("=== Graph run summary")
    trace = (tmp_path / "a" / "run.jsonl").read_text().splitlines()
    waits = [e for e in map(json.loads, trace) if e["event"] == "cap_wait"]
    assert len(waits) >= doc["budget"]["calls_waited"], len(waits)


def test_caps_are_read_from_the_environment() -> None:
    llm = HarnessSettings(base_url="http://x/v1", max_inflight=4, max_tpm=1000)
    assert ratecap.caps_of(llm) == ratecap.Caps(4, 1000, 60.0)
    assert ratecap.gate_for(None, llm) is None  # the harness alone: no shared caps
    assert ratecap.gate_for(redis.Redis(), HarnessSettings(base_url="http://x/v1")) is None


def test_a_ticket_budget_from_the_toml_stops_only_the_tickets_that_would_pass_it(
    demo: Path, cli: Cli
) -> None:
    config = demo / "ticketgraph.toml"
    config.write_text(config.read_text() + "\n[run]\nticket_budget_usd = 0.02\n")
    done = cli("run", cwd=demo)  # embedded: its own Redis holds the ledger
    assert done.returncode == 1, done.stdout + done.stderr
    record = state(demo)
    for ticket in record["tickets"].values():
        assert ticket["draft"]["cost_usd"] + ticket["review"]["cost_usd"] <= 0.02
    # Two drafting calls fit (each held at ~$0.013, settled at ~$0.003); T-1005's rewrite,
    # after its $0.007 draft, would not: it is not sent.
    assert [record["tickets"][t]["status"] for t in ("T-1001", "T-1002")] == ["pass", "pass"]
    t1005 = record["tickets"]["T-1005"]
    assert t1005["stop"] == "budget" and t1005["error"].startswith("ticket budget: $")
    assert t1005["review"]["calls"] == 0


def test_status_of_a_running_run_reads_the_ledger_live_and_holds_live_on_the_set_lease(
    broker: str, demo: Path, tmp_path: Path, cli: Cli
) -> None:
    """`run` and `worker` take TICKETGRAPH_LEASE_S (README's settings): the hold of a call in
    flight ends 2 s after its last renewal by Redis's clock, not the default 20 s."""
    slow = [
        {**script, "latency_ms": 4000} if script["name"].startswith("T-1002") else script
        for script in demo_scripts()
    ]
    r = redis.Redis.from_url(broker)
    with running_provider(write_scenarios(tmp_path / "slow.yaml", slow)) as llm:
        env = _fleet_env(broker, llm, TICKETGRAPH_LEASE_S="2")
        workers = worker_processes(env, tmp_path, ["w1"], processes=1, threads=4)
        with workers, ThreadPoolExecutor(1) as pool:
            run = pool.submit(cli, "run", "--budget", "1", cwd=demo, env=env)
            seen: dict[str, Any] = {}
            deadline = time.monotonic() + 60
            while not seen.get("reserved_usd") and time.monotonic() < deadline:
                if list(demo.glob("runs/*/run.json")):
                    shown = cli("status", "--json", cwd=demo, env=env)
                    seen = json.loads(shown.stdout)["budget"]
                time.sleep(0.2)
            (run_json,) = demo.glob("runs/*/run.json")
            held = _lease_left_ms(r, run_json.parent.name)
            assert run.result(timeout=120).returncode == 1
    # While T-1002's slow call was in flight, status showed the money held for it.
    assert seen["limit_usd"] == 1 and seen["reserved_usd"] > 0, seen
    assert seen["settled_usd"] + seen["reserved_usd"] + seen["remaining_usd"] == pytest.approx(1)
    assert held and all(0 < left <= 2000 for left in held), held


def _lease_left_ms(r: redis.Redis, run_id: str) -> list[int]:
    """How long each budget hold of the run has left, in ms by Redis's clock."""
    seconds, micros = r.time()
    now_ms = seconds * 1000 + micros // 1000
    leases = r.zrange(keys.budget(run_id, "leases"), 0, -1, withscores=True)
    return [int(score) - now_ms for _, score in leases]


def test_a_429s_retry_after_holds_back_every_worker_of_the_endpoint(broker: str) -> None:
    caps = ratecap.Caps(max_inflight=8, max_tpm=None)
    one, other = (
        ratecap.RedisGate(redis.Redis.from_url(broker), "http://cool.invalid/v1", caps)
        for _ in range(2)
    )  # two workers' gates, each with its own connection
    one.cool_down("m", 1.5)  # the endpoint answered one of them 429, Retry-After 1.5 s
    started = time.monotonic()
    slot = other.enter("m", 0, None)
    waited = time.monotonic() - started
    slot.done(None)
    assert slot.waited and 1.4 <= waited < 5, waited
    assert not other.enter("other-model", 0, None).waited  # keyed by model too


def test_a_resume_whose_redis_is_new_seeds_the_ledger_from_the_run_folder(
    demo: Path, cli: Cli
) -> None:
    """An embedded run's Redis lives as long as its command: the resume's is empty, as a
    broker that lost its data would be. The ledger starts from what agents/ says was paid."""
    first = cli("run", "--budget", "0.05", cwd=demo)
    assert first.returncode == 1, first.stdout + first.stderr
    before = _document(cli, demo)
    assert before["budget"]["refused"] >= 1 and before["budget"]["settled_usd"] <= 0.05
    again = cli("resume", str(before["run_id"]), "--budget", "1", cwd=demo)
    assert again.returncode == 1, again.stdout + again.stderr
    after = _document(cli, demo)
    assert after["budget"]["settled_usd"] == pytest.approx(after["cost_usd"], abs=1e-8)
    assert after["budget"]["settled_usd"] > before["budget"]["settled_usd"]  # both runs' spend
    assert not [t for t in after["record"]["tickets"].values() if t["stop"] == "budget"]
