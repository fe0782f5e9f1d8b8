"""`python -m bench.soak`: the crash soak. SIGKILL a worker process at random points of real
distributed runs and count what that cost.

Each trial is the demo workspace (its billing worker also files a refund with the
`request_refund` write tool) run by `ticketgraph run` on a private Redis with two
`ticketgraph worker` processes (one process of two threads each; a killed one is restarted
by its parent), the scripted provider answering every call in 0.8 s. Once per trial, one
worker process is SIGKILLed at a point that cycles through:

  model   a process with a task running, while drafting model calls are in flight
  write   the process that just traced `tool_start` of request_refund (the kill lands
          between the write tool's start and its recorded result, or just after)
  review  a process with a task running, once the review node has started

and the trial counts: tickets left without a verdict (lost: must be 0), refund effects
done twice for one call (must be 0), model turns recorded twice (the same agent's turn
traced as `turn` twice: a reply that was saved and then paid again; must be 0), verdicts
that differ from the reference run, and the gap between the requests the provider served
and the calls the run recorded. The gap is the requests paid and then lost with the
process: those in flight at the kill (the provider's count, read just before and just
after the kill, the larger of the two) and any reply the process had received but not yet
saved, which no outside count sees (at most one per thread): the soak fails on a gap over
that bound, and reports one over in flight alone.

`--mode stall` stops instead of killing: a worker process with a task running (during
drafting, or during review: the points alternate) gets SIGSTOP and stays stopped past the
visibility timeout, so its tickets are redelivered and finished elsewhere; once the run has
ended it gets SIGCONT, and the trial also counts finished ticket records the woken copies
changed afterwards (must be 0: fencing, orchestrator/run/fence.py).

The visibility timeout is 6 s here (default 30 s) so a trial takes seconds, not a minute.
`--trials 30` is the full soak (about 6 minutes); the test suite runs 3.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml
from celery import Celery

from bench.services import (
    Provider,
    Workers,
    WorkerSpec,
    add_folder_option,
    child_env,
    ticketgraph,
    trials_folder,
)
from orchestrator.broker.redis_server import RedisServer
from orchestrator.config.workspace import CONFIG_FILE, DEMO_SCENARIOS, init_demo
from orchestrator.plan.steps import PLAN
from workers import versions
from workers.trace import read as read_trace

POINTS = ("model", "write", "review")
STALL_POINTS = ("model", "review")  # `--mode stall`: where the process is stopped
# What a stopped process may be running (a ticket's draft or review, not a whole-run step).
PER_TICKET_TASKS = frozenset(step.task for step in PLAN.steps if step.per_ticket)
WAKE_TIMEOUT_S = 60.0
LATENCY_MS = 800
VISIBILITY_S = "6"
TRIAL_TIMEOUT_S = 180.0
THREADS = 2  # per worker process: each may hold one reply it received and has not saved
REFERENCE = {
    "T-1001": "pass",
    "T-1002": "pass",
    "T-1003": "pass",
    "T-1004": "needs_human",
    "T-1005": "pass",
    "T-1006": "pass",
}
REFUND = {"order_id": "A-77301", "amount_cents": 39900, "reason": "duplicate charge"}


@dataclass
class Trial:
    """What one killed run cost."""

    index: int
    point: str
    killed: bool
    in_flight_at_kill: int
    exit_code: int | None
    lost: int
    wrong_verdicts: int
    refunds: int
    refunds_twice: int
    turns_twice: int
    write_interrupted: bool
    served: int
    recorded: int
    seconds: float
    stalled: bool = False  # --mode stall: the process was stopped, not killed
    records_changed: int = 0  # finished records a woken stale copy rewrote afterwards

    @property
    def gap(self) -> int:
        """Requests the provider served that the run never recorded (paid, then lost)."""
        return self.served - self.recorded

    @property
    def gap_bound(self) -> int:
        """The most a kill can lose: the requests in flight, and one reply per thread of the
        killed process received but not yet saved (no count from outside sees those)."""
        return self.in_flight_at_kill + THREADS


def soak_scripts() -> list[dict[str, Any]]:
    """The demo's scripts, every call 0.8 s, T-1001's worker filing a refund in turn 2."""
    scripts = yaml.safe_load((init_source() / DEMO_SCENARIOS).read_text())
    for script in scripts:
        script["latency_ms"] = LATENCY_MS
    t1001 = next(s for s in scripts if s["name"] == "T-1001#1")
    refund = {"id": "call_r1", "name": "request_refund", "arguments": REFUND}
    t1001["replies"].insert(
        1, {"tool_calls": [refund], "usage": {"prompt_tokens": 900, "completion_tokens": 40}}
    )
    return list(scripts)


def policy_approves_refunds(workspace: Path) -> None:
    """The soak's refund (399.00) is above the demo's approval limit; here the policy
    approves every refund (recorded as such), so the write runs within the trial."""
    config = workspace / CONFIG_FILE
    text = config.read_text()
    limit = 'approval = { request_refund = "amount_cents > 5000" }'
    assert limit in text, "the demo's refund policy changed: update the soak"
    config.write_text(text.replace(limit, 'approval = { request_refund = "never" }'))


def init_source() -> Path:
    """The packaged demo workspace."""
    return Path(__file__).resolve().parents[1] / "orchestrator" / "demo"


def run_trials(trials: int, folder: Path, seed: int = 7, mode: str = "kill") -> list[Trial]:
    """`trials` runs on one Redis, provider and pair of workers, each with one worker
    process killed (`mode` kill) or stopped past the visibility timeout (stall)."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    scenario = folder / "soak.yaml"
    scenario.write_text(yaml.safe_dump(soak_scripts(), sort_keys=False, allow_unicode=True))
    results = []
    with RedisServer(tcp=True) as redis, Provider(scenario, folder / "provider.log") as llm:
        env = child_env(
            TICKETGRAPH_BROKER_URL=redis.url,
            LLM_BASE_URL=llm.url,
            TICKETGRAPH_VISIBILITY_TIMEOUT_S=VISIBILITY_S,
            TICKETGRAPH_RESTORE_INTERVAL_S="1",
        )
        specs = [WorkerSpec("soak1", 1, THREADS), WorkerSpec("soak2", 1, THREADS)]
        with Workers(specs, env, folder / "workers") as workers:
            points = STALL_POINTS if mode == "stall" else POINTS
            for index in range(trials):
                point = points[index % len(points)]
                where = folder / f"t{index:02d}"
                trial = _trial(index, point, where, env, llm, workers, rng, mode == "stall")
                results.append(trial)
                print(_line(trial), flush=True)
    return results


