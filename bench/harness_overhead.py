"""Harness overhead per turn over loopback: wall time minus the provider's own service time.

Method: start the scripted provider as a separate process (0 ms scripted latency), run the
`plan` scenario (3 turns, 2 tool calls) again and again until at least --turns turns have
run, and for each run compute (run wall time - sum of the provider's X-Service-Ms) / turns.
What remains is the harness: building and sending the request, httpx, JSON, the loop, tools,
tracing and (in the `persisted` variant) an fsync'ed state write after every step.

    python bench/harness_overhead.py [--turns 1000] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from workers import experiment, filetools, loop
from workers.client import ModelClient, ModelReply
from workers.settings import HarnessSettings
from workers.state import Message, RunStatus, new_run


class TimedClient(ModelClient):
    """A model client that adds up the provider's reported service time."""

    service_ms = 0.0

    def complete(
        self, model: str, messages: list[Message], tools: list[dict[str, Any]]
    ) -> ModelReply:
        reply = super().complete(model, messages, tools)
        self.service_ms += reply.service_ms or 0.0
        return reply


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_provider(port: int) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "workers.provider.server", "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=0.5)
            return proc
        except httpx.HTTPError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("provider did not start")


def measure(url: str, turns: int, persisted: bool, root: Path) -> list[float]:
    """Per-turn overhead (ms) of each plan run until `turns` turns have run."""
    workspace = filetools.make_demo_workspace(root / "ws")
    client = TimedClient(HarnessSettings(base_url=url))
    per_turn: list[float] = []
    done = 0
    try:
        while done < turns:
            opts = experiment.Options(scenario="plan", workspace=workspace, trace=root / "t.jsonl")
            state = new_run(experiment.SYSTEM, experiment.DEFAULT_TASK, model="plan")
            h = experiment.build(opts, client, state)
            h.state_path = root / "state.json" if persisted else None
            client.service_ms = 0.0
            started = time.perf_counter()
            state = loop.run(state, h)
            wall_ms = (time.perf_counter() - started) * 1000
            assert state.status is RunStatus.COMPLETED, state.error
            per_turn.append((wall_ms - client.service_ms) / state.turns)
            done += state.turns
    finally:
        client.close()
    return per_turn


def summarise(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "runs": len(ordered),
        "median_ms": round(statistics.median(ordered), 3),
        "p95_ms": round(ordered[int(0.95 * (len(ordered) - 1))], 3),
        "turns_per_s": round(1000 / statistics.mean(ordered), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    port = free_port()
    provider = start_provider(port)
    try:
        url = f"http://127.0.0.1:{port}/v1"
        with tempfile.TemporaryDirectory() as tmp:
            measure(url, 30, False, Path(tmp))  # warm-up: imports, connections, tokenizer
            results = {
                name: summarise(measure(url, args.turns, persisted, Path(tmp)))
                for name, persisted in (("in_memory", False), ("persisted", True))
            }
    finally:
        provider.terminate()
        provider.wait(10)
    results["machine"] = {"cpus": os.cpu_count(), "python": sys.version.split()[0]}
    if args.json:
        print(json.dumps(results, indent=1))
        return
    for name in ("in_memory", "persisted"):
        r = results[name]
        print(
            f"{name:10} runs={r['runs']}  overhead/turn median={r['median_ms']} ms  "
            f"p95={r['p95_ms']} ms  (harness-only turns/s ≈ {r['turns_per_s']})"
        )


if __name__ == "__main__":
    main()
