"""Sections b and e: runs on a private TCP Redis with `ticketgraph worker` processes.

b. Scaling out: N = 1,000 at pool 32, 50 ms, on "1 worker process" (one `ticketgraph worker
   --processes 1 --threads 32`) and on "2 worker processes" (two `--processes 1 --threads 16`).
   Each run gets a fresh Redis, fresh workers (ready before the run starts), a fresh
   workspace; the provider is one process for the section. Throughput = tickets / run wall.
   The layouts alternate, RUNS times each, and the figures are their medians: one run of
   each gave 1.07-2.06× on this shared machine, a verdict a neighbour's burst could flip.
e. Broker bytes: the demo workspace twice on one worker, once as it is and once with
   T-1001's final draft ~100 KB (a copy of the demo scripts for model `big`), with a MONITOR
   thread collecting every LPUSH (kombu's task messages) on the Redis server.
"""

from __future__ import annotations

import copy
import statistics
from pathlib import Path
from typing import Any

import yaml

from bench.figures import Figure, Target, ratio_of, rounded
from bench.runs import run_ticketgraph, usable
from bench.services import Monitor, Provider, Workers, WorkerSpec, child_env
from bench.suite import Context, Section, median
from bench.workload import build
from orchestrator.broker.redis_server import RedisServer
from orchestrator.config.workspace import CONFIG_FILE, init_demo

POOL = 32
LATENCY_MS = 50
QUICK_N = 100
LAYOUTS = {
    "one": [WorkerSpec("solo", 1, 32)],
    "two": [WorkerSpec("w1", 1, 16), WorkerSpec("w2", 1, 16)],
}
LAYOUT_NAMES = {"one": "1 worker process", "two": "2 worker processes"}
RUNS = 3  # runs of each layout, alternating (--runs overrides)

MARKER = "DRAFT-BODY-MARKER"
BIG_DRAFT = "Ticket T-1001: " + f"{MARKER} lorem ipsum dolor sit amet. " * 2300  # ~101 KB
BIG_MAX_TOKENS = 65536
DEMO_WORKER = WorkerSpec("e", 1, 2)


# --- b: one worker process against two ----------------------------------------------------


def run_scaling(ctx: Context, section: Section) -> None:
    """Alternate the two layouts --runs times; figures from the medians."""
    n = QUICK_N if ctx.options.quick else ctx.options.n
    section.title = f"N = {n:,}, pool 32, 50 ms, distributed: 1 vs 2 worker processes"
    shape = build(ctx.folder("b-scenario"), n, LATENCY_MS, POOL)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in LAYOUTS}
    with Provider(shape.root / "scenarios" / "demo.yaml", ctx.folder("b-provider") / "log") as llm:
        for _ in range(ctx.options.runs_or(RUNS)):
            for name, specs in LAYOUTS.items():
                runs[name].append(_distributed_run(ctx, llm, n, specs))
    ideal = shape.critical_path_s()
    section.raw = {"n": n, "pool": POOL, "latency_ms": LATENCY_MS, "ideal_s": ideal}
    section.raw |= {name: [_run_json(r) for r in rs] for name, rs in runs.items()}
    section.add(*_scaling_figures(n, ideal, runs))


def _distributed_run(
    ctx: Context, llm: Provider, n: int, specs: list[WorkerSpec]
) -> dict[str, Any]:
    """One run on a fresh Redis and fresh workers; the run and the provider's cost."""
    with RedisServer(tcp=True) as server:
        env = {"TICKETGRAPH_BROKER_URL": server.url, "LLM_BASE_URL": llm.url}
        env["POOL_SIZE"] = str(POOL)
        with Workers(specs, child_env(**env), ctx.folder("b-workers")):
            workload = build(ctx.folder("b-ours"), n, LATENCY_MS, POOL)
            with llm.metered() as meter:
                run = run_ticketgraph(workload.root, workload.root / "logs", ctx.timeout_s(), env)
    run.check(workload.calls, workload.tokens, n)
    return {"run": run, "provider": meter.cost, "workers": [vars(s) for s in specs]}


