"""Harness overhead per turn over loopback: wall time minus the provider's own service time.

Method: start the scripted provider as a separate process (0 ms scripted latency), run the
`plan` scenario (3 turns, 2 tool calls) again and again until at least --turns turns have
run, and for each run compute (run wall time - sum of the provider's X-Service-Ms) / turns.
What remains is the harness: building and sending the request, httpx, JSON, the loop, tools,
tracing and (in the `persisted` variant) an fsync'ed state write after every step.

    python -m bench.harness_overhead [--turns 1000] [--json]     # or: python -m bench --only f
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.figures import Figure, Target
from bench.services import Provider
from bench.suite import Context, Section
from workers import chapter, chapter_tools, loop
from workers.cancel import CancelToken
from workers.model.client import ModelClient, ModelReply, RequestParams
from workers.model.gate import OnWait
from workers.settings import HarnessSettings
from workers.state import AgentStatus, Message, new_run

VARIANTS = {"in_memory": False, "persisted": True}
WARM_UP_TURNS = 30
QUICK_TURNS = 150
TARGET_MS = 2.0  # BENCHMARKS.md: at most 2 ms per turn, median (the seed's Node harness: ~5 ms)


class TimedClient(ModelClient):
    """A model client that adds up the provider's reported service time."""

    service_ms = 0.0

    def complete(
        self,
        model: str,
        messages: list[Message],
        tools: list[dict[str, Any]],
        cancel: CancelToken | None = None,
        params: RequestParams | None = None,
        on_wait: OnWait | None = None,
    ) -> ModelReply:
        """One completion, its X-Service-Ms added to `service_ms`."""
        reply = super().complete(model, messages, tools, cancel, params, on_wait)
        self.service_ms += reply.service_ms or 0.0
        return reply


def measure(url: str, turns: int, persisted: bool, root: Path) -> list[float]:
    """Per-turn overhead (ms) of each plan run until `turns` turns have run."""
    workspace = chapter_tools.make_demo_workspace(root / "ws")
    client = TimedClient(HarnessSettings(base_url=url))
    per_turn: list[float] = []
    done = 0
    try:
        while done < turns:
            opts = chapter.Options(scenario="plan", workspace=workspace, trace=root / "t.jsonl")
            state = new_run(chapter.SYSTEM, chapter.DEFAULT_TASK, model="plan")
            h = chapter.build(opts, client, state)
            h.state_path = root / "state.json" if persisted else None
            client.service_ms = 0.0
            started = time.perf_counter()
            state = loop.run(state, h)
            wall_ms = (time.perf_counter() - started) * 1000
            if state.status is not AgentStatus.COMPLETED:
                raise RuntimeError(f"plan run ended {state.status}: {state.error}")
            per_turn.append((wall_ms - client.service_ms) / state.turns)
            done += state.turns
    finally:
        client.close()
    return per_turn


def summarise(samples: list[float]) -> dict[str, float]:
    """Median, p95 and the turns per second the harness alone could do."""
    ordered = sorted(samples)
    return {
        "runs": len(ordered),
        "median_ms": round(statistics.median(ordered), 3),
        "p95_ms": round(ordered[int(0.95 * (len(ordered) - 1))], 3),
        "turns_per_s": round(1000 / statistics.mean(ordered), 1),
    }


def measure_overhead(turns: int, scratch: Path) -> dict[str, dict[str, float]]:
    """Both variants against a provider process of their own, after a warm-up."""
    with (
        Provider("harness", scratch / "provider.log") as llm,
        tempfile.TemporaryDirectory(dir=scratch) as tmp,
    ):
        measure(llm.url, WARM_UP_TURNS, False, Path(tmp))  # imports, connections, tokenizer
        return {
            name: summarise(measure(llm.url, turns, persisted, Path(tmp)))
            for name, persisted in VARIANTS.items()
        }


def run_section(ctx: Context, section: Section) -> None:
    """Section f of `python -m bench`: the median and p95 per turn of both variants."""
    turns = QUICK_TURNS if ctx.options.quick else 1000
    section.title = f"harness overhead per turn (plan scenario, ≥ {turns:,} turns per variant)"
    results = measure_overhead(turns, ctx.folder("f-harness"))
    section.raw = results
    target = Target("<=", TARGET_MS, "≤ 2 ms per turn, median")
    for name, r in results.items():
        label = name.replace("_", " ")
        section.add(
            Figure(
                f"{name}.median_ms",
                f"{label}: overhead/turn, median",
                r["median_ms"],
                "ms",
                target,
                note=f"{r['runs']} runs",
            ),
            Figure(f"{name}.p95_ms", f"{label}: overhead/turn, p95", r["p95_ms"], "ms"),
        )


def main() -> None:
    """Command line: both variants, printed or as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="harness-overhead-") as tmp:
        results: dict[str, Any] = measure_overhead(args.turns, Path(tmp))
    results["machine"] = {"cpus": os.cpu_count(), "python": sys.version.split()[0]}
    if args.json:
        print(json.dumps(results, indent=1))
        return
    for name in VARIANTS:
        r = results[name]
        print(
            f"{name:10} runs={r['runs']}  overhead/turn median={r['median_ms']} ms  "
            f"p95={r['p95_ms']} ms  (harness-only turns/s ≈ {r['turns_per_s']})"
        )


if __name__ == "__main__":
    main()