def _trial(
    index: int,
    point: str,
    folder: Path,
    env: dict[str, str],
    llm: Provider,
    workers: Workers,
    rng: random.Random,
    stall: bool = False,
) -> Trial:
    workspace = folder / "demo"
    init_demo(workspace)
    policy_approves_refunds(workspace)
    before = llm.stats(reset=True)["requests"]
    started = time.monotonic()
    log = folder / "run.log"
    with log.open("w") as out:
        run = subprocess.Popen(
            ticketgraph("run"), cwd=workspace, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    broker = env["TICKETGRAPH_BROKER_URL"]
    signum = signal.SIGSTOP if stall else signal.SIGKILL
    pid, in_flight = _kill(point, workspace, broker, llm, workers, rng, signum)
    try:
        try:
            code: int | None = run.wait(TRIAL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            run.kill()
            code = None
        finished = _finished_records(workspace)
    finally:
        if stall and pid is not None:
            os.kill(pid, signal.SIGCONT)
    if stall and pid is not None:
        _wait_idle(broker, _nodes(workers), pid)
    trial = _count(index, point, pid is not None, in_flight, code, workspace, llm, before, started)
    trial.stalled = stall
    trial.records_changed = sum(
        _finished_records(workspace).get(name) != data for name, data in finished.items()
    )
    return trial


def _finished_records(workspace: Path) -> dict[str, bytes]:
    """The bytes of every ticket record with a verdict, by file name."""
    out = {}
    for path in sorted((workspace / "runs").glob("run-*/records/*.json")):
        data = path.read_bytes()
        if versions.newest(data, json.loads)["status"] in ("pass", "needs_human"):
            out[path.name] = data
    return out


def _wait_idle(broker: str, nodes: int, pid: int) -> None:
    """Until the woken process runs no task (its stale copies have ended, one way or other)."""
    deadline = time.monotonic() + WAKE_TIMEOUT_S
    while pid in _busy_pids(broker, nodes) and time.monotonic() < deadline:
        time.sleep(0.2)


def _kill(
    point: str,
    workspace: Path,
    broker: str,
    llm: Provider,
    workers: Workers,
    rng: random.Random,
    signum: signal.Signals = signal.SIGKILL,
) -> tuple[int | None, int]:
    """Wait for the trial's kill point, send `signum` to one worker process; (its PID or
    None if the point was never reached, requests in flight)."""
    deadline = time.monotonic() + 60
    trace = _Trace(workspace)
    if point == "write":
        # A busy poll: the write itself takes a millisecond or two (an fsync'd append).
        refund = lambda e: e["event"] == "tool_start" and e["tool"] == "request_refund"  # noqa: E731
        while time.monotonic() < deadline:
            if (start := trace.find(refund)) is not None:
                # Killed at once (no read first): the write must not finish meanwhile.
                return start["pid"], _kill_counted(start["pid"], signum, llm, first=False)
        return None, 0
    if point == "model":
        while time.monotonic() < deadline and not trace.find(lambda e: e["event"] == "routed"):
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 1.5))
    else:
        review = lambda e: e["event"] == "node_start" and e.get("node") == "review"  # noqa: E731
        while time.monotonic() < deadline and not trace.find(review):
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.5))
    if signum == signal.SIGSTOP:
        node = "fanout" if point == "model" else "review"
        return _stall(workspace, broker, _nodes(workers), llm, rng, trace, node, deadline)
    busy = _busy_pids(broker, _nodes(workers)) or _children(workers)
    if not busy:
        return None, 0
    pid = rng.choice(busy)
    return pid, _kill_counted(pid, signum, llm)


