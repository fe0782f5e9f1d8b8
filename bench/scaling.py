"""Section c: what a ticket costs as runs grow: latency 0, embedded, pool 16.

Three embedded runs on fresh workspaces, N = 100, 1,000 and 10,000 (--quick: 100, 300,
2,000), each `ticketgraph run` watched by `bench.watch`: run wall per ticket (run.jsonl span
/ N), CPU of all processes per ticket (user + system of the command and of every process it
reaps: its Redis and worker processes; the scripted provider runs in the CLI), bytes written
per ticket (`ru_oublock` × 512 / N; the CLI reaps its forked workers and its Redis, so their
writes roll up), the run folder's final size per ticket, and the peak RSS of every process of
the run. The largest run is sized to the time budget: its duration is estimated from the
1,000 run (its span per ticket × N × 1.2, plus start and stop); if it would not fit, it runs
at the largest N that does (labelled so), or not at all.

Then, if time allows: ours (embedded broker) and the two LangGraph peers (in memory, and with
SQLite checkpoints) at N = 1,000 against one provider process, for the provider's CPU per
request at latency 0 and each system's CPU per ticket with the provider's counted in, as the
embedded figure counts it: the CPU target's yardstick on the same workload. Right after ours,
ours again with its workspace on tmpfs (/dev/shm, if there is room): the share of its CPU a
ticket that the disk's filesystem takes, and what the ratios to the peers would read without
it (references: a run's files must be on a disk to outlive a crash).
"""

from __future__ import annotations

import math
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import machine
from bench.compare import PEER_NAMES
from bench.figures import Figure, Target, ratio_of, rounded
from bench.runs import OurRun, PeerRun, run_langgraph, run_ticketgraph
from bench.services import Provider, ProviderCost
from bench.suite import Context, Options, Section
from bench.watch import BLOCK_BYTES
from bench.workload import build

POOL = 16
LATENCY_MS = 0
QUICK_SIZES = (100, 300, 2000)
# The big run's estimate: the base run's span per ticket × N × MARGIN, plus its start and
# stop, plus FIXED_S for building the workspace. Measured: 10,000 tickets took 0.84–1.04× the
# base run's per-ticket time, so 1.2 leaves room for the target's own bound.
MARGIN = 1.2
FIXED_S = 8.0


@dataclass(frozen=True)
class Sizes:
    """The three N of the section."""

    small: int
    base: int
    big: int


def sizes(options: Options) -> Sizes:
    """100, --n, --big-n; or the --quick sizes."""
    if options.quick:
        return Sizes(*QUICK_SIZES)
    return Sizes(options.small_n, options.n, options.big_n)


def run(ctx: Context, section: Section) -> None:
    """The three runs, then the provider runs if time allows."""
    want = sizes(ctx.options)
    section.title = (
        f"latency 0, embedded, pool 16: N = {want.small:,} / {want.base:,} / {want.big:,}"
    )
    small, base = _run(ctx, want.small), _run(ctx, want.base)
    big_n, plan = _fit(ctx, base, want.big)
    big = _run(ctx, big_n) if big_n else None
    section.raw = {"latency_ms": LATENCY_MS, "pool": POOL, "plan": plan}
    section.raw["runs"] = {str(r.tickets): r.to_json() for r in (small, base, big) if r}
    section.add(
        *_wall_figures(base, big, plan), *_disk_figures(small, big, want.big), *_rss_figures(big)
    )
    # Ours on disk and on tmpfs and the two peers at N = base again: about four base runs
    # (the peers are faster).
    if not ctx.options.quick and ctx.remaining_s() > 4 * (base.process.wall_s + FIXED_S):
        section.add(*_provider_runs(ctx, want.base, section.raw))


def _run(ctx: Context, n: int) -> OurRun:
    """One embedded run at latency 0 on a fresh workspace of N tickets."""
    workload = build(ctx.folder(f"c-{n}"), n, LATENCY_MS, POOL)
    run = run_ticketgraph(workload.root, workload.root / "logs", ctx.timeout_s())
    run.check(workload.calls, workload.tokens, n)
    run.tickets = run.tickets or n
    return run


