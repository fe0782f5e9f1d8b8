"""Section a: ticketgraph beside its peers on the scaled workload (N = 1,000, pool 16, 50 ms).

Per round, in this order, each on a fresh workspace from `bench.workload.build`:
1. ours: embedded `ticketgraph run` (no broker URL, no LLM_BASE_URL: it starts its own Redis,
   worker processes, and serves the workspace's scenarios/demo.yaml in its own process);
2. the LangGraph peer as its own process against a scripted provider process serving the
   same scenario file (that provider's /stats give its CPU per request);
3. the seed's Node script (`bench.peers.seed_script`, its own in-process stub), if node is on
   PATH.
Rounds alternate the three, so a noisy minute hurts all of them alike. Once, after the
rounds: ours with LLM_BASE_URL pointing at the provider process (still an embedded broker),
so the provider's CPU per request can be compared between ours and LangGraph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench.figures import Figure, Target, ratio_of, rounded
from bench.peers import seed_script
from bench.peers.result import PeerResult, PeerStatus
from bench.runs import OurRun, PeerRun, run_langgraph, run_ticketgraph, usable
from bench.services import Provider, ProviderCost
from bench.suite import Context, Section, median
from bench.workload import Workload, build

POOL = 16
LATENCY_MS = 50
QUICK_N = 100
PEER_NAMES = {"langgraph": "LangGraph", "langgraph_sqlite": "LangGraph + SQLite checkpoints"}
TITLE = "pool 16, 50 ms: embedded `ticketgraph run` vs LangGraph vs the seed script"


def run(ctx: Context, section: Section) -> None:
    """Measure the rounds and the provider-CPU run, then turn them into figures."""
    n = QUICK_N if ctx.options.quick else ctx.options.n
    section.title = f"N = {n:,}, {TITLE}"
    shape = build(ctx.folder("a-scenario"), n, LATENCY_MS, POOL)
    rounds: list[dict[str, Any]] = []
    with Provider(shape.root / "scenarios" / "demo.yaml", ctx.folder("a-provider") / "log") as llm:
        for _ in range(ctx.options.runs_or(2)):
            rounds.append(_round(ctx, llm, n))
        external = None if ctx.options.quick else _ours_external(ctx, llm, n)
    section.raw = {
        "n": n,
        "pool": POOL,
        "latency_ms": LATENCY_MS,
        "ideal_s": shape.critical_path_s(),
        "list_schedule_s": shape.list_schedule_s(),
        "expected": {"calls": shape.calls, "tokens": shape.tokens},
        "rounds": [_round_json(r) for r in rounds],
        "ours_external_provider": external and _external_json(external),
    }
    section.add(*_figures(shape, rounds, external))


def _fresh(ctx: Context, n: int, name: str) -> Workload:
    """A new workspace of the workload."""
    return build(ctx.folder(name), n, LATENCY_MS, POOL)


def _ours(ctx: Context, n: int, env: dict[str, str] | None = None) -> OurRun:
    """One embedded run of ours on a fresh workspace, checked against the workload."""
    workload = _fresh(ctx, n, "a-ours")
    run = run_ticketgraph(workload.root, workload.root / "logs", ctx.timeout_s(), env)
    run.check(workload.calls, workload.tokens, n)
    return run


def _round(ctx: Context, llm: Provider, n: int) -> dict[str, Any]:
    """Ours, LangGraph, the seed script: one run each."""
    ours = _ours(ctx, n)
    workload = _fresh(ctx, n, "a-langgraph")
    with llm.metered() as meter:
        peer = run_langgraph(workload.root, llm.url, POOL, ctx.timeout_s())
    peer.check(workload.peer_calls, workload.peer_tokens)
    cost = meter.cost
    durable_workload = _fresh(ctx, n, "a-langgraph-sqlite")
    durable = run_langgraph(durable_workload.root, llm.url, POOL, ctx.timeout_s(), durable=True)
    durable.check(durable_workload.peer_calls, durable_workload.peer_tokens)
    seed = seed_script.run(tickets=n, pool=POOL, latency_ms=LATENCY_MS)
    return {
        "ours": ours,
        "langgraph": peer,
        "langgraph_sqlite": durable,
        "langgraph_provider": cost,
        "seed": seed,
    }


def _ours_external(ctx: Context, llm: Provider, n: int) -> tuple[OurRun, ProviderCost]:
    """Ours against the provider process (embedded broker): the provider's cost per request."""
    with llm.metered() as meter:
        ours = _ours(ctx, n, {"LLM_BASE_URL": llm.url})
    return ours, meter.cost


def _round_json(r: dict[str, Any]) -> dict[str, Any]:
    seed: PeerResult = r["seed"]
    return {
        "ours": r["ours"].to_json(),
        "langgraph": r["langgraph"].to_json(),
        "langgraph_sqlite": r["langgraph_sqlite"].to_json(),
        "langgraph_provider": r["langgraph_provider"].to_json(),
        "seed_script": seed.to_json(),
    }


def _external_json(external: tuple[OurRun, ProviderCost]) -> dict[str, Any]:
    ours, cost = external
    return {"ours": ours.to_json(), "provider": cost.to_json()}


@dataclass(frozen=True)
class Walls:
    """One system's median run wall and whole-process wall over the rounds that went right."""

    run_s: float | None
    process_s: float | None
    count: int
    problem: str = ""


