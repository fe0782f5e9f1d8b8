"""Budgets and caps: what the run budget costs per model call, and what the endpoint caps do.

Three measurements, each side by side in one invocation:

  micro      what one call's budget work costs, alone: the worst case counted from a
             draft's transcript, a hold and a settlement in the ledger on a private Redis,
             CALLS times; CPU of this process and of redis-server (/proc), per call.
  overhead   the embedded workload (N tickets, latency 0) run with and without `--budget`,
             interleaved; CPU of the whole command (user + sys of it and its children) and
             the difference per model call: what holding and settling in the ledger adds.
  caps       a fleet of one `ticketgraph worker --processes 3 --threads 8` on a private
             Redis against the scripted provider in its own process, limited to TPM tokens
             per minute (`--tpm-limit`: 429 with Retry-After past it); the workload (its
             usage counted by the provider, as a real API counts) run with no caps, with
             LLM_MAX_TPM set to the provider's rate, and with LLM_MAX_INFLIGHT=4: requests,
             the share answered 429, the provider's max in flight, wall time.

    python -m bench.caps                      # both (BENCHMARKS.md has the figures)
    python -m bench.caps --only overhead --n 1000
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from bench import machine
from bench.services import Provider, Workers, WorkerSpec, child_env, ticketgraph
from bench.workload import build
from orchestrator.broker.redis_server import RedisServer
from orchestrator.coordination import budget
from orchestrator.run.store import RunStore
from workers.meter import worst_case
from workers.pricing import Price
from workers.state import Message
from workers.usage import Usage

SCENARIOS = Path("scenarios") / "demo.yaml"


def _cpu_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(root: Path, env: dict[str, str], *args: str) -> dict[str, Any]:
    """`ticketgraph run --quiet ARGS` in `root`: its exit code, wall and CPU seconds."""
    cpu, wall = _cpu_children(), time.perf_counter()
    done = subprocess.run(
        ticketgraph("run", "--quiet", *args), cwd=root, env=env, capture_output=True, text=True
    )
    return {
        "exit_code": done.returncode,
        "wall_s": round(time.perf_counter() - wall, 3),
        "cpu_s": round(_cpu_children() - cpu, 3),
        "tail": done.stdout.strip().splitlines()[-1:] or done.stderr.strip().splitlines()[-1:],
    }


def _process_cpu_s(pid: int) -> float:
    """utime + stime of process `pid`, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def micro(folder: Path, calls: int) -> dict[str, Any]:
    """CPU per call of worst_case + hold + settle against a real Redis."""
    folder.mkdir(parents=True, exist_ok=True)
    store = RunStore(folder / "runs" / "run-20261201-000000-beef")
    store.dir.mkdir(parents=True, exist_ok=True)
    prompt = "Ticket id: T-1001\n" + "My invoice shows the wrong VAT number. " * 60
    messages = [
        Message(role="system", content="You answer billing tickets."),
        Message(role="user", content=prompt),
    ]
    price = Price()
    with RedisServer(tcp=True) as server:
        r = server.client()
        budget.open_ledger(r, store, budget.Limits(1_000_000.0))
        meter = budget.RunMeter(r, store, budget.Limits(1_000_000.0), "T-1001")
        pid = server.process.pid  # type: ignore[union-attr]
        usage = Usage(prompt_tokens=781, completion_tokens=92)
        for _ in range(100):  # warm: scripts loaded, tokenizer built
            meter.hold(worst_case(messages, [], 1024, price)).settle(0.0001, usage)
        ours, theirs = time.process_time(), _process_cpu_s(pid)
        for _ in range(calls):
            meter.hold(worst_case(messages, [], 1024, price)).settle(0.0001, usage)
        ours, theirs = time.process_time() - ours, _process_cpu_s(pid) - theirs
    return {
        "calls": calls,
        "prompt_tokens": worst_case(messages, [], 1024, price).prompt_tokens,
        "client_cpu_ms_per_call": round(1000 * ours / calls, 4),
        "redis_cpu_ms_per_call": round(1000 * theirs / calls, 4),
    }