def _fit(ctx: Context, base: OurRun, want: int) -> tuple[int, dict[str, Any]]:
    """The N of the big run that fits in what is left of the budget, and why."""
    span = base.span_s or base.process.wall_s
    per_ticket_s = span / max(base.tickets, 1) * MARGIN
    left = ctx.remaining_s()
    fixed_s = FIXED_S + base.process.wall_s - span  # workspace build, start and stop
    estimate = fixed_s + per_ticket_s * want
    plan: dict[str, Any] = {
        "wanted_n": want,
        "estimate_s": round(estimate, 1),
        "left_s": round(left, 1),
    }
    if not base.ok:
        return 0, plan | {"n": 0, "note": f"not run: the N = {base.tickets:,} run went wrong"}
    if estimate <= left:
        return want, plan | {"n": want}
    step = 10 ** max(2, int(math.log10(want)) - 1)
    fits = int((left - fixed_s) / per_ticket_s) // step * step
    n = fits if fits >= 2 * base.tickets else 0
    why = f"N = {want:,} would take ~{estimate:.0f} s, {left:.0f} s left"
    return n, plan | {"n": n, "note": why + (f": ran N = {n:,}" if n else ": not run")}


def _ms_per_ticket(run: OurRun | None) -> float | None:
    """Run wall per ticket in ms (None for a run that went wrong)."""
    if run is None or not run.ok or run.span_s is None:
        return None
    return 1000 * run.span_s / run.tickets


def _wall_figures(base: OurRun, big: OurRun | None, plan: dict[str, Any]) -> list[Figure]:
    """Run wall and CPU per ticket at the base and big N, and the walls' ratio."""
    big_n = big.tickets if big else plan["wanted_n"]
    note = plan.get("note", "")
    at_base, at_big = _ms_per_ticket(base), _ms_per_ticket(big)
    return [
        Figure(
            "cpu_ms_per_ticket.base",
            f"CPU of all processes per ticket, N = {base.tickets:,}",
            rounded(base.cpu_ms_per_ticket),
            "ms",
            note=base.problem,
            extra={
                "n": base.tickets,
                "cpu_s": base.process.cpu_s,
                "system_cpu_s": base.process.system_cpu_s,
            },
        ),
        Figure(
            "cpu_ms_per_ticket.big",
            f"CPU of all processes per ticket, N = {big_n:,}",
            rounded(big.cpu_ms_per_ticket if big else None),
            "ms",
            note=(big.problem if big else "") or note,
            extra={"n": big_n},
        ),
        Figure(
            "ms_per_ticket.base",
            f"run wall per ticket, N = {base.tickets:,}",
            rounded(at_base),
            "ms",
            Target("<=", 3.0, "≤ 3 ms/ticket at 1,000"),
            note=base.problem,
            valid=base.ok,
            extra={"n": base.tickets},
        ),
        Figure(
            "ms_per_ticket.big",
            f"run wall per ticket, N = {big_n:,}",
            rounded(at_big),
            "ms",
            note=(big.problem if big else "") or note,
            extra={"n": big_n},
        ),
        Figure(
            "ms_per_ticket.ratio",
            f"per-ticket wall, N = {big_n:,} / {base.tickets:,}",
            rounded(ratio_of(at_big, at_base)),
            "×",
            Target("<=", 1.2, "ratio ≤ 1.2"),
            valid=base.ok and bool(big and big.ok),
            note=note,
        ),
    ]


def _written(run: OurRun | None) -> float | None:
    """Bytes written per ticket, from the RUSAGE_CHILDREN delta around the run."""
    if run is None or not run.ok:
        return None
    return run.process.children_oublock * BLOCK_BYTES / run.tickets


def _on_disk(run: OurRun | None) -> float | None:
    """Final bytes of the run folder per ticket."""
    return None if run is None or not run.ok else run.folder_bytes / run.tickets


