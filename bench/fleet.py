"""Section h: the regime real fleets run in: N = 10,000, pool 512, every model call 2 s.

At this latency the work is waiting, so what counts is how many requests one run keeps in
flight, and what each in-flight request costs in threads and memory. Four runs of the same
workload against one scripted provider process, whose /stats count the requests in flight:
an embedded `ticketgraph run` (its default layout: one worker process per core, up to two a
core to hold at most 128 threads each, pool / processes threads each); the same run
distributed, on a private TCP Redis with two `ticketgraph worker --processes 1 --threads
256` started and ready before it (as section b runs them); again with three `ticketgraph
worker --processes 1` on one machine sharing one private Redis, the pool's 512 threads split
171 / 171 / 170; and the LangGraph peer (one process, `max_concurrency` = pool). The figures:
each run's wall against the ideal (the critical path at 2 s; target: ideal / actual >= 0.9
for the embedded run and each worker layout), ours over LangGraph, the provider's most
requests in flight during each run against the pool, the peak RSS of the largest process
and the threads of each of ours (the distributed workers' sampled from /proc while the run
goes on).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

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


def split(pool: int, workers: int, prefix: str = "h") -> list[WorkerSpec]:
    """`workers` one-process `ticketgraph worker`s whose threads add up to `pool`, the first
    ones taking the remainder (512 over 3: 171, 171, 170)."""
    share, extra = divmod(pool, workers)
    return [WorkerSpec(f"{prefix}{i + 1}", 1, share + (i < extra)) for i in range(workers)]


# The worker layouts: figure key -> the `ticketgraph worker` processes on one private Redis.
WORKER_LAYOUTS = {"distributed": split(POOL, 2), "three": split(POOL, 3)}


def run(ctx: Context, section: Section) -> None:
    """Ours embedded, ours on two and on three workers, then LangGraph, on fresh workspaces
    of one workload and one provider."""
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
        spread = {key: _distributed(ctx, llm, n, key) for key in WORKER_LAYOUTS}
        peer_ws = build(ctx.folder("h-langgraph"), n, LATENCY_MS, POOL)
        with llm.metered() as peer_meter:
            peer = run_langgraph(peer_ws.root, llm.url, POOL, ctx.timeout_s())
        peer.check(peer_ws.peer_calls, peer_ws.peer_tokens)
    ideal = shape.critical_path_s()
    embedded = Layout("ours", "ours (embedded)", ours, ours_meter.cost, ours.process.peaks, True)
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
    for key, layout in spread.items():
        section.raw |= layout_raw(key, layout)
    section.add(*layout_figures(ideal, embedded, peer), *peer_figures(ideal, peer, peer_meter.cost))
    for layout in spread.values():
        section.add(*layout_figures(ideal, layout, peer))


@dataclass
class Layout:
    """One of our runs of the section: its figures' key prefix and label, the run, what the
    provider saw of it, and the peaks of the processes that ran its tickets."""

    key: str
    label: str
    run: OurRun | None
    cost: ProviderCost
    peaks: list[ProcessPeak]
    # Whether every process that ran it is the CLI's (embedded): then wait4 counted its CPU.
    reaped: bool = False
    note: str = ""  # why there is no run (the workers did not start)


def layout_raw(key: str, layout: Layout) -> dict[str, Any]:
    """A worker layout's run, what the provider saw of it and its workers' peaks, keyed by
    the layout (`distributed`, `distributed_provider`, `distributed_workers`)."""
    return {
        key: layout.run.to_json() if layout.run else {"note": layout.note},
        f"{key}_provider": layout.cost.to_json(),
        f"{key}_workers": [p.to_json() for p in layout.peaks],
    }


def _distributed(ctx: Context, llm: Provider, n: int, key: str) -> Layout:
    """The run on the worker processes of WORKER_LAYOUTS[key] (fresh Redis, workers ready
    before it starts), with the workers' peak RSS and threads sampled while it runs."""
    specs = WORKER_LAYOUTS[key]
    threads = "/".join(str(spec.threads) for spec in specs)
    label = f"ours ({len(specs)} worker processes, {threads} threads)"
    with RedisServer(tcp=True) as server, contextlib.ExitStack() as stack:
        env = {"TICKETGRAPH_BROKER_URL": server.url, "LLM_BASE_URL": llm.url}
        try:
            workers = stack.enter_context(Workers(specs, child_env(**env), ctx.folder(f"h-{key}")))
        except RuntimeError as exc:  # a worker that did not start: the other runs still count
            return Layout(key, label, None, ProviderCost(0, 0.0, 0), [], note=str(exc))
        samplers = [TreeSampler(pid) for pid in workers.pids]
        workload = build(ctx.folder(f"h-{key}-run"), n, LATENCY_MS, POOL)
        for sampler in samplers:
            sampler.start()
        try:
            with llm.metered() as meter:
                spread = run_ticketgraph(
                    workload.root, workload.root / "logs", ctx.timeout_s(), env
                )
        finally:
            peaks = [peak for sampler in samplers for peak in sampler.stop()]
    spread.check(workload.calls, workload.tokens, n)
    return Layout(key, label, spread, meter.cost, peaks)