def overhead(folder: Path, n: int, pairs: int) -> dict[str, Any]:
    """CPU with and without a run budget, interleaved `pairs` times."""
    rows: list[dict[str, Any]] = []
    calls = 0
    for index in range(pairs):
        order = (None, "1000") if index % 2 == 0 else ("1000", None)  # neither always first
        for limit in order:
            root = folder / f"overhead-{index}-{'budget' if limit else 'none'}"
            work = build(root, n, latency_ms=0, pool_size=16)
            calls = sum(work.calls.values())
            load = machine.loadavg()[0]
            row = _run(root, child_env(), *(["--budget", limit] if limit else []))
            rows.append({"budget": limit is not None, "load": load, **row})
            print(json.dumps(rows[-1]), flush=True)
    without = [r["cpu_s"] for r in rows if not r["budget"]]
    with_budget = [r["cpu_s"] for r in rows if r["budget"]]
    per_call_ms = 1000 * (sum(with_budget) - sum(without)) / len(without) / calls
    return {"n": n, "calls": calls, "runs": rows, "cpu_ms_per_call_added": round(per_call_ms, 3)}


def counted(scenarios: Path) -> None:
    """Take the scripts' fixed usage out: the provider counts every request with o200k_base."""
    scripts = yaml.safe_load(scenarios.read_text(encoding="utf-8"))
    for script in scripts:
        for reply in script.get("replies", []):
            reply.pop("usage", None)
    scenarios.write_text(yaml.safe_dump(scripts, allow_unicode=True), encoding="utf-8")


def caps(folder: Path, n: int, tpm: int) -> dict[str, Any]:
    """The workload against a provider limited to `tpm` tokens per minute: no caps, the TPM
    cap at that rate, and at most 4 in flight."""
    variants = {
        "no caps": {},
        f"LLM_MAX_TPM={tpm}": {"LLM_MAX_TPM": str(tpm)},
        "LLM_MAX_INFLIGHT=4": {"LLM_MAX_INFLIGHT": "4"},
    }
    template = build(folder / "scenario", n, latency_ms=50, pool_size=16)
    counted(template.root / SCENARIOS)
    rows = []
    for name, extra in variants.items():
        root = folder / name.split("=")[0].replace(" ", "-").lower()
        build(root, n, latency_ms=50, pool_size=16)
        args = ["--tpm-limit", str(tpm), "--tpm-window-s", "60"]
        with (
            RedisServer(tcp=True) as redis,
            Provider(template.root / SCENARIOS, root / "provider.log", args) as llm,
        ):
            env = child_env(
                TICKETGRAPH_BROKER_URL=redis.url,
                LLM_BASE_URL=llm.url,
                LLM_MAX_RETRIES="10",
                LLM_RETRY_MAX_S="300",
                **extra,
            )
            with Workers([WorkerSpec("caps", 3, 8)], env, root / "workers"):
                llm.stats(reset=True)
                load = machine.loadavg()[0]
                row = _run(root, env, "--timeout", "900")
                row.pop("cpu_s")  # the CLI's alone: the workers are not its children
                served = llm.stats()
        share = served["rate_limited"] / served["requests"] if served["requests"] else None
        rows.append(
            {
                "variant": name,
                "load": load,
                "requests": served["requests"],
                "rate_limited": served["rate_limited"],
                "share_429": None if share is None else round(share, 4),
                "max_in_flight": served["max_in_flight"],
                "tokens": served["prompt_tokens"] + served["completion_tokens"],
                **row,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return {"n": n, "tpm": tpm, "runs": rows}


def main(argv: list[str] | None = None) -> int:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.caps", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--only", choices=["micro", "overhead", "caps"])
    parser.add_argument("--calls", type=int, default=5000, help="micro: calls measured")
    parser.add_argument("--n", type=int, default=1000, help="tickets in the overhead runs")
    parser.add_argument("--pairs", type=int, default=2, help="overhead: runs of each kind")
    parser.add_argument("--caps-n", type=int, default=96, help="tickets in the caps runs")
    parser.add_argument("--tpm", type=int, default=40_000, help="the provider's token rate")
    parser.add_argument("--folder", type=Path, default=Path("/tmp/ticketgraph-caps"))
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    shutil.rmtree(args.folder, ignore_errors=True)
    out: dict[str, Any] = {"machine": machine.describe(), "load_before": machine.loadavg()}
    if args.only in (None, "micro"):
        out["micro"] = micro(args.folder / "micro", args.calls)
        print(json.dumps(out["micro"]), flush=True)
    if args.only in (None, "overhead"):
        out["overhead"] = overhead(args.folder, args.n, args.pairs)
    if args.only in (None, "caps"):
        out["caps"] = caps(args.folder, args.caps_n, args.tpm)
    out["load_after"] = machine.loadavg()
    print(json.dumps({k: v for k, v in out.items() if k != "machine"}, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