def _disk_figures(small: OurRun, big: OurRun | None, wanted: int) -> list[Figure]:
    """Bytes per ticket, written and left on disk, at the small and big N; their ratios."""
    flat = Target("<=", 1.2, "flat from 100 to 10,000 (ratio ≤ 1.2)")
    big_n = big.tickets if big else wanted
    problem = small.problem or (big.problem if big else "big run not measured")
    figures = []
    for key, what, measure in (
        ("written", "written", _written),
        ("folder", "run folder", _on_disk),
    ):
        figures += [
            Figure(
                f"{key}_per_ticket.small",
                f"bytes {what} per ticket, N = {small.tickets:,}",
                rounded(measure(small), 0),
                "B",
                extra={"n": small.tickets},
            ),
            Figure(
                f"{key}_per_ticket.big",
                f"bytes {what} per ticket, N = {big_n:,}",
                rounded(measure(big), 0),
                "B",
                extra={"n": big_n},
            ),
            Figure(
                f"{key}_per_ticket.ratio",
                f"bytes {what}/ticket, N = {big_n:,} / {small.tickets:,}",
                rounded(ratio_of(measure(big), measure(small))),
                "×",
                flat,
                valid=not problem,
                note=problem,
            ),
        ]
    return figures


def _rss_figures(big: OurRun | None) -> list[Figure]:
    """Peak RSS of every process of the big run, the largest against its target."""
    if big is None or not big.ok:
        return [
            Figure(
                "rss.largest",
                "peak RSS, largest process",
                None,
                "MB",
                Target("<", 250, "< 250 MB at 10,000"),
                note=big.problem if big else "big run not measured",
            )
        ]
    peaks = big.process.peaks
    figures = [
        Figure(
            f"rss.process{i}",
            f"peak RSS: {p.role}, pid {p.pid}",
            round(p.vmhwm_kib / 1024, 1),
            "MB",
        )
        for i, p in enumerate(peaks, start=1)
    ]
    return [
        *figures,
        Figure(
            "rss.largest",
            f"peak RSS, largest process, N = {big.tickets:,}",
            rounded(big.process.largest_peak_mb, 1),
            "MB",
            Target("<", 250, "< 250 MB at 10,000"),
            valid=big.ok,
        ),
        Figure(
            "rss.ru_maxrss",
            "ru_maxrss of the CLI and reaped children (wait4)",
            round(big.process.maxrss_kib / 1024, 1),
            "MB",
        ),
    ]


def _provider_runs(ctx: Context, n: int, raw: dict[str, Any]) -> list[Figure]:
    """Ours and the two LangGraph peers at latency 0 against one provider process: the
    provider's CPU per request, and each system's CPU per ticket with the provider's."""
    shape = build(ctx.folder("c-scenario"), n, LATENCY_MS, POOL)
    with Provider(shape.root / "scenarios" / "demo.yaml", ctx.folder("c-provider") / "log") as llm:
        ours_ws = build(ctx.folder("c-ours-external"), n, LATENCY_MS, POOL)
        env = {"LLM_BASE_URL": llm.url}
        with llm.metered() as ours_meter:
            ours = run_ticketgraph(ours_ws.root, ours_ws.root / "logs", ctx.timeout_s(), env)
        tmpfs = _on_tmpfs(ctx, n, llm, env, ours_ws.root)
        peers: dict[str, tuple[PeerRun, ProviderCost]] = {}
        for name, durable in (("langgraph", False), ("langgraph_sqlite", True)):
            peer_ws = build(ctx.folder(f"c-{name}"), n, LATENCY_MS, POOL)
            with llm.metered() as meter:
                peer = run_langgraph(peer_ws.root, llm.url, POOL, ctx.timeout_s(), durable)
            peer.check(shape.peer_calls, shape.peer_tokens)
            peers[name] = peer, meter.cost
    ours.check(shape.calls, shape.tokens, n)
    raw["provider_runs"] = {"ours": ours.to_json() | {"provider": ours_meter.cost.to_json()}} | {
        name: peer.to_json() | {"provider": cost.to_json()} for name, (peer, cost) in peers.items()
    }
    if tmpfs.run is not None and tmpfs.cost is not None:
        tmpfs.run.check(shape.calls, shape.tokens, n)
        raw["provider_runs"]["ours_tmpfs"] = tmpfs.run.to_json() | {
            "provider": tmpfs.cost.to_json(),
            "folder": TMPFS,
        }
    return [
        *_provider_figures(n, ours, ours_meter.cost, peers),
        *_tmpfs_figures(n, ours, ours_meter.cost, tmpfs, peers),
    ]


