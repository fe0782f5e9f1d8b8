"""The lesson's own script as a peer: seed 003's `orchestrate.mjs`, run with node.

What is extracted. The seed is a Portuguese tutorial; under the heading "`orchestrate.mjs`
completo" it prints the whole script as one code block, after a `JAVASCRIPT` label line. The
script is the run of lines from the first line starting `// orchestrate.mjs` to the first
line starting `main().catch(` after it, both included: 679 lines, the count the lesson itself
states ("Seiscentas e setenta e nove linhas"). Earlier code blocks are excerpts of the same
functions and are not used. The shell transcripts of the lesson escape `$` as `\\$`; the script
block has no escapes today, but `\\$` is turned back into `$` anyway (the script never needs a
literal `\\$`). Line ends are normalised to `\\n`. The extraction checks the line count and
that every patch anchor occurs exactly once, so a changed seed fails loudly, not silently.
The script is written to a temporary directory for one run and removed with it; no copy is
kept in this repository.

What is patched (nothing else changes: the stub, the pool, the sequential review loop, the
per-ticket run-state.json rewrites and the report are the lesson's):
1. `const STUB_LATENCY_MS = 60;` reads `STUB_LATENCY_MS` from the environment (default 60).
2. Before `function makeStubClient(queue) {`, a block runs when `BENCH_TICKETS` = N > 0: it
   replaces the six demo tickets by N clones — ticket k = 1..N is `T-(100000+k)` with the text
   of demo ticket (k-1) mod 6 — and the stub's SCRIPTS by the clones' scripts: each clone gets
   its demo ticket's reply queues (`<id>#1`, `<id>#2`) with the demo id replaced by the clone's
   id in every text, usage unchanged, and the router answers one `<clone>: <demo's raw label>`
   line per clone with the router's own usage (624 + 96), whatever N is.
`POOL_SIZE` is already read from the environment by the script.

Measured: `wall_s` is the sum of the script's own node times in run-state.json (route, fanout,
merge, review, report: from the router's request to the report printed); `total_s` is the
node process from spawn to exit; max RSS is the child's, from wait4.

    python -m bench.peers.seed_script --tickets 1000 --pool 16 --latency-ms 50 [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.peers.result import NODE_ORDER, NodeUsage, PeerResult, PeerStatus, TicketOutcome

PEER = "seed_script"
SEED = Path(__file__).resolve().parents[3] / "shared" / "seeds" / "003_173411d19ddab4d2.txt"
SCRIPT_NAME = "orchestrate.mjs"
SCRIPT_START = "// orchestrate.mjs"
SCRIPT_END = "main().catch("
SCRIPT_LINES = 679
TIMEOUT_S = 600.0

LATENCY_ANCHOR = "const STUB_LATENCY_MS = 60;"
LATENCY_PATCH = "const STUB_LATENCY_MS = Number(process.env.STUB_LATENCY_MS ?? 60);"
CLONES_ANCHOR = "function makeStubClient(queue) {"
CLONES_PATCH = """\
// ---- bench patch: BENCH_TICKETS clones of the demo tickets, each scripted like its demo ----
const BENCH_TICKETS = Number(process.env.BENCH_TICKETS) || 0;
if (BENCH_TICKETS > 0) {
  const demoIds = Object.keys(TICKET_TEXT).sort();
  const router = SCRIPTS.router[0];
  const routed = router.content.find((b) => b.type === "text").text;
  const rawLabel = new Map(routed.split("\\n").map((line) => line.split(/\\s*:\\s*/)));
  const texts = {};
  const scripts = {};
  const lines = [];
  for (let k = 1; k <= BENCH_TICKETS; k++) {
    const demo = demoIds[(k - 1) % demoIds.length];
    const id = `T-${100000 + k}`;
    texts[id] = TICKET_TEXT[demo];
    lines.push(`${id}: ${rawLabel.get(demo)}`);
    for (const key of Object.keys(SCRIPTS).filter((x) => x.startsWith(`${demo}#`))) {
      const cloned = JSON.stringify(SCRIPTS[key]).split(demo).join(id);
      scripts[`${id}${key.slice(demo.length)}`] = JSON.parse(cloned);
    }
  }
  for (const key of Object.keys(TICKET_TEXT)) delete TICKET_TEXT[key];
  Object.assign(TICKET_TEXT, texts);
  for (const key of Object.keys(SCRIPTS)) delete SCRIPTS[key];
  Object.assign(SCRIPTS, scripts, {
    router: [{ ...router, content: [{ type: "text", text: lines.join("\\n") }] }],
  });
}
// ---- end of bench patch ----

"""


class SeedError(Exception):
    """The seed's text does not hold the script in the expected shape."""


@dataclass(frozen=True)
class NodeRun:
    """How the node process ended."""

    exit_code: int
    total_s: float
    max_rss_mb: float
    stderr: str


def extract_script(seed_text: str) -> str:
    """The full `orchestrate.mjs` block of the lesson, unescaped (see the module docstring)."""
    lines = seed_text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    start = next((i for i, line in enumerate(lines) if line.startswith(SCRIPT_START)), None)
    if start is None:
        raise SeedError(f"no line starts with {SCRIPT_START!r}")
    end = next((i for i in range(start, len(lines)) if lines[i].startswith(SCRIPT_END)), None)
    if end is None:
        raise SeedError(f"no line starts with {SCRIPT_END!r} after the script's first line")
    script = "\n".join(lines[start : end + 1]).replace("\\$", "$") + "\n"
    if end + 1 - start != SCRIPT_LINES:
        raise SeedError(f"the script has {end + 1 - start} lines, the lesson says {SCRIPT_LINES}")
    return script