def _stall(
    workspace: Path,
    broker: str,
    nodes: int,
    llm: Provider,
    rng: random.Random,
    trace: _Trace,
    node: str,
    deadline: float,
) -> tuple[int | None, int]:
    """SIGSTOP a process while it works on a ticket of `node`, holding none of the run's
    file locks; (its PID or None if `node` ended first, requests in flight).

    A process stopped while it holds a fence's or run.json's lock holds that ticket, or the
    whole run, until it is woken (RELIABILITY.md, not guaranteed), and the soak wakes it
    only after the run. Celery's list of busy processes is a moment old when it arrives
    (a process in it may have gone on to the report step), so a process found holding a
    lock once stopped is woken at once and another moment chosen."""
    ended = lambda e: e["event"] == "node_end" and e.get("node") == node  # noqa: E731
    while time.monotonic() < deadline and not trace.find(ended):
        if not (busy := _busy_pids(broker, nodes, PER_TICKET_TASKS)):
            time.sleep(0.05)  # both answered at once: nothing busy yet
            continue
        # A process of a step that mostly writes holds a lock much of the time: several
        # moments from one list, while it is fresh (its processes are still on their tasks).
        fresh_until = time.monotonic() + _LIST_FRESH_S
        while time.monotonic() < fresh_until:
            pid = rng.choice(busy)
            try:
                in_flight = _kill_counted(pid, signal.SIGSTOP, llm)
                _wait_stopped(pid)  # a thread still running could take a lock after the look
                if not _holds_a_lock(pid, workspace / "runs"):
                    return pid, in_flight
            except BaseException:
                os.kill(pid, signal.SIGCONT)  # never leave a process stopped that nobody wakes
                raise
            os.kill(pid, signal.SIGCONT)
            if trace.find(ended):
                break
            time.sleep(rng.uniform(0.005, 0.05))
    return None, 0


_LIST_FRESH_S = 0.5  # a list of busy processes is tried this long after it came
_ANSWER_S = 3.0  # the most a remote-control question waits for the workers' answers