def layout_figures(ideal: float, ours: Layout, peer: PeerRun) -> list[Figure]:
    """One of our runs: its wall against the ideal and LangGraph's, requests in flight, the
    peak RSS of its largest process, its CPU per ticket (when its processes were all
    reaped by the CLI) and the most threads in one of its processes."""
    run, key, label = ours.run, ours.key, ours.label
    span = run.span_s if run is not None and run.ok else None
    note = ours.note or (run.problem if run is not None else "")
    peer_s = peer.wall_s if not peer.problem else None
    largest = max((p.vmhwm_kib for p in ours.peaks), default=0) / 1024 or None
    threads = max((p.threads for p in ours.peaks), default=0) or None
    figures = [
        Figure(f"{key}.wall", f"{label}: run wall", rounded(span), "s", note=note),
        Figure(
            f"{key}.ideal",
            f"{label}: ideal / actual (ideal {ideal:.1f} s)",
            rounded(ratio_of(ideal, span)),
            target=Target(">=", 0.9, ">= 0.9 of ideal"),
            note=note,
        ),
        Figure(
            f"{key}_over_langgraph",
            f"{label} / LangGraph, run wall",
            rounded(ratio_of(span, peer_s)),
            "x",
            Target("<=", 1.0, "faster than LangGraph"),
            note=note or peer.problem,
        ),
        Figure(
            f"{key}.in_flight",
            f"{label}: most requests in flight at the provider",
            float(ours.cost.max_in_flight),
            target=Target(">=", POOL, f"reaches the pool ({POOL})"),
            note=note,
        ),
        Figure(
            f"{key}.rss",
            f"{label}: peak RSS, largest process",
            rounded(largest, 1),
            "MB",
            Target("<", RSS_LIMIT_MB, f"< {RSS_LIMIT_MB} MB"),
            note=note,
        ),
    ]
    if ours.reaped:
        cpu = run.cpu_ms_per_ticket if run is not None else None
        label_cpu = f"{label}: CPU of all processes per ticket (provider apart)"
        figures.append(Figure(f"{key}.cpu_ms_per_ticket", label_cpu, rounded(cpu), "ms"))
    figures.append(
        Figure(
            f"{key}.threads",
            f"{label}: most threads in one process",
            float(threads) if threads else None,
            extra={"per_process": [p.to_json() for p in ours.peaks]},
        )
    )
    return figures


def peer_figures(ideal: float, peer: PeerRun, cost: ProviderCost) -> list[Figure]:
    """The LangGraph peer's wall, against the ideal, and its requests in flight."""
    peer_s = peer.wall_s if not peer.problem else None
    return [
        Figure("peer.wall", "LangGraph (in memory): run wall", rounded(peer_s), "s"),
        Figure(
            "peer.ideal",
            "LangGraph: ideal / actual",
            rounded(ratio_of(ideal, peer_s)),
            note=peer.problem,
        ),
        Figure(
            "peer.in_flight",
            "LangGraph: most requests in flight at the provider",
            float(cost.max_in_flight),
        ),
    ]