# Ours again with its workspace (run folder, out/; not its logs) on tmpfs, right after the
# run on disk: how much of its CPU a ticket the disk's filesystem costs (the file calls
# themselves remain), and what the CPU target would read without it (references, no target:
# a run's files must be on a disk to outlive a crash).
TMPFS = "/dev/shm"
TMPFS_BYTES_A_TICKET = 64 * 1024  # room asked for: the run folder and out/ take ~12 KB a ticket


@dataclass(frozen=True)
class TmpfsRun:
    """Ours on tmpfs, or why it was not run (`problem`)."""

    run: OurRun | None = None
    cost: ProviderCost | None = None
    problem: str = ""


def _tmpfs_problem(n: int, disk: Path, folder: str | Path = TMPFS) -> str:
    """Why an N-ticket workspace cannot go on the tmpfs `folder` beside one on `disk`
    ("" if it can: `folder` is a tmpfs, `disk` is not, and there is room twice over)."""
    try:
        if machine.filesystem(disk).get("type") == "tmpfs":
            return f"the run on disk is on a tmpfs too ({disk})"
        if machine.filesystem(folder).get("type") != "tmpfs":
            return f"{folder} is not a tmpfs"
        free, asked = shutil.disk_usage(folder).free, 2 * n * TMPFS_BYTES_A_TICKET
    except OSError as exc:
        return f"{folder}: {exc}"
    if free < asked:
        return f"{folder} has {free / 2**20:,.0f} MiB free; {n:,} tickets ask {asked / 2**20:,.0f}"
    return ""


def _on_tmpfs(ctx: Context, n: int, llm: Provider, env: dict[str, str], disk: Path) -> TmpfsRun:
    """The provider run of ours with the workspace on TMPFS, if it can be made (deleted
    after: on tmpfs that slows no later run, as deleting on ext4 without a journal would)."""
    if problem := _tmpfs_problem(n, disk):
        return TmpfsRun(problem=f"not run: {problem}")
    try:
        with tempfile.TemporaryDirectory(
            dir=TMPFS, prefix="tg-bench-c-", ignore_cleanup_errors=True
        ) as tmp:
            workspace = build(Path(tmp) / "ws", n, LATENCY_MS, POOL)
            with llm.metered() as meter:
                logs = ctx.folder("c-ours-tmpfs-logs")
                run = run_ticketgraph(workspace.root, logs, ctx.timeout_s(), env)
    except OSError as exc:  # tmpfs full while building or running: the section goes on
        return TmpfsRun(problem=f"failed on {TMPFS}: {exc}")
    return TmpfsRun(run, meter.cost)


def _tmpfs_figures(
    n: int,
    ours: OurRun,
    ours_cost: ProviderCost,
    tmpfs: TmpfsRun,
    peers: dict[str, tuple[PeerRun, ProviderCost]],
) -> list[Figure]:
    """Ours on tmpfs: its CPU a ticket, the share of ours' on disk that the filesystem
    took, and its ratio to each peer (references; each says why, where it has no value)."""
    at = f"N = {n:,}"
    disk = cpu_ms_with_provider(ours.process.cpu_s, ours_cost, n) if ours.ok else None
    problem = tmpfs.problem or (tmpfs.run.problem if tmpfs.run is not None else "")
    memory = None
    if not problem and tmpfs.run is not None and tmpfs.cost is not None:
        memory = cpu_ms_with_provider(tmpfs.run.process.cpu_s, tmpfs.cost, n)
    share = None if disk is None or memory is None else 1 - memory / disk
    figures = [
        Figure(
            "cpu_with_provider.ours_tmpfs",
            f"CPU per ticket with the provider process's, ours on tmpfs, {at}",
            rounded(memory),
            "ms",
            note=problem,
        ),
        Figure(
            "cpu_with_provider.filesystem_share",
            "ours: share of the CPU a ticket that the disk's filesystem took (1 − tmpfs/disk)",
            rounded(share),
            note=problem or ours.problem,
        ),
    ]
    for name, (peer, cost) in peers.items():
        peer_cpu = None if peer.problem else cpu_ms_with_provider(peer.cpu_s, cost, n)
        figures.append(
            Figure(
                f"cpu_with_provider.ours_tmpfs_over_{name}",
                f"ours on tmpfs / {PEER_NAMES[name]}, CPU per ticket with the provider's",
                rounded(ratio_of(memory, peer_cpu)),
                "×",
                note=problem or peer.problem,
            )
        )
    return figures


