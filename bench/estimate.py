"""A paper estimate from section i's measured per-ticket footprint: a 100,000-ticket run at
pool 2,048 across 8 machines, every model call 2 s. What must one Redis and one shared NFS
volume sustain, which gives out first, and how long the run takes.

Throughput (tickets/s) = pool / (a ticket's model calls × 2 s): a ticket holds its slot for
its calls one after another, and the workload's calls a ticket (drafts and rewrites over N,
template tickets counted at 0) come from the workload object. Each per-ticket figure ×
throughput is what the shared service must sustain; the workers' own Redis traffic with no
run (measured over a few idle seconds) is added once per machine, as if each machine ran one
`ticketgraph worker` of the layout measured. Wall = routing (its calls, `pool` at a time,
2 s a wave) + 100,000 / throughput.

Capacities say where they come from: "measured here" (this section's run or redis-benchmark
on this machine) or "ASSUMPTION" (nothing here can measure an NFS server or a NIC).

    python -m bench.estimate figures.json   # the markdown table of a saved `--json` report
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.figures import Figure, rounded
from bench.workload import Workload

TICKETS = 100_000
POOL = 2048
MACHINES = 8
CALL_S = 2.0
MB = 1_000_000


@dataclass(frozen=True)
class Source:
    """Where a capacity comes from: a short name for the table, the whole story below it."""

    short: str
    text: str


# Assumptions, not measurements: nothing on this machine is an NFS server or a 10 GbE link.
LINK_MB_S = 1250.0
LINK = Source("ASSUMPTION (link)", "a 10 Gbit/s link, 1,250 MB/s; not measured")
NFS_SYNCS_S = 2000.0
NFS = Source(
    "ASSUMPTION (NFS)",
    "about 2,000 a second: 'a few thousand COMMIT/s' for one NFS server exporting `sync` on "
    "SSD-backed stable storage; not measured (no NFS server here). An NFSv3 server puts "
    "CREATE, RENAME, REMOVE and MKDIR on stable storage before it answers (RFC 1813), so "
    "they draw on the same budget as COMMIT, which is what fsync becomes on NFS; a server "
    "that must reach a disk for each (no NVRAM) manages far fewer",
)
REDIS_CORE = Source(
    "measured here (Redis CPU)",
    "the private Redis's CPU a ticket (INFO used_cpu_user + used_cpu_sys) in this section's "
    "run; Redis executes commands on one thread, so one core is its ceiling",
)
BENCHMARK = Source(
    "measured here (redis-benchmark)",
    "redis-benchmark against the same private Redis after the run: the median requests/s of "
    "SET, GET, INCR, LPUSH and RPOP, 50 clients, no pipelining; simple commands, where the "
    "run's include Lua scripts, so the CPU row is the closer yardstick",
)
BENCHMARK_FALLBACK = 100_000.0
FALLBACK = Source(
    "ASSUMPTION (Redis)",
    "about 100,000 simple commands a second for one Redis core (redis-benchmark was not on "
    "PATH; Redis's own benchmark page reports about 110,000 SET/s with 50 clients)",
)
COUNTED = Source("in Redis commands", "each message is an LPUSH, already a Redis command")

# What the design would change where a service gives out first.
REMEDIES = {
    "redis": "Redis gives out first: shard the coordination keys by run (one Redis per run, "
    "or a cluster hashing on the run id) and cut commands a ticket (one Lua call where a "
    "step makes several; fewer per-ticket heartbeats and events).",
    "nfs": "The shared volume gives out first: a ticket's record and agent states are "
    "appended to (files of versions) and its fence opened once a step, but every save is "
    "still an fsync, its draft and out/ reply a file created and renamed, and run.jsonl "
    "opened, appended to and closed for each event (several machines append to it); on "
    "NFS each fsync and each close after a write is a COMMIT, and each create and "
    "rename a synchronous update on the server (group commit saves fsyncs on a local "
    "disk, but there a written file's close commits it anyway). Keep per-step state where "
    "commits are cheap (Redis with an append-only file, or one journal a worker appends "
    "to and flushes once per batch of steps), write the trace to a file per process, kept "
    "open and flushed in batches, which readers merge, and write to the volume only what "
    "a person reads (out/, the report).",
}


@dataclass(frozen=True)
class Demand:
    """One thing a shared service must sustain: per ticket, a second, against a capacity."""

    key: str
    label: str
    per_ticket: float | None
    unit: str  # of the rate, a second (the per-ticket figure is in the same unit, a ticket)
    rate: float | None
    capacity: float | None = None
    source: Source | None = None
    service: str = ""  # "redis" or "nfs": whose remedy applies
    shown: str = ""  # the per-ticket figure as the table shows it, with its unit

    @property
    def use(self) -> float | None:
        """Rate over capacity (1.0: exactly saturated), None without both."""
        if self.rate is None or not self.capacity:
            return None
        return self.rate / self.capacity


@dataclass
class Estimate:
    """The fleet on paper: throughput, wall and every demand."""

    calls_per_ticket: float
    tickets_per_s: float
    route_s: float
    wall_s: float
    demands: list[Demand] = field(default_factory=list)

    @property
    def first(self) -> Demand | None:
        """The demand closest to (or furthest past) its capacity."""
        rated = [d for d in self.demands if d.use is not None]
        return max(rated, key=lambda d: d.use or 0.0, default=None)

    def ceiling(self) -> tuple[float, float] | None:
        """(tickets/s, pool) at which the first to give out is exactly saturated: the most
        this fleet gets from it, whatever its pool."""
        first = self.first
        if first is None or not first.use:
            return None
        tickets_per_s = self.tickets_per_s / first.use
        return tickets_per_s, tickets_per_s * self.calls_per_ticket * CALL_S

    def verdict(self) -> str:
        """Which gives out first, by how much, where that caps the fleet, and what the
        design would change there."""
        first, ceiling = self.first, self.ceiling()
        if first is None or ceiling is None:
            return "nothing measured to compare"
        return (
            f"First to give out: {first.label}, at {first.use:.2f}× its capacity "
            f"({_number(first.rate)} against {_number(first.capacity)} {first.unit}); it caps "
            f"the fleet at {_number(ceiling[0])} tickets/s, what a pool of {_number(ceiling[1])} "
            f"keeps busy: {TICKETS:,} tickets would take about "
            f"{_number(self.route_s + TICKETS / ceiling[0])} s, not {_number(self.wall_s)}. "
            f"{REMEDIES.get(first.service, '')}"
        )

    def figures(self, valid: bool = True) -> list[Figure]:
        """Throughput, wall and each demand's rate and use of capacity, as references."""
        tag = f"{TICKETS:,} tickets, pool {POOL:,}, {MACHINES} machines, {CALL_S:g} s calls"
        figures = [
            Figure("fleet.throughput", f"paper, {tag}: tickets/s", rounded(self.tickets_per_s, 1),
                   "/s", valid=valid, note=f"{self.calls_per_ticket:.3f} calls a ticket"),
            Figure("fleet.wall", "paper: wall (routing + tickets / throughput)",
                   rounded(self.wall_s, 1), "s", valid=valid, note=f"routing {self.route_s:g} s"),
        ]  # fmt: skip
        for d in self.demands:
            source = d.source.short if d.source else ""
            use = "" if d.use is None else f"{d.use:.2f}× of {_number(d.capacity)}, {source}"
            figures.append(
                Figure(f"fleet.{d.key}", f"paper: {d.label}", _rate(d.rate), d.unit,
                       valid=valid, note=use)
            )  # fmt: skip
        first, ceiling = self.first, self.ceiling()
        figures.append(
            Figure("fleet.first_use", "paper: the first to give out, rate / capacity",
                   rounded(first.use, 3) if first else None, "×", valid=valid,
                   note=first.label if first else "")
        )  # fmt: skip
        figures.append(
            Figure("fleet.ceiling", "paper: tickets/s where it saturates (any pool)",
                   _rate(ceiling[0]) if ceiling else None, "/s", valid=valid,
                   note=f"a pool of {_number(ceiling[1])}" if ceiling else "")
        )  # fmt: skip
        return figures

    def markdown(self) -> str:
        """The estimate as a markdown table, with the throughput, the wall and the verdict."""
        lines = [
            f"{TICKETS:,} tickets at pool {POOL:,} across {MACHINES} machines, model calls "
            f"{CALL_S:g} s: {self.calls_per_ticket:.3f} calls a ticket, throughput "
            f"{POOL:,} / ({self.calls_per_ticket:.3f} × {CALL_S:g} s) = "
            f"**{self.tickets_per_s:,.0f} tickets/s**; wall {self.route_s:g} s routing + "
            f"{TICKETS:,} / {self.tickets_per_s:,.0f} = **{self.wall_s:,.0f} s**.",
            "",
            "| what | a ticket (measured) | needed a second | capacity | use | capacity from |",
            "|---|---|---|---|---|---|",
        ]
        for d in self.demands:
            use = "" if d.use is None else f"{d.use:.2f}×"
            capacity = _number(d.capacity) if d.capacity else "–"
            source = d.source.short if d.source else "–"
            lines.append(
                f"| {d.label} | {d.shown or _number(d.per_ticket)} | {_number(d.rate)} {d.unit} "
                f"| {capacity} | {use} | {source} |"
            )
        sources = {d.source for d in self.demands if d.source is not None}
        notes = [f"- {source.short}: {source.text}." for source in sources]
        return "\n".join([*lines, "", *sorted(notes), "", self.verdict()])

    def to_json(self) -> dict[str, Any]:
        """Every number, the verdict and the markdown table."""
        return {
            "tickets": TICKETS,
            "pool": POOL,
            "machines": MACHINES,
            "call_s": CALL_S,
            "calls_per_ticket": self.calls_per_ticket,
            "tickets_per_s": self.tickets_per_s,
            "route_s": self.route_s,
            "wall_s": self.wall_s,
            "demands": [asdict(d) | {"use": d.use} for d in self.demands],
            "ceiling_tickets_per_s": ceiling[0] if (ceiling := self.ceiling()) else None,
            "ceiling_pool": ceiling[1] if ceiling else None,
            "verdict": self.verdict(),
            "markdown": self.markdown(),
        }


