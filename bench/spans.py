"""Where a ticket's CPU goes: the thread CPU of each span of the per-ticket tasks.

    python -m bench.spans [--n 1000] [--root /dev/shm] [--json FILE]

One embedded `ticketgraph run` of the scaled workload (bench/workload.py) at latency 0, pool
16, two worker processes, run by a child of this command with every function in SPANS
wrapped to add up `time.thread_time()` around each call: the CPU of the calling thread,
inclusive of what it calls, not of the threads it waits on. The worker processes are forked
from that child, wrappers and all (with no sums yet: the child runs no task); at the run's
end they stop warm (not SIGKILLed, as an embedded run otherwise stops them), finish their
tasks, and each writes its sums and its CPU on Celery's `worker_shutdown`. Printed per
span: calls, CPU a call and CPU a ticket, summed over the worker processes; beside them the
CPU of every process of the run (`wait4`'s rusage of the child, which reaps its workers and
Redis) and of the workers.

Only what runs inside a per-ticket task is counted (the first row; a thread-local flag says
where a call runs), so every other row is "of which" of it, and rows indented under another
are "of which" of that one. Outside the tasks: Celery's own work in the worker processes
(receiving, acknowledging, its consumer thread, its warm shutdown) and the whole-run steps
(route, merge, report): the workers' CPU minus the first row. A wrapper costs about 1 µs a
call, so the rows with many calls (trace lines, atomic writes) read a little high. With an
evaluator configured, a gate check holds agent runs too; the workload has none. `--root` on
tmpfs leaves the filesystem out.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# label, module, attribute (a function of the module, or Class.method); the first is the task
SPANS: list[tuple[str, str, str]] = [
    ("per-ticket tasks", "orchestrator.plan.tasks", "_one_ticket"),
    ("  the step under the fence", "orchestrator.plan.tasks", "_held"),
    ("    take the fence", "orchestrator.run.fence", "EpochFence.take_if"),
    ("    agent runs", "orchestrator.steps.agent", "run_agent"),
    ("      harness loop", "workers.loop", "run"),
    ("        model call (client)", "workers.model.client", "ModelClient.complete"),
    ("        save agent state", "workers.state", "RunState.save"),
    ("    gate check", "orchestrator.steps.review", "ReviewLoop.check"),
    ("    hand the slot on", "orchestrator.plan.canvas", "hand_on"),
    ("  read a ticket's record", "orchestrator.run.store", "RunStore.ticket"),
    ("  write a ticket's record", "orchestrator.run.store", "RunStore.save_ticket"),
    ("  a trace line", "workers.trace", "Tracer.emit"),
    ("  an atomic file write", "workers.atomic", "write_text"),
    ("  a version appended", "workers.versions", "append"),
]
TOP = SPANS[0][0]
WORKERS = 2
ENV_OUT = "TG_SPANS_OUT"  # the folder each worker process writes its sums to
STOP_S = 60.0  # a worker that takes longer to stop warm is SIGKILLed, and its sums are lost


# --- in the run's processes -------------------------------------------------------------------


class Sums:
    """Calls and thread CPU per span, in one process, counted inside per-ticket tasks only."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_label: dict[str, list[float]] = {}
        self.task = threading.local()  # `.inside`: this thread runs a per-ticket task

    def wrap(self, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """`fn`, adding its calls and thread CPU to `label` when it runs inside a task (the
        first span marks the thread while it runs)."""
        top = label == TOP

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            inside = getattr(self.task, "inside", False)
            if not (top or inside):
                return fn(*args, **kwargs)
            self.task.inside = True
            started = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.thread_time() - started
                self.task.inside = inside
                with self.lock:
                    sums = self.by_label.setdefault(label, [0, 0.0])
                    sums[0] += 1
                    sums[1] += spent

        return timed

    def write(self, folder: Path) -> None:
        """This process's sums and CPU, as `<pid>.json` in `folder`."""
        with self.lock:
            body = {"pid": os.getpid(), "cpu_s": time.process_time(), "spans": self.by_label}
        (folder / f"{os.getpid()}.json").write_text(json.dumps(body), encoding="utf-8")


def install(sums: Sums) -> None:
    """Wrap every function of SPANS in place."""
    for label, module_name, attribute in SPANS:
        owner: Any = importlib.import_module(module_name)
        *classes, name = attribute.split(".")
        for cls in classes:
            owner = getattr(owner, cls)
        found = owner.__dict__.get(name) if isinstance(owner, type) else None
        if isinstance(found, classmethod):  # wrap the function, keep it a classmethod
            setattr(owner, name, classmethod(sums.wrap(label, found.__func__)))
        else:
            setattr(owner, name, sums.wrap(label, getattr(owner, name)))


def _child(workspace: str) -> int:
    """The instrumented `ticketgraph run` (this process forks the run's workers)."""
    from celery import signals

    from orchestrator.broker import worker_processes
    from orchestrator.cli import main as cli

    out = Path(os.environ[ENV_OUT])
    sums = Sums()
    install(sums)
    stop = worker_processes.Fleet.stop

    def warm_stop(fleet: worker_processes.Fleet, graceful: bool = True, timeout: float = 0) -> None:
        # The embedded run SIGKILLs its workers at its end (all work is on disk); here each
        # stops warm instead: it finishes its running tasks, then writes its sums.
        stop(fleet, True, STOP_S)

    def written(**_: Any) -> None:  # Celery's worker_shutdown, in each forked worker
        sums.write(out)

    worker_processes.Fleet.stop = warm_stop  # type: ignore[method-assign]
    signals.worker_shutdown.connect(written, weak=False)
    return cli.main(["run", "--workspace", workspace, "--quiet"])


# --- the command --------------------------------------------------------------------------------


def measure(n: int, root: Path, timeout_s: float = 1800) -> dict[str, Any]:
    """One instrumented run of N tickets in a fresh folder under `root`: every span's sums
    over the worker processes, and the CPU of the run's processes."""
    from bench.services import child_env
    from bench.watch import run_watched
    from bench.workload import build

    root.mkdir(parents=True, exist_ok=True)  # a --root that does not exist yet is made
    with tempfile.TemporaryDirectory(dir=root, prefix="tg-spans-") as tmp:
        workload = build(Path(tmp) / "ws", n, latency_ms=0, pool_size=16)
        out = Path(tmp) / "spans"
        out.mkdir()
        env = child_env(**{ENV_OUT: str(out), "TICKETGRAPH_PROCESSES": str(WORKERS)})
        argv = [sys.executable, "-m", "bench.spans", "--child", str(workload.root)]
        run = run_watched(argv, workload.root, env, Path(tmp) / "logs", timeout_s)
        if run.returncode not in (0, 1) or run.timed_out:  # 1: some tickets need a human
            raise RuntimeError(f"the instrumented run exited {run.returncode}: {run.tail(20)}")
        workers = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    if len(workers) != WORKERS:
        raise RuntimeError(f"{len(workers)} of {WORKERS} worker processes wrote their sums")
    return {
        "n": n,
        "root": str(root),
        "wall_s": round(run.wall_s, 3),
        "cpu_all_s": round(run.cpu_s, 3),
        "cpu_system_s": round(run.system_cpu_s, 3),
        "cpu_workers_s": round(sum(w["cpu_s"] for w in workers), 3),
        "worker_processes": len(workers),
        "model_calls_expected": workload.calls["fanout"] + workload.calls["review"],
        "spans": _summed(workers),
    }


def _summed(workers: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each span's calls and CPU over the worker processes, in SPANS' order."""
    spans: dict[str, list[float]] = {label: [0, 0.0] for label, _, _ in SPANS}
    for worker in workers:
        for label, (calls, cpu_s) in worker["spans"].items():
            spans[label][0] += calls
            spans[label][1] += cpu_s
    return {label: {"calls": int(c), "cpu_s": round(s, 4)} for label, (c, s) in spans.items()}


def table(result: dict[str, Any]) -> str:
    """The result as a table, per ticket."""
    n = result["n"]
    per = lambda s: f"{s / n * 1000:6.3f} ms"  # noqa: E731
    lines = [
        f"N = {n:,}, latency 0, pool 16, run folder under {result['root']}; "
        f"wall {result['wall_s']} s",
        f"CPU of every process a ticket: {per(result['cpu_all_s'])} "
        f"(system {per(result['cpu_system_s'])}); of the {result['worker_processes']} worker "
        f"processes: {per(result['cpu_workers_s'])}",
        "",
        f"{'span (thread CPU, inclusive)':34} {'calls':>7} {'per call':>10} {'a ticket':>10}",
    ]
    for label, sums in result["spans"].items():
        calls, cpu_s = sums["calls"], sums["cpu_s"]
        each = f"{cpu_s / calls * 1e6:7.0f} µs" if calls else "      –   "
        lines.append(f"{label:34} {calls:7,} {each:>10} {per(cpu_s):>10}")
    rest = result["cpu_workers_s"] - result["spans"][TOP]["cpu_s"]
    lines.append(f"{'workers, outside the tasks':34} {'':7} {'':>10} {per(rest):>10}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command line: one instrumented run, printed (and written as JSON if asked)."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.spans",
        description=__doc__.split("\n\n")[0] + " One instrumented embedded run at latency 0.",
        epilog="Rows nest (read each as 'of which'); bench/spans.py says what each counts.",
    )
    parser.add_argument("--n", type=int, default=1000, help="tickets (1,000)")
    parser.add_argument(
        "--root", type=Path, default=Path(tempfile.gettempdir()), help="where the run folder goes"
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the result here")
    parser.add_argument("--child", metavar="WORKSPACE", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return _child(args.child)
    result = measure(args.n, args.root)
    result["load_after"] = [round(x, 2) for x in os.getloadavg()]
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
