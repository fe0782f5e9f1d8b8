"""Cancel latency: `ticketgraph cancel` against a distributed run whose model and tools are slow.

Every trial is the demo workspace with 4 tickets in flight, run by `ticketgraph run` on a
private Redis with two `ticketgraph worker` processes (1 process x 2 threads each) and the
scripted provider in its own process:

  - the bug worker's replies take 30 s (T-1002 and T-1005 wait on the model);
  - the billing worker's `lookup_order` is a 30 s tool (T-1001 and T-1004 wait in it): it
    sleeps on its cancel token and, when woken, logs when.

Once two model requests and two tools are in flight, `ticketgraph cancel RUN` runs as a
subprocess (its Python start-up included). The trial measures, from just before that
command starts:

  latency      to the last in-flight request abandoned (the provider's /stats) or tool
               woken (the tool's log), whichever came later
  returned     to the command's exit
  after        requests that reached the provider after the command returned (must be 0)

and that every in-flight request was abandoned and the run's command exited 2. After all
trials, every worker is stopped and new ones started: RESTART_WAIT_S later, no request has
reached the provider and no run's records changed (queued tickets of a cancelled run never
start, also after all workers restarted).

`python -m bench.cancel --trials 20` is the full benchmark (BENCHMARKS.md has its figures).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from bench import machine
from bench.services import (
    Provider,
    Workers,
    WorkerSpec,
    add_folder_option,
    child_env,
    stop_process,
    ticketgraph,
    trials_folder,
)
from bench.soak import init_source
from orchestrator.broker.redis_server import RedisServer
from orchestrator.config.workspace import CONFIG_FILE, DEMO_SCENARIOS, init_demo

SLOW_S = 30.0
POOL = 4
RESTART_WAIT_S = 5.0
IN_FLIGHT_TIMEOUT_S = 60.0
TOOL_LOG = "slow-tool.log"
DELIVERED = re.compile(r"worker process\(es\) in ([0-9.]+) s")

SLOW_TOOL = f'''"""The benchmark's slow lookup_order: {SLOW_S:g} s, unless a cancel wakes it."""

import json
import time
from pathlib import Path

from workers import ToolContext, tool
from workers.errors import Cancelled

LOG = Path(__file__).parent / "{TOOL_LOG}"


@tool
def lookup_order(order_id: str, ctx: ToolContext) -> str:
    """Look up billing facts of one order."""
    with LOG.open("a") as log:
        log.write(json.dumps({{"started_at": time.time()}}) + "\\n")
    try:
        ctx.cancel.sleep({SLOW_S})
    except Cancelled:
        with LOG.open("a") as log:
            log.write(json.dumps({{"woken_at": time.time()}}) + "\\n")
        raise
    return json.dumps({{"order_id": order_id}})