def fleet(
    per_ticket: dict[str, float | None],
    idle: dict[str, float],
    workload: Workload,
    benchmark: dict[str, float],
) -> Estimate:
    """The estimate from a measured footprint, the workers' idle rates, the workload's calls
    a ticket and redis-benchmark's requests a second ({} if it did not run)."""
    calls = workload.calls
    calls_per_ticket = (calls["fanout"] + calls["review"]) / workload.n
    rate = POOL / (calls_per_ticket * CALL_S)
    route_calls = math.ceil(calls["route"] / workload.n * TICKETS)
    route_s = CALL_S * math.ceil(route_calls / POOL)
    found = Estimate(calls_per_ticket, rate, route_s, route_s + TICKETS / rate)
    found.demands = _redis_demands(per_ticket, idle, rate, benchmark)
    found.demands += _volume_demands(per_ticket, rate)
    return found


def _redis_demands(
    per: dict[str, float | None], idle: dict[str, float], rate: float, bench: dict[str, float]
) -> list[Demand]:
    """Commands, CPU, bytes and task messages a second at the one Redis."""
    ops_capacity = statistics.median(bench.values()) if bench else BENCHMARK_FALLBACK
    wire = _sum(per.get("redis_bytes_in"), per.get("redis_bytes_out"))
    cpu_ms = per.get("redis_cpu_ms")
    return [
        _demand("redis_ops", "Redis commands", per.get("redis_commands"), rate,
                idle["redis_commands"], "/s", ops_capacity, BENCHMARK if bench else FALLBACK),
        _demand("redis_cpu", "Redis CPU", _scaled(cpu_ms, 1e-3), rate,
                idle["redis_cpu_ms"] / 1000, "cores", 1.0, REDIS_CORE, _shown(cpu_ms, "ms")),
        _demand("redis_mb", "Redis bytes in + out", _scaled(wire, 1 / MB), rate,
                idle["redis_bytes"] / MB, "MB/s", LINK_MB_S, LINK, _shown(wire, "B")),
        _demand("messages", "broker task messages", per.get("messages"), rate, 0.0, "/s",
                source=COUNTED),
    ]  # fmt: skip


