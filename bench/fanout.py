"""Fan-out wall time of the demo run against the seed's ideal (243 ms at POOL_SIZE=2).

Method: `ticketgraph init` a demo workspace, then run `ticketgraph run` as a subprocess
(embedded Redis, in-process threads worker, scripted provider with 60 ms latency per call)
--runs times per pool size. The fan-out time is the `fanout` node's `ms` in run-state.json:
from the first draft task starting to merge starting. Ideal: four worker tickets, two model
calls each at 60 ms, on two lanes = 240 ms (the seed measured 243 ms); on one lane 480 ms.

    python bench/fanout.py [--runs 10] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

IDEAL_MS = {1: 486, 2: 243}  # the seed's measured figures


def run_once(workspace: Path, pool: int) -> dict[str, int]:
    """One demo run; the node times from its run-state.json."""
    env = {**os.environ, "POOL_SIZE": str(pool)}
    for key in ("TICKETGRAPH_BROKER_URL", "LLM_BASE_URL", "STOP_AFTER"):
        env.pop(key, None)
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "run"],
        cwd=workspace,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 1:
        raise RuntimeError(f"demo run exited {done.returncode}: {done.stderr}")
    nodes = json.loads((workspace / "run-state.json").read_text())["nodes"]
    return {name: node["ms"] for name, node in nodes.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        workspace = Path(tmp) / "demo"
        subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "init", str(workspace)],
            check=True,
            capture_output=True,
        )
        for pool in (2, 1):
            samples = [run_once(workspace, pool) for _ in range(args.runs)]
            fanout = sorted(s["fanout"] for s in samples)
            results[pool] = {
                "runs": args.runs,
                "fanout_median_ms": statistics.median(fanout),
                "fanout_min_ms": fanout[0],
                "fanout_max_ms": fanout[-1],
                "ratio_to_seed": round(statistics.median(fanout) / IDEAL_MS[pool], 2),
                "route_median_ms": statistics.median(s["route"] for s in samples),
                "review_median_ms": statistics.median(s["review"] for s in samples),
            }
    if args.json:
        print(json.dumps(results, indent=1))
        return
    for pool, r in results.items():
        print(
            f"POOL_SIZE={pool}: fanout median {r['fanout_median_ms']} ms "
            f"(min {r['fanout_min_ms']}, max {r['fanout_max_ms']}, {r['runs']} runs) = "
            f"{r['ratio_to_seed']}x the seed's {IDEAL_MS[pool]} ms; "
            f"route {r['route_median_ms']} ms, review {r['review_median_ms']} ms"
        )


if __name__ == "__main__":
    main()