'''


@dataclass
class Trial:
    """One cancel, as measured."""

    index: int
    latency_s: float  # cancel's start -> the last request abandoned or tool woken
    returned_s: float  # cancel's start -> its exit
    delivered_s: float  # inside the command: publish -> every worker process answered
    requests_abandoned: int
    requests_in_flight_before: int
    tools_woken: int
    tools_in_flight_before: int
    requests_after_return: int
    cancel_exit: int
    run_exit: int | None


def scripts() -> list[dict[str, Any]]:
    """The demo's scripts; the bug worker's turns take SLOW_S."""
    found = yaml.safe_load((init_source() / DEMO_SCENARIOS).read_text())
    for script in found:
        if script["name"] in ("T-1002#1", "T-1005#1"):
            script["latency_ms"] = SLOW_S * 1000
    return list(found)


def workspace(root: Path) -> Path:
    """The demo workspace with the slow tool and POOL tickets in flight."""
    init_demo(root)
    (root / "slow_tools.py").write_text(SLOW_TOOL)
    config = root / CONFIG_FILE
    text = config.read_text()
    text = text.replace('"demo_tools:lookup_order"', '"slow_tools:lookup_order"')
    text = text.replace("pool_size = 2 ", f"pool_size = {POOL} ")
    config.write_text(text)
    return root


def run_trials(trials: int, folder: Path) -> tuple[list[Trial], dict[str, Any]]:
    """`trials` cancels on one Redis, provider and pair of workers; then the restart check."""
    folder.mkdir(parents=True, exist_ok=True)
    scenario = folder / "cancel.yaml"
    scenario.write_text(yaml.safe_dump(scripts(), sort_keys=False, allow_unicode=True))
    results: list[Trial] = []
    with RedisServer(tcp=True) as redis, Provider(scenario, folder / "provider.log") as llm:
        env = child_env(TICKETGRAPH_BROKER_URL=redis.url, LLM_BASE_URL=llm.url)
        specs = [WorkerSpec("cancel1", 1, 2), WorkerSpec("cancel2", 1, 2)]
        with Workers(specs, env, folder / "workers"):
            for index in range(trials):
                trial = _trial(index, folder / f"t{index:02d}", env, llm)
                results.append(trial)
                print(_line(trial), flush=True)
        restart = _after_restart(folder, env, llm, specs)
    return results, restart


def _trial(index: int, folder: Path, env: dict[str, str], llm: Provider) -> Trial:
    root = workspace(folder / "demo")
    llm.stats(reset=True)
    with (folder / "run.log").open("w") as out:
        run = subprocess.Popen(
            ticketgraph("run"), cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        in_flight = _wait_in_flight(root, llm, run)
        tools_before = len(_tool_log(root, "started_at"))
        started = time.time()
        cancel = subprocess.run(
            ticketgraph("cancel", _run_id(root), "--reason", "bench"),
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        returned = time.time()
        at_return = int(llm.stats()["requests"])
        if cancel.returncode != 0:
            raise RuntimeError(f"cancel failed: {cancel.stderr}")
        stats = _settled(llm, in_flight, root, tools_before)
        run_exit = run.wait(60)
    finally:
        stop_process(run)
    woken = _tool_log(root, "woken_at")
    last = max([stats["last_abandoned_at"] or started, *woken])
    # Requests counted after the command returned, or one that arrived after it did.
    after = int(stats["requests"]) - at_return
    arrived_late = stats["last_arrival_at"] is not None and stats["last_arrival_at"] > returned
    return Trial(
        index=index,
        latency_s=round(last - started, 4),
        returned_s=round(returned - started, 4),
        delivered_s=float(DELIVERED.search(cancel.stdout).group(1)),  # type: ignore[union-attr]
        requests_abandoned=int(stats["abandoned"]),
        requests_in_flight_before=in_flight,
        tools_woken=len(woken),
        tools_in_flight_before=tools_before,
        requests_after_return=max(after, int(arrived_late)),
        cancel_exit=cancel.returncode,
        run_exit=run_exit,
    )


def _wait_in_flight(root: Path, llm: Provider, run: subprocess.Popen[bytes]) -> int:
    """Wait until two model requests and two tools of the run are in flight."""
    deadline = time.monotonic() + IN_FLIGHT_TIMEOUT_S
    while True:
        # The tools first: once both started, the billing tickets' first (fast) requests
        # have been answered, and what the provider holds is the bug tickets' slow ones.
        tools = len(_tool_log(root, "started_at"))
        requests = int(llm.stats()["in_flight"])
        if requests >= 2 and tools >= 2:
            return requests
        if run.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the run never had 2 requests and 2 tools in flight: {requests}")
        time.sleep(0.05)


def _settled(llm: Provider, in_flight: int, root: Path, tools: int) -> dict[str, Any]:
    """/stats once every in-flight request was abandoned and every tool woken (or 10 s)."""
    deadline = time.monotonic() + 10
    while True:
        stats = llm.stats()
        done = stats["abandoned"] >= in_flight and len(_tool_log(root, "woken_at")) >= tools
        if done or time.monotonic() > deadline:
            return stats
        time.sleep(0.02)


def _tool_log(root: Path, key: str) -> list[float]:
    path = root / TOOL_LOG
    lines = path.read_text().splitlines() if path.exists() else []
    return [row[key] for row in map(json.loads, lines) if key in row]


def _run_id(root: Path) -> str:
    return next((root / "runs").glob("run-*")).name


def _after_restart(
    folder: Path, env: dict[str, str], llm: Provider, specs: list[WorkerSpec]
) -> dict[str, Any]:
    """New workers after all were stopped: no request of any cancelled run, no record changed."""
    records = _records(folder)
    before = llm.stats(reset=True)
    with Workers(specs, env, folder / "workers-again"):
        time.sleep(RESTART_WAIT_S)
        after = llm.stats()
    return {
        "requests_after_restart": int(after["requests"]) - int(before["requests"]),
        "records_changed_after_restart": sum(
            1 for path, text in _records(folder).items() if records.get(path) != text
        ),
    }


def _records(folder: Path) -> dict[str, str]:
    return {str(p): p.read_text() for p in folder.glob("t*/demo/runs/*/records/*.json")}


def _line(t: Trial) -> str:
    return (
        f"trial {t.index:2d}: latency {t.latency_s * 1000:.0f} ms (returned "
        f"{t.returned_s * 1000:.0f} ms, delivered in {t.delivered_s * 1000:.0f} ms) "
        f"abandoned {t.requests_abandoned}/{t.requests_in_flight_before} "
        f"tools {t.tools_woken}/{t.tools_in_flight_before} "
        f"after={t.requests_after_return} run_exit={t.run_exit}"
    )


def percentile(values: list[float], p: float) -> float:
    """The p-th percentile (nearest rank) of `values`."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(p / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def summary(trials: list[Trial], restart: dict[str, Any]) -> dict[str, Any]:
    """The figures BENCHMARKS.md reports."""
    latencies = [t.latency_s for t in trials]
    returns = [t.returned_s for t in trials]
    return {
        "trials": len(trials),
        "latency_p50_s": percentile(latencies, 50),
        "latency_p99_s": percentile(latencies, 99),
        "latency_max_s": max(latencies),
        "returned_p50_s": percentile(returns, 50),
        "returned_p99_s": percentile(returns, 99),
        "delivered_p50_s": percentile([t.delivered_s for t in trials], 50),
        "delivered_p99_s": percentile([t.delivered_s for t in trials], 99),
        "requests_not_abandoned": sum(
            t.requests_in_flight_before - t.requests_abandoned for t in trials
        ),
        "tools_not_woken": sum(t.tools_in_flight_before - t.tools_woken for t in trials),
        "requests_after_return": sum(t.requests_after_return for t in trials),
        "run_exits": sorted({t.run_exit for t in trials}, key=str),
        **restart,
    }


def main(argv: list[str] | None = None) -> int:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.cancel", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--trials", type=int, default=20)
    add_folder_option(parser)
    parser.add_argument("--json", type=Path, help="write every trial and the summary here")
    args = parser.parse_args(argv)
    args.folder = trials_folder(parser, args.folder, "cancel")
    load_before = machine.loadavg()
    trials, restart = run_trials(args.trials, args.folder)
    totals = summary(trials, restart)
    totals |= {"load_before": load_before, "load_after": machine.loadavg()}
    totals["machine"] = machine.describe()
    print(json.dumps(totals, indent=2))
    if args.json:
        data = {"summary": totals, "trials": [asdict(t) for t in trials]}
        args.json.write_text(json.dumps(data, indent=2))
    bad = (
        totals["requests_not_abandoned"]
        or totals["tools_not_woken"]
        or totals["requests_after_return"]
        or totals["requests_after_restart"]
        or totals["records_changed_after_restart"]
    )
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