def _ours_walls(rounds: list[dict[str, Any]]) -> Walls:
    ours, problem = usable([r["ours"] for r in rounds])
    spans, commands = [o.span_s for o in ours], [o.process.wall_s for o in ours]
    return Walls(median(spans), median(commands), len(ours), problem)


def _langgraph_walls(rounds: list[dict[str, Any]], key: str = "langgraph") -> Walls:
    peers: list[PeerRun] = [r[key] for r in rounds]
    ok = [p for p in peers if not p.problem]
    problem = next((p.problem for p in peers if p.problem), "")
    return Walls(
        median(p.wall_s for p in ok), median(p.process_wall_s for p in ok), len(ok), problem
    )


def _seed_walls(rounds: list[dict[str, Any]]) -> Walls:
    seeds: list[PeerResult] = [r["seed"] for r in rounds]
    ok = [s for s in seeds if s.status is PeerStatus.OK]
    bad = next((s for s in seeds if s.status is not PeerStatus.OK), None)
    problem = f"{bad.status.value}: {bad.reason}" if bad else ""
    return Walls(median(s.wall_s for s in ok), median(s.total_s for s in ok), len(ok), problem)


def _figures(
    shape: Workload, rounds: list[dict[str, Any]], external: tuple[OurRun, ProviderCost] | None
) -> list[Figure]:
    """Medians over rounds, their ratios to the ideal and to the peers."""
    ours, seed = _ours_walls(rounds), _seed_walls(rounds)
    peers = {key: _langgraph_walls(rounds, key) for key in PEER_NAMES}
    return [
        *_ideal_figures(shape, ours),
        *_peer_figures(ours, peers, seed),
        *_provider_figures(rounds, external),
    ]


def _ideal_figures(shape: Workload, ours: Walls) -> list[Figure]:
    """Our walls and how close the run came to the critical path."""
    ideal = shape.critical_path_s()
    count = f"median of {ours.count}"
    target = Target(">=", 0.85, "ideal/actual ≥ 0.85")
    return [
        Figure(
            "ours.command_s", f"ours: whole command wall ({count})", rounded(ours.process_s), "s"
        ),
        Figure(
            "ours.run_s",
            "ours: run wall (run.jsonl span)",
            rounded(ours.run_s),
            "s",
            note=ours.problem,
        ),
        Figure("ideal_s", "ideal: critical path (critical_path_s)", rounded(ideal), "s"),
        Figure(
            "ideal_over_actual",
            "ours: ideal / actual run wall",
            rounded(ratio_of(ideal, ours.run_s)),
            "",
            target,
            valid=not ours.problem,
        ),
    ]


def _peer_figures(ours: Walls, peers: dict[str, Walls], seed: Walls) -> list[Figure]:
    """Each LangGraph peer's walls (in memory; durable, with its SQLite checkpointer) and
    ours over theirs."""
    figures: list[Figure] = []
    for key, peer in peers.items():
        name = PEER_NAMES[key]
        not_slower = Target("<=", 1.0, f"ours not slower than {name}")
        figures += [
            Figure(
                f"{key}.run_s",
                f"{name}: run wall (1st request→report)",
                rounded(peer.run_s),
                "s",
                note=peer.problem,
            ),
            Figure(f"{key}.process_s", f"{name}: whole process wall", rounded(peer.process_s), "s"),
        ]
        for wall, what in (("run", "run wall"), ("process", "whole process")):
            ratio = ratio_of(getattr(ours, f"{wall}_s"), getattr(peer, f"{wall}_s"))
            figures.append(
                Figure(
                    f"ours_over_{key}.{wall}",
                    f"ours / {name}, {what}",
                    rounded(ratio),
                    "×",
                    not_slower,
                    valid=not ours.problem,
                )
            )
    return figures + _seed_figures(ours, seed)


def _seed_figures(ours: Walls, seed: Walls) -> list[Figure]:
    """The seed script's wall and ours over it, for reference."""
    ratio = ratio_of(ours.run_s, seed.run_s)
    return [
        Figure(
            "seed.run_s",
            "seed script: run wall (Σ node ms)",
            rounded(seed.run_s),
            "s",
            note=seed.problem,
        ),
        Figure("ours_over_seed.run", "ours / seed script, run wall", rounded(ratio), "×"),
    ]


def _provider_figures(
    rounds: list[dict[str, Any]], external: tuple[OurRun, ProviderCost] | None
) -> list[Figure]:
    """Provider CPU per request serving LangGraph, and serving ours (once, if measured)."""
    lg = median(r["langgraph_provider"].cpu_ms_per_request for r in rounds)
    figures = [
        Figure("provider_cpu.langgraph", "provider CPU per request, LangGraph", rounded(lg), "ms")
    ]
    if external is not None:
        ours, cost = external
        per_request = cost.cpu_ms_per_request if ours.ok else None
        figures += [
            Figure(
                "provider_cpu.ours",
                "provider CPU per request, ours",
                rounded(per_request),
                "ms",
                note=ours.problem,
            ),
            Figure(
                "ours_external.run_s",
                "ours with the provider process: run wall",
                rounded(ours.span_s if ours.ok else None),
                "s",
                note=ours.problem,
            ),
        ]
    return figures