def _run_json(r: dict[str, Any]) -> dict[str, Any]:
    return {"run": r["run"].to_json(), "provider": r["provider"].to_json(), "workers": r["workers"]}


def _scaling_figures(n: int, ideal: float, runs: dict[str, list[dict[str, Any]]]) -> list[Figure]:
    """Wall and throughput per layout, their ratio, and ideal/actual of both."""
    figures, rate, problems = [], {}, {}
    for name, rs in runs.items():
        ok, problems[name] = usable([r["run"] for r in rs])
        span = median(run.span_s for run in ok)
        rate[name] = ratio_of(n, span)
        in_flight = max(r["provider"].max_in_flight for r in rs)
        figures += _layout_figures(name, span, rate[name], ideal, in_flight, problems[name])
    scale = Target(">=", 1.8, "2 processes ≥ 1.8× the throughput of 1")
    ratio = rounded(ratio_of(rate["two"], rate["one"]))
    label = "throughput, 2 processes / 1 process"
    valid = not (problems["one"] or problems["two"])
    return [*figures, Figure("two_over_one", label, ratio, "×", scale, valid=valid)]


def _layout_figures(
    name: str,
    span: float | None,
    rate: float | None,
    ideal: float,
    in_flight: int,
    problem: str,
) -> list[Figure]:
    """Run wall, throughput, ideal/actual (target: 2 processes) and requests in flight."""
    label = LAYOUT_NAMES[name]
    close = Target(">=", 0.92, "ideal/actual ≥ 0.92") if name == "two" else None
    return [
        Figure(f"{name}.run_s", f"{label}: run wall", rounded(span), "s", note=problem),
        Figure(
            f"{name}.throughput",
            f"{label}: throughput",
            rounded(rate, 1),
            "tickets/s",
            valid=not problem,
        ),
        Figure(
            f"{name}.ideal_over_actual",
            f"{label}: ideal / actual run wall",
            rounded(ratio_of(ideal, span)),
            "",
            close,
            valid=not problem,
            note=f"ideal {ideal:.2f} s (critical path at pool 32)",
        ),
        Figure(
            f"{name}.max_in_flight",
            f"{label}: most requests in flight",
            in_flight,
            "",
            note="at the provider; POOL_SIZE is 32",
        ),
    ]


# --- e: bytes per task message ---------------------------------------------------------------


