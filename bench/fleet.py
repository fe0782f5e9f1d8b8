"""Section h: the regime real fleets run in: N = 10,000, pool 512, every model call 2 s.

At this latency the work is waiting, so what counts is how many requests one run keeps in
flight, and what each in-flight request costs in threads and memory. Three runs of the same
workload against one scripted provider process, whose /stats count the requests in flight:
an embedded `ticketgraph run` (its default layout: one worker process per core, pool /
processes threads each); the same run distributed, on a private TCP Redis with two
`ticketgraph worker --processes 1 --threads 256` started and ready before it (as section b
runs them); and the LangGraph peer (one process, `max_concurrency` = pool). The figures:
each run's wall against the ideal (the critical path at 2 s), ours over LangGraph, the
provider's most requests in flight during each run against the pool, the peak RSS of the
largest process and the threads of each of ours (the distributed workers' sampled from
/proc while the run goes on).
"""

from __future__ import annotations

from bench.figures import Figure, Target, ratio_of, rounded
from bench.runs import OurRun, PeerRun, run_langgraph, run_ticketgraph
from bench.services import Provider, ProviderCost, Workers, WorkerSpec, child_env
from bench.suite import Context, Section
from bench.watch import ProcessPeak, TreeSampler
from bench.workload import build
from orchestrator.broker.redis_server import RedisServer

POOL = 512
LATENCY_MS = 2000
QUICK_N = 1000
RSS_LIMIT_MB = 300
WORKERS = [WorkerSpec("h1", 1, POOL // 2), WorkerSpec("h2", 1, POOL // 2)]


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
        spread, spread_cost, spread_peaks = _distributed(ctx, llm, n)
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
        "distributed": spread.to_json(),
        "distributed_provider": spread_cost.to_json(),
        "distributed_workers": [p.to_json() for p in spread_peaks],
        "langgraph": peer.to_json(),
        "langgraph_provider": peer_meter.cost.to_json(),
    }
    section.add(*figures(ideal, ours, ours_meter.cost, peer, peer_meter.cost))
    section.add(*distributed_figures(ideal, spread, spread_cost, spread_peaks, peer))


def _distributed(
    ctx: Context, llm: Provider, n: int
) -> tuple[OurRun, ProviderCost, list[ProcessPeak]]:
    """The run on two worker processes (fresh Redis, workers ready before it starts); the
    provider's cost of it and the workers' peak RSS and threads, sampled while it runs."""
    with RedisServer(tcp=True) as server:
        env = {"TICKETGRAPH_BROKER_URL": server.url, "LLM_BASE_URL": llm.url}
        with Workers(WORKERS, child_env(**env), ctx.folder("h-workers")) as workers:
            samplers = [TreeSampler(pid) for pid in workers.pids]
            workload = build(ctx.folder("h-distributed"), n, LATENCY_MS, POOL)
            for sampler in samplers:
                sampler.start()
            try:
                with llm.metered() as meter:
                    run = run_ticketgraph(
                        workload.root, workload.root / "logs", ctx.timeout_s(), env
                    )
            finally:
                peaks = [peak for sampler in samplers for peak in sampler.stop()]
    run.check(workload.calls, workload.tokens, n)
    return run, meter.cost, peaks


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


def distributed_figures(
    ideal: float, run: OurRun, cost: ProviderCost, peaks: list[ProcessPeak], peer: PeerRun
) -> list[Figure]:
    """The distributed run: wall against the ideal and LangGraph, in flight, memory, threads."""
    span = run.span_s if run.ok else None
    peer_s = peer.wall_s if not peer.problem else None
    note = run.problem
    workers = [p for p in peaks if p.threads > 1]  # the Celery processes, not a launcher
    largest = max((p.vmhwm_kib for p in peaks), default=0) / 1024 or None
    label = f"{len(WORKERS)} worker processes"
    return [
        Figure("distributed.wall", f"ours ({label}): run wall", rounded(span), "s", note=note),
        Figure(
            "distributed.ideal",
            f"ours ({label}): ideal / actual",
            rounded(ratio_of(ideal, span)),
            target=Target(">=", 0.9, ">= 0.9 of ideal"),
            note=note,
        ),
        Figure(
            "distributed_over_langgraph",
            f"ours ({label}) / LangGraph, run wall",
            rounded(ratio_of(span, peer_s)),
            "x",
            Target("<=", 1.0, "faster than LangGraph"),
            note=note or peer.problem,
        ),
        Figure(
            "distributed.in_flight",
            f"ours ({label}): most requests in flight at the provider",
            float(cost.max_in_flight),
            target=Target(">=", POOL, f"reaches the pool ({POOL})"),
            note=note,
        ),
        Figure(
            "distributed.rss",
            f"ours ({label}): peak RSS, largest worker process",
            rounded(largest, 1),
            "MB",
            Target("<", RSS_LIMIT_MB, f"< {RSS_LIMIT_MB} MB"),
            note=note,
        ),
        Figure(
            "distributed.threads",
            f"ours ({label}): most threads in a worker process",
            float(max((p.threads for p in workers), default=0)) or None,
            extra={"per_process": [p.to_json() for p in peaks]},
        ),
    ]