def patch_script(script: str) -> str:
    """The script with the latency and the clone patches applied."""
    for anchor in (LATENCY_ANCHOR, CLONES_ANCHOR):
        if script.count(anchor) != 1:
            raise SeedError(f"{anchor!r} occurs {script.count(anchor)} times, expected once")
    script = script.replace(LATENCY_ANCHOR, LATENCY_PATCH)
    return script.replace(CLONES_ANCHOR, CLONES_PATCH + CLONES_ANCHOR)


def run(
    tickets: int | None = None,
    pool: int = 2,
    latency_ms: float = 60,
    seed: Path = SEED,
    node: str = "node",
) -> PeerResult:
    """Run the patched script once: N clones (None: the seed's own six tickets)."""
    executable = shutil.which(node)
    if executable is None:
        return _skipped(f"{node!r} is not on PATH")
    if not seed.is_file():
        return _skipped(f"the seed is not at {seed}")
    script = patch_script(extract_script(seed.read_text(encoding="utf-8")))
    env = _env(tickets, pool, latency_ms)
    with tempfile.TemporaryDirectory(prefix="seed-script-") as tmp:
        folder = Path(tmp)
        (folder / SCRIPT_NAME).write_text(script, encoding="utf-8")
        done = run_node([executable, SCRIPT_NAME], folder, env)
        result = _result(folder / "run-state.json", done, pool)
    result.extra |= {"latency_ms": latency_ms, "node": _version(executable)}
    return result


def _skipped(reason: str) -> PeerResult:
    return PeerResult(peer=PEER, status=PeerStatus.SKIPPED, reason=reason)


def _env(tickets: int | None, pool: int, latency_ms: float) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("STOP_AFTER", "BENCH_TICKETS")}
    env |= {"POOL_SIZE": str(pool), "STUB_LATENCY_MS": f"{latency_ms:g}"}
    if tickets is not None:
        env["BENCH_TICKETS"] = str(tickets)
    return env


def run_node(argv: list[str], cwd: Path, env: dict[str, str]) -> NodeRun:
    """Run node in `cwd`, its output in files there; wait4 gives the child's own peak RSS."""
    started = time.perf_counter()
    with open(cwd / "stdout.txt", "wb") as out, open(cwd / "stderr.txt", "wb") as err:
        child = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=err)
    killer = threading.Timer(TIMEOUT_S, os.kill, (child.pid, signal.SIGKILL))
    killer.start()
    try:
        _, status, usage = os.wait4(child.pid, 0)
    finally:
        killer.cancel()
    total_s = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)  # wait4 reaped it, not Popen
    stderr = (cwd / "stderr.txt").read_text(encoding="utf-8", errors="replace")
    return NodeRun(child.returncode, total_s, usage.ru_maxrss / 1024, stderr)


def _result(state_path: Path, done: NodeRun, pool: int) -> PeerResult:
    """The result from the script's own run-state.json and the process figures."""
    result = PeerResult(peer=PEER, pool=pool, total_s=done.total_s, max_rss_mb=done.max_rss_mb)
    result.exit_code = done.exit_code
    try:
        state = json.loads(state_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        result.status, result.reason = PeerStatus.FAILED, f"no run-state.json: {exc}"
        return result
    result.nodes = _nodes(state["nodes"], state["tickets"])
    result.outcomes = {tid: _outcome(rec) for tid, rec in state["tickets"].items()}
    result.tickets = len(result.outcomes)
    node_ms = {name: node.get("ms", 0) for name, node in state["nodes"].items()}
    result.wall_s = sum(node_ms.values()) / 1000
    result.extra["node_ms"] = node_ms
    if done.exit_code not in (0, 1) or "report" not in state["nodes"]:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        result.status, result.reason = PeerStatus.FAILED, f"exit {done.exit_code}: {tail[0]}"
    return result


def _nodes(nodes: dict[str, Any], tickets: dict[str, Any]) -> dict[str, NodeUsage]:
    rounds = sum(t.get("gate_rounds", 0) for t in tickets.values())
    return {
        name: NodeUsage(
            nodes[name]["calls"], nodes[name]["tokens"], rounds if name == "review" else None
        )
        for name in NODE_ORDER
        if name in nodes
    }


def _outcome(record: dict[str, Any]) -> TicketOutcome:
    return TicketOutcome(
        record["category"],
        record["handler"],
        record["gate_rounds"],
        record["stop"] or "",
        record["status"],
    )


def _version(executable: str) -> str:
    done = subprocess.run([executable, "--version"], capture_output=True, text=True, timeout=10)
    return done.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    """Command line: run once and print the result (one JSON object with --json)."""
    parser = argparse.ArgumentParser(prog="python -m bench.peers.seed_script")
    parser.add_argument("--tickets", type=int, help="N clones (default: the seed's six)")
    parser.add_argument("--pool", type=int, default=2, help="POOL_SIZE (default: 2)")
    parser.add_argument("--latency-ms", type=float, default=60, help="stub latency (default 60)")
    parser.add_argument("--seed", type=Path, default=SEED, help=f"default: {SEED}")
    parser.add_argument("--node", default="node", help="the node executable (default: node)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    try:
        result = run(args.tickets, args.pool, args.latency_ms, args.seed, args.node)
    except (SeedError, OSError) as exc:
        print(f"seed-script peer failed: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result.to_json()) if args.json else result.summary())
    return 0 if result.status is not PeerStatus.FAILED else 1


if __name__ == "__main__":
    sys.exit(main())