def big_variant(scripts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The demo scripts for model `big`, where T-1001's final draft is ~100 KB."""
    big = copy.deepcopy(scripts)
    for script in big:
        script["name"] = f"big-{script['name']}"
        script["when"] = {**script.get("when", {}), "model": "^big$"}
    t1001 = next(s for s in big if s["name"] == "big-T-1001#1")
    t1001["replies"][-1]["text"] = BIG_DRAFT
    return big


def use_big_model(root: Path) -> None:
    """Point a demo workspace at model `big` (big_variant's scripts)."""
    config = root / CONFIG_FILE
    # A reply is cut at max_tokens (the scripted provider's as a real one's): the 100 KB
    # draft, about 25,000 tokens, needs a cap that holds it.
    text = config.read_text().replace('model = "demo"', 'model = "big"')
    config.write_text(text.replace("max_tokens = 1024", f"max_tokens = {BIG_MAX_TOKENS}", 1))


def run_broker_bytes(ctx: Context, section: Section) -> None:
    """The demo as it is and with a 100 KB draft, each under a Redis MONITOR."""
    section.title = "broker bytes per task message, demo with 1 KB and 100 KB drafts"
    scenario = _scenario_file(ctx)
    with RedisServer(tcp=True) as server, Provider(scenario, scenario.with_suffix(".log")) as llm:
        env = {"TICKETGRAPH_BROKER_URL": server.url, "LLM_BASE_URL": llm.url}
        with Workers([DEMO_WORKER], child_env(**env), ctx.folder("e-workers")):
            small = _monitored(ctx, server.port or 0, env, big=False)
            big = _monitored(ctx, server.port or 0, env, big=True)
    section.raw = {"small": small, "big": big}
    section.add(*_bytes_figures(small, big))


def _scenario_file(ctx: Context) -> Path:
    """The demo scripts and their `big` copies, in one scenario file."""
    demo = ctx.folder("e-demo")
    init_demo(demo)
    scripts = yaml.safe_load((demo / "scenarios" / "demo.yaml").read_text(encoding="utf-8"))
    path = ctx.folder("e-provider") / "scenarios.yaml"
    path.write_text(yaml.safe_dump(big_variant(scripts) + scripts, sort_keys=False))
    return path


def _monitored(ctx: Context, port: int, env: dict[str, str], big: bool) -> dict[str, Any]:
    """One demo run under MONITOR: sizes of the LPUSH values, and where the draft went."""
    root = ctx.folder("e-big" if big else "e-small")
    init_demo(root)
    if big:
        use_big_model(root)
    with Monitor(port) as monitor:
        run = run_ticketgraph(root, root / "logs", ctx.timeout_s(), env)
    run.check(None, None, 6)
    sizes = [len(value) for value in monitor.pushes()]
    return {
        "run": run.to_json(),
        "problem": run.problem,
        "pushes": len(sizes),
        "max_bytes": max(sizes, default=None),
        "mean_bytes": round(statistics.mean(sizes), 1) if sizes else None,
        "draft_bytes": (root / "out" / "T-1001.txt").stat().st_size if run.folder else None,
        "draft_text_in_redis": any(MARKER in c for c in monitor.commands),
    }


def _bytes_figures(small: dict[str, Any], big: dict[str, Any]) -> list[Figure]:
    """Max and mean payload per variant, their difference, the size bound."""
    problem = _bytes_problem(small, big)
    figures = [*_payload_figures("small", "1 KB drafts", small, problem)]
    figures += _payload_figures("big", "100 KB drafts", big, problem)
    difference = None
    if small["max_bytes"] is not None and big["max_bytes"] is not None:
        difference = abs(big["max_bytes"] - small["max_bytes"])
    equal = Target("<=", 1024, "equal for 1 KB and 100 KB drafts (within 1 KB)")
    label = "LPUSH max, |100 KB − 1 KB drafts|"
    return [
        *figures,
        Figure(
            "max_difference_bytes", label, difference, "B", equal, note=problem, valid=not problem
        ),
        Figure("big.draft_bytes", "T-1001 draft on disk, 100 KB variant", big["draft_bytes"], "B"),
    ]


def _payload_figures(key: str, name: str, run: dict[str, Any], problem: str) -> list[Figure]:
    """The largest LPUSH value (target < 2 KB) and the mean one, of one variant."""
    under_2k = Target("<", 2048, "< 2 KB")
    return [
        Figure(
            f"{key}.max_bytes",
            f"LPUSH payload max, {name}",
            run["max_bytes"],
            "B",
            under_2k,
            note=run["problem"],
            valid=not problem,
        ),
        Figure(
            f"{key}.mean_bytes",
            f"LPUSH payload mean, {name}",
            run["mean_bytes"],
            "B",
            note=f"{run['pushes']} pushes",
        ),
    ]


def _bytes_problem(small: dict[str, Any], big: dict[str, Any]) -> str:
    """Why the comparison would not hold: a failed run, a small big draft, text in Redis."""
    if small["problem"] or big["problem"]:
        return small["problem"] or big["problem"]
    if (big["draft_bytes"] or 0) < 100_000:
        return f"the big draft is only {big['draft_bytes']} bytes"
    if big["draft_text_in_redis"]:
        return "draft text went through Redis"
    return ""
