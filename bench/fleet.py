"""Section h: the regime real fleets run in: N = 10,000, pool 512, every model call 2 s.

At this latency the work is waiting, so what counts is how many requests one run keeps in
flight, and what each in-flight request costs in threads and memory. One embedded
`ticketgraph run` (its default layout: one worker process per core, pool / processes threads
each) and the LangGraph peer (one process, `max_concurrency` = pool) run the same workload
against one scripted provider process, whose /stats count the requests in flight; ours
first, then LangGraph. The figures: each run's wall against the ideal (the critical path
at 2 s), ours over LangGraph, the provider's most requests in flight during each run
against the pool, the peak RSS of our largest process and the threads of each of ours.
"""

from __future__ import annotations

from bench.figures import Figure, Target, ratio_of, rounded
from bench.runs import OurRun, PeerRun, run_langgraph, run_ticketgraph
from bench.services import Provider, ProviderCost
from bench.suite import Context, Section
from bench.workload import build

POOL = 512
LATENCY_MS = 2000
QUICK_N = 1000
RSS_LIMIT_MB = 300


def run(ctx: Context, section: Section) -> None:
    """Ours, then LangGraph, on fresh workspaces of one workload and one provider."""
    n = min(QUICK_N, ctx.options.big_n) if ctx.options.quick else ctx.options.big_n
    section.title = f"N = {n:,}, pool {POOL}, {LATENCY_MS / 1000:g} s per call: the fleet regime"
    shape = build(ctx.folder("h-scenario"), n, LATENCY_MS, POOL)
    with Provider(shape.root / "scenarios" / "demo.yaml", ctx.folder("h-provider") / "log") as llm:
        ours_ws = build(ctx.folder("h-ours"), n, LATENCY_MS, POOL)
        with llm.metered() as ours_meter:
            ours = run_ticketgraph(
                ours_ws.root, ours_ws.root / "logs", ctx.timeout_s(), {"LLM_BASE_URL": llm.url}
            )
        ours.check(ours_ws.calls, ours_ws.tokens, n)
        peer_ws = build(ctx.folder("h-langgraph"), n, LATENCY_MS, POOL)
        with llm.metered() as peer_meter:
            peer = run_langgraph(peer_ws.root, llm.url, POOL, ctx.timeout_s())
        peer.check(sum(peer_ws.calls.values()), peer_ws.tokens)
    ideal = shape.critical_path_s()
    section.raw = {
        "n": n,
        "pool": POOL,
        "latency_ms": LATENCY_MS,
        "ideal_s": ideal,
        "ours": ours.to_json(),
        "ours_provider": ours_meter.cost.to_json(),
        "langgraph": peer.to_json(),
        "langgraph_provider": peer_meter.cost.to_json(),
    }
    section.add(*figures(ideal, ours, ours_meter.cost, peer, peer_meter.cost))


def figures(
    ideal: float, ours: OurRun, ours_cost: ProviderCost, peer: PeerRun, peer_cost: ProviderCost
) -> list[Figure]:
    """Walls against the ideal and each other, requests in flight, memory and threads."""
    ours_s = ours.span_s if ours.ok else None
    peer_s = peer.wall_s if not peer.problem else None
    note = ours.problem
    workers = [p for p in ours.process.peaks if p.role.startswith("worker")]
    return [
        Figure("ours.wall", "ours (embedded): run wall", rounded(ours_s), "s", note=note),
        Figure(
            "ours.ideal",
            f"ours: ideal / actual (ideal {ideal:.1f} s)",
            rounded(ratio_of(ideal, ours_s)),
            target=Target(">=", 0.9, ">= 0.9 of ideal"),
            note=note,
        ),
        Figure("peer.wall", "LangGraph (in memory): run wall", rounded(peer_s), "s"),
        Figure(
            "peer.ideal",
            "LangGraph: ideal / actual",
            rounded(ratio_of(ideal, peer_s)),
            note=peer.problem,
        ),
        Figure(
            "ours_over_langgraph",
            "ours / LangGraph, run wall",
            rounded(ratio_of(ours_s, peer_s)),
            "x",
            Target("<=", 1.0, "faster than LangGraph"),
            note=note or peer.problem,
        ),
        Figure(
            "ours.in_flight",
            "ours: most requests in flight at the provider",
            float(ours_cost.max_in_flight),
            target=Target(">=", POOL, f"reaches the pool ({POOL})"),
            note=note,
        ),
        Figure(
            "peer.in_flight",
            "LangGraph: most requests in flight at the provider",
            float(peer_cost.max_in_flight),
        ),
        Figure(
            "ours.rss",
            "ours: peak RSS, largest process",
            rounded(ours.process.largest_peak_mb, 1),
            "MB",
            Target("<", RSS_LIMIT_MB, f"< {RSS_LIMIT_MB} MB"),
            note=note,
        ),
        Figure(
            "ours.cpu_ms_per_ticket",
            "ours: CPU of all processes per ticket (provider apart)",
            rounded(ours.cpu_ms_per_ticket),
            "ms",
            note=note,
        ),
        Figure(
            "ours.threads",
            "ours: most threads in a worker process",
            float(max((p.threads for p in workers), default=0)) or None,
            extra={"per_process": [p.to_json() for p in ours.process.peaks]},
        ),
    ]