def _volume_demands(per: dict[str, float | None], rate: float) -> list[Demand]:
    """What the shared NFS volume must sustain: syncs, files, renames, bytes, opens."""
    written = per.get("file_bytes_workspace")
    return [
        _demand("fsyncs", "fsync-family calls on the volume (an NFS COMMIT each)",
                per.get("syncs_workspace"), rate, 0.0, "/s", NFS_SYNCS_S, NFS),
        _demand("close_flushes", "closes after unsynced writes (a COMMIT each on NFS)",
                per.get("close_flushes_workspace"), rate, 0.0, "/s"),
        _demand("creates", "files created on the volume", per.get("creates_workspace"), rate,
                0.0, "/s"),
        _demand("renames", "renames on the volume", per.get("renames_workspace"), rate, 0.0,
                "/s"),
        _demand("sync_updates", "synchronous NFS updates (COMMIT, create, rename, unlink, "
                "mkdir)", per.get("sync_updates_workspace"), rate, 0.0, "/s", NFS_SYNCS_S,
                NFS),
        _demand("written_mb", "bytes written to files on the volume (write calls)",
                _scaled(written, 1 / MB), rate, 0.0, "MB/s", LINK_MB_S, LINK,
                _shown(written, "B")),
        _demand("opens", "file opens on the volume (a GETATTR each, close-to-open)",
                per.get("opens_workspace"), rate, 0.0, "/s"),
        _demand("volume_calls", "file-system calls on the volume that wait on the server",
                per.get("calls_workspace"), rate, 0.0, "/s"),
    ]  # fmt: skip


