"""`python -m bench.faults`: what a Redis restart and a killed worker cost, measured.

restart   The demo on a private Redis (appendonly) with two `ticketgraph worker` processes,
          every model call 1.5 s: once clean, once with Redis restarted (SIGTERM, 1 s down,
          started again) while two drafting calls are in flight. Wall time, exit code,
          requests served, verdicts.
redeliver The same demo with one thread per worker and default settings (visibility timeout
          30 s, restore sweep 5 s): the worker process drafting T-1002 is SIGKILLed in its
          model call; the time until a live worker runs T-1002's task again (Celery's
          remote control).

Each is repeated `--trials` times; the machine and its load are printed with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from celery import Celery

from bench.machine import describe
from bench.services import (
    Provider,
    Workers,
    WorkerSpec,
    add_folder_option,
    child_env,
    ticketgraph,
    trials_folder,
)
from orchestrator.broker.redis_server import RedisServer
from orchestrator.config.workspace import DEMO_SCENARIOS, init_demo

DEMO = Path(__file__).resolve().parents[1] / "orchestrator" / "demo"


def _scenario(folder: Path, latency_ms: float, **per_script: float) -> Path:
    scripts = yaml.safe_load((DEMO / DEMO_SCENARIOS).read_text())
    for script in scripts:
        script["latency_ms"] = per_script.get(script["name"], latency_ms)
    path = folder / "scenarios.yaml"
    path.write_text(yaml.safe_dump(scripts, sort_keys=False, allow_unicode=True))
    return path


def _wait(predicate: Callable[[], bool], timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.02)
    return time.monotonic()


def _verdicts(workspace: Path) -> dict[str, str]:
    state = json.loads((workspace / "run-state.json").read_text())
    return {i: t["status"] for i, t in state["tickets"].items()}


def restart_trial(folder: Path, restart: bool) -> dict[str, Any]:
    """One demo run; with `restart`, Redis goes down for 1 s mid-fan-out."""
    folder.mkdir(parents=True, exist_ok=True)
    workspace = folder / "demo"
    init_demo(workspace)
    scenario = _scenario(folder, 1500)
    with (
        RedisServer(tcp=True, appendonly=True) as redis,
        Provider(scenario, folder / "provider.log") as llm,
    ):
        env = child_env(TICKETGRAPH_BROKER_URL=redis.url, LLM_BASE_URL=llm.url)
        specs = [WorkerSpec("r1", 1, 2), WorkerSpec("r2", 1, 2)]
        with Workers(specs, env, folder / "workers"):
            started = time.monotonic()
            run = subprocess.Popen(
                ticketgraph("run"),
                cwd=workspace,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            in_flight = 0
            if restart:
                _wait(lambda: llm.stats()["requests"] >= 1 and llm.stats()["in_flight"] >= 2, 60)
                in_flight = llm.stats()["in_flight"]
                redis.restart(down_s=1.0)
            code = run.wait(300)
            wall = time.monotonic() - started
            served = llm.stats()["requests"]
    return {
        "restart": restart,
        "exit_code": code,
        "wall_s": round(wall, 2),
        "requests": served,
        "in_flight_at_restart": in_flight,
        "verdicts": _verdicts(workspace),
    }


def redeliver_trial(folder: Path) -> dict[str, Any]:
    """Seconds from SIGKILL of T-1002's worker process to T-1002's model call arriving again."""
    folder.mkdir(parents=True, exist_ok=True)
    workspace = folder / "demo"
    init_demo(workspace)
    scenario = _scenario(folder, 60, **{"T-1002#1": 3000})
    with RedisServer(tcp=True) as redis, Provider(scenario, folder / "provider.log") as llm:
        env = child_env(TICKETGRAPH_BROKER_URL=redis.url, LLM_BASE_URL=llm.url)
        specs = [WorkerSpec("d1", 1, 1), WorkerSpec("d2", 1, 1)]
        with Workers(specs, env, folder / "workers"):
            run = subprocess.Popen(
                ticketgraph("run"),
                cwd=workspace,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            # /stats counts a script's request when it answers: 1 = T-1002's first turn is
            # done, its second in flight.
            _wait(lambda: llm.stats()["scripts"].get("T-1002#1", 0) == 1, 60)
            victim = _worker_pid(redis.url, "T-1002")
            assert victim is not None, "T-1002 is not running"
            os.kill(victim, signal.SIGKILL)
            killed = time.monotonic()
            _wait(lambda: _worker_pid(redis.url, "T-1002") is None, 30)
            back = _wait(lambda: _worker_pid(redis.url, "T-1002") is not None, 120)
            code = run.wait(300)
    return {"redelivered_s": round(back - killed, 1), "exit_code": code}


def _worker_pid(broker: str, ticket_id: str) -> int | None:
    """The PID of the worker process drafting `ticket_id` (Celery's remote control), if any."""
    control = Celery(broker=broker)
    try:
        active = control.control.inspect(timeout=1.0).active() or {}
    finally:
        control.close()
    for tasks in active.values():
        for task in tasks:
            if task["name"] == "orchestrator.draft" and task["args"][2] == ticket_id:
                return int(task["worker_pid"])
    return None


def main(argv: list[str] | None = None) -> int:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.faults", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--trials", type=int, default=3)
    add_folder_option(parser)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    args.folder = trials_folder(parser, args.folder, "faults")
    print(json.dumps(describe(), indent=2), flush=True)
    results: dict[str, list[dict[str, Any]]] = {"restart": [], "redeliver": []}
    for i in range(args.trials):  # clean and restarted runs interleaved: same load for both
        for restart in (False, True):
            trial = restart_trial(args.folder / f"restart-{i}-{restart}", restart)
            results["restart"].append(trial)
            print(json.dumps(trial), flush=True)
    for i in range(args.trials):
        trial = redeliver_trial(args.folder / f"redeliver-{i}")
        results["redeliver"].append(trial)
        print(json.dumps(trial), flush=True)
    clean = [t["wall_s"] for t in results["restart"] if not t["restart"]]
    hit = [t["wall_s"] for t in results["restart"] if t["restart"]]
    back = [t["redelivered_s"] for t in results["redeliver"]]
    totals = {
        "clean_wall_s_median": statistics.median(clean),
        "restart_wall_s_median": statistics.median(hit),
        "redelivered_s": back,
        "load_after": os.getloadavg(),
    }
    print(json.dumps(totals, indent=2))
    if args.json:
        args.json.write_text(json.dumps({"results": results, "totals": totals}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