# #51 re-based the CPU target on the peers that call the same provider process, measured
# in the same invocation (it was an absolute 4 ms, #21's, from LangGraph with a fake model
# in its own process): at most 0.8× the durable peer's and at most its in-memory peer's.
CPU_TARGETS = {
    "langgraph": Target("<=", 1.0, "≤ 1.0× LangGraph in memory (#51)"),
    "langgraph_sqlite": Target("<=", 0.8, "≤ 0.8× LangGraph + SQLite (#51)"),
}


def cpu_ms_with_provider(cpu_s: float, provider: ProviderCost, n: int) -> float:
    """A system's CPU per ticket in ms, the provider process's share counted in: what the
    embedded run's figure counts, since its scripted provider runs in the CLI."""
    return 1000 * (cpu_s + provider.cpu_s) / n


def _provider_figures(
    n: int,
    ours: OurRun,
    ours_cost: ProviderCost,
    peers: dict[str, tuple[PeerRun, ProviderCost]],
) -> list[Figure]:
    """Provider CPU per request, CPU per ticket with the provider's, and run walls."""
    at = f"N = {n:,}"
    ours_cpu = cpu_ms_with_provider(ours.process.cpu_s, ours_cost, n) if ours.ok else None
    figures = [
        Figure(
            "provider_cpu.ours",
            f"provider CPU per request, ours, {at}",
            rounded(ours_cost.cpu_ms_per_request if ours.ok else None),
            "ms",
            note=ours.problem,
        ),
        Figure(
            "cpu_with_provider.ours",
            f"CPU per ticket with the provider process's, ours, {at}",
            rounded(ours_cpu),
            "ms",
            note=ours.problem,
        ),
    ]
    ours_s = ours.span_s if ours.ok else None
    for name, (peer, cost) in peers.items():
        shown = PEER_NAMES[name]
        peer_cpu = None if peer.problem else cpu_ms_with_provider(peer.cpu_s, cost, n)
        figures += [
            Figure(
                f"provider_cpu.{name}",
                f"provider CPU per request, {shown}, {at}",
                rounded(cost.cpu_ms_per_request if not peer.problem else None),
                "ms",
                note=peer.problem,
            ),
            Figure(
                f"cpu_with_provider.{name}",
                f"CPU per ticket with the provider process's, {shown}, {at}",
                rounded(peer_cpu),
                "ms",
                note=peer.problem,
            ),
            Figure(
                f"cpu_with_provider.ours_over_{name}",
                f"ours / {shown}, CPU per ticket with the provider's",
                rounded(ratio_of(ours_cpu, peer_cpu)),
                "×",
                CPU_TARGETS[name],
                valid=ours.ok and not peer.problem,
            ),
        ]
    peer_s = peers["langgraph"][0].wall_s if not peers["langgraph"][0].problem else None
    return [
        *figures,
        Figure(
            "ours_external.run_s", "ours with the provider process: run wall", rounded(ours_s), "s"
        ),
        Figure("langgraph.run_s", "LangGraph: run wall (1st request→report)", rounded(peer_s), "s"),
        Figure(
            "ours_over_langgraph.run",
            "ours / LangGraph, run wall (latency 0)",
            rounded(ratio_of(ours_s, peer_s)),
            "×",
        ),
    ]