def _demand(
    key: str,
    label: str,
    per_ticket: float | None,
    rate: float,
    idle_per_machine: float,
    unit: str,
    capacity: float | None = None,
    source: Source | None = None,
    shown: str = "",
) -> Demand:
    """A per-ticket figure × tickets a second, plus the machines' idle traffic."""
    needed = None if per_ticket is None else per_ticket * rate + idle_per_machine * MACHINES
    service = "redis" if key.startswith("redis") or key == "messages" else "nfs"
    return Demand(key, label, per_ticket, unit, needed, capacity, source, service, shown)


def _shown(value: float | None, unit: str) -> str:
    """A per-ticket figure in its own unit, for the table."""
    return "–" if value is None else f"{_number(value)} {unit}"


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


def _sum(*values: float | None) -> float | None:
    """The sum, None if any is missing."""
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)


def _rate(value: float | None) -> float | None:
    """A rate rounded for the table: 3 significant figures."""
    if value is None or value == 0:
        return value
    return round(value, max(0, 2 - math.floor(math.log10(abs(value)))))


def _number(value: float | None) -> str:
    """3 significant figures, thousands grouped; – for nothing."""
    if value is None:
        return "–"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:#.3g}".rstrip(".")


def main(argv: list[str] | None = None) -> int:
    """Print the markdown table of section i from a `python -m bench --json` report."""
    parser = argparse.ArgumentParser(prog="python -m bench.estimate", description=__doc__)
    parser.add_argument("report", type=Path, help="a `python -m bench --json` file with section i")
    args = parser.parse_args(argv)
    report = json.loads(args.report.read_text(encoding="utf-8"))
    section = report["sections"].get("i")
    if section is None or "estimate" not in section["raw"]:
        parser.error(f"{args.report} has no section i estimate")
    print(section["raw"]["estimate"]["markdown"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