def _wait_stopped(pid: int, timeout_s: float = 5.0) -> None:
    """Until every thread of `pid` is stopped (state T in /proc), or it is gone."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except (FileNotFoundError, ProcessLookupError):
            return  # the process is gone
        if all(_thread_state(task) in ("T", "t", None) for task in tasks):
            return
        time.sleep(0.001)


def _thread_state(task: Path) -> str | None:
    """One thread's state letter from /proc/<pid>/task/<tid>/stat; None if it has exited."""
    try:
        return (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


def _holds_a_lock(pid: int, runs: Path) -> bool:
    """Whether `pid` holds a flock of a file in a run folder (a fence, run.json's .lock), by
    /proc/locks: `N: FLOCK ADVISORY WRITE <pid> <major>:<minor>:<inode> 0 EOF`."""
    inodes = {_inode(p) for p in [*runs.glob("run-*/fences/*"), *runs.glob("run-*/.lock")]}
    held = (line.split() for line in Path("/proc/locks").read_text().splitlines())
    return any(
        len(f) >= 6 and f[1] == "FLOCK" and f[4] == str(pid) and int(f[5].split(":")[2]) in inodes
        for f in held
    )


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except FileNotFoundError:  # removed since the glob
        return None


def _kill_counted(pid: int, signum: signal.Signals, llm: Provider, first: bool = True) -> int:
    """Send `signum` to `pid`; the requests in flight at that moment. Read before (unless
    not `first`) and after: a request sent while the first read was on its way is open at
    the kill and counted by the second (the killed process's calls stay open at the
    provider for their latency)."""
    before = llm.stats()["in_flight"] if first else 0
    os.kill(pid, signum)
    return max(before, llm.stats()["in_flight"])


class _Trace:
    """The run's run.jsonl, read as it grows."""

    def __init__(self, workspace: Path) -> None:
        self.workspace, self.offset, self.events = workspace, 0, []  # type: ignore[var-annotated]
        self.path: Path | None = None

    def find(self, match: Callable[[dict[str, Any]], bool]) -> dict[str, Any] | None:
        if self.path is None:
            runs = sorted((self.workspace / "runs").glob("run-*/run.jsonl"))
            if not runs:
                return None
            self.path = runs[-1]
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            chunk = handle.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        self.events += [json.loads(line) for line in complete.splitlines() if line.strip()]
        return next((e for e in reversed(self.events) if match(e)), None)


def _busy_pids(broker: str, nodes: int, tasks: frozenset[str] | None = None) -> list[int]:
    """PIDs of worker processes running a task (one of `tasks`, if given), by Celery's
    remote control: the answer of each of the `nodes` (`_nodes`), or what came within its
    window (a worker loaded by a whole test suite can take longer than half a second to
    answer, and its busy processes then went unseen)."""
    control = Celery(broker=broker)
    try:
        active = control.control.inspect(timeout=_ANSWER_S, limit=nodes).active() or {}
    finally:
        control.close()
    running = (t for found in active.values() for t in found)
    return sorted({t["worker_pid"] for t in running if tasks is None or t["name"] in tasks})


def _nodes(workers: Workers) -> int:
    """The Celery nodes that answer a remote-control question: one a worker process."""
    return sum(spec.processes for spec in workers.specs)


def _children(workers: Workers) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid in workers.pids:
            found.append(int(proc.name))
    return found


def _count(
    index: int,
    point: str,
    killed: bool,
    in_flight: int,
    code: int | None,
    workspace: Path,
    llm: Provider,
    before: int,
    started: float,
) -> Trial:
    state = json.loads((workspace / "run-state.json").read_text())
    tickets = state["tickets"]
    lost = sum(t["status"] not in ("pass", "needs_human") for t in tickets.values())
    expected = dict(REFERENCE)
    if any(t.get("stop") == "write_unsure" for t in tickets.values()):
        expected["T-1001"] = "needs_human"  # its refund was cut off: a person must check
    wrong = sum(tickets[i]["status"] != v for i, v in expected.items() if i in tickets)
    run_dir = workspace / "runs" / state["run_id"]
    actions = run_dir / "actions.jsonl"
    lines = [json.loads(x) for x in actions.read_text().splitlines()] if actions.exists() else []
    # Finance files one refund per idempotency key (the demo's request_refund passes it): a
    # refund run again with its key after a crash is one refund; twice means two keys.
    filed = {(a["ticket"], a["call_id"], a.get("key") or a["call_id"]) for a in lines}
    per_call = Counter((ticket, call) for ticket, call, _ in filed)
    interrupted = any(
        "interrupted before its result was recorded" in (m.get("content") or "")
        for path in run_dir.glob("agents/T-1001.*.json")
        for m in versions.read_json(path)["messages"]
    )
    recorded = sum(n["calls"] for n in state["nodes"].values())
    return Trial(
        index=index,
        point=point,
        killed=killed,
        in_flight_at_kill=in_flight,
        exit_code=code,
        lost=lost,
        wrong_verdicts=wrong,
        refunds=len(filed),
        refunds_twice=sum(c > 1 for c in per_call.values()),
        turns_twice=turns_twice(read_trace(run_dir / "run.jsonl")),
        write_interrupted=interrupted,
        served=llm.stats()["requests"] - before,
        recorded=recorded,
        seconds=round(time.monotonic() - started, 1),
    )


def turns_twice(events: list[dict[str, Any]]) -> int:
    """Model turns traced twice by one agent: a `turn` is traced after its reply is saved,
    and an agent's id and turn count are saved with it, so a second `turn` event with the
    same (agent, turn) is a saved reply that was paid for again."""
    turns = Counter((e["agent_run_id"], e["turn"]) for e in events if e["event"] == "turn")
    return sum(c > 1 for c in turns.values())


def _line(t: Trial) -> str:
    return (
        f"trial {t.index:2d} {t.point:6s} killed={t.killed!s:5s} exit={t.exit_code} "
        f"lost={t.lost} wrong={t.wrong_verdicts} refunds={t.refunds} twice={t.refunds_twice} "
        f"turns_twice={t.turns_twice} "
        f"write_interrupted={t.write_interrupted!s:5s} served={t.served} recorded={t.recorded} "
        f"gap={t.gap} in_flight_at_kill={t.in_flight_at_kill} "
        f"{'stalled ' if t.stalled else ''}records_changed={t.records_changed} {t.seconds}s"
    )


def summary(trials: list[Trial]) -> dict[str, Any]:
    """Totals over all trials, the figures RELIABILITY.md records."""
    return {
        "trials": len(trials),
        "killed": sum(t.killed for t in trials),
        "by_point": dict(Counter(t.point for t in trials if t.killed)),
        "lost_tickets": sum(t.lost for t in trials),
        "refunds_done_twice": sum(t.refunds_twice for t in trials),
        "turns_paid_twice": sum(t.turns_twice for t in trials),
        "writes_interrupted_mid_call": sum(t.write_interrupted for t in trials),
        "wrong_verdicts": sum(t.wrong_verdicts for t in trials),
        "exit_codes": dict(Counter(str(t.exit_code) for t in trials)),
        "paid_not_recorded": sum(t.gap for t in trials),
        "gap_over_in_flight": sum(t.gap > t.in_flight_at_kill for t in trials),
        "gap_over_bound": sum(t.gap > t.gap_bound for t in trials),
        "median_trial_s": sorted(t.seconds for t in trials)[len(trials) // 2] if trials else 0,
        "stalled": sum(t.stalled and t.killed for t in trials),
        "finished_records_changed": sum(t.records_changed for t in trials),
    }


def main(argv: list[str] | None = None) -> int:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument(
        "--mode",
        choices=["kill", "stall"],
        default="kill",
        help="kill: SIGKILL a worker process; stall: SIGSTOP it past the visibility timeout "
        "and SIGCONT it once the run has ended",
    )
    parser.add_argument("--seed", type=int, default=7)
    add_folder_option(parser)
    parser.add_argument("--json", type=Path, help="write every trial and the summary here")
    args = parser.parse_args(argv)
    args.folder = trials_folder(parser, args.folder, "soak")
    trials = run_trials(args.trials, args.folder, args.seed, args.mode)
    totals = summary(trials)
    print(json.dumps(totals, indent=2))
    if args.json:
        data = {"summary": totals, "trials": [asdict(t) | {"gap": t.gap} for t in trials]}
        args.json.write_text(json.dumps(data, indent=2))
    bad = (
        totals["lost_tickets"]
        or totals["refunds_done_twice"]
        or totals["turns_paid_twice"]
        or totals["gap_over_bound"]
        or totals["finished_records_changed"]
    )
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
