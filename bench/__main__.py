"""`python -m bench`: ticketgraph's benchmarks side by side with its peers, against targets.

Sections (`--only a,c` picks some):
  a  N = 1,000, pool 16, 50 ms: embedded run vs the LangGraph peers (in memory; SQLite
     checkpoints, durability sync) vs the seed's Node script
  b  N = 1,000, pool 32, 50 ms, distributed: 1 worker process vs 2 (3 runs each, medians)
  c  latency 0: wall and CPU per ticket at 1,000 and 10,000; bytes per ticket; peak RSS per
     process; CPU per ticket of ours and the LangGraph peers on one provider process, and of
     ours again on tmpfs (the filesystem's share)
  d  the demo: fan-out ms and whole-command wall (5 runs), over the LangGraph peer's process
  e  broker bytes per task message with 1 KB and 100 KB drafts
  f  harness overhead per turn
  g  the web view: server time of a 10,000-ticket run page, a 1,000-run list and a 10,000-item queue
  h  the fleet regime: N = 10,000, pool 512, 2 s calls: embedded run, two and three
     `ticketgraph worker` processes on one Redis (target: ideal / actual >= 0.9 each) vs
     LangGraph; requests in flight, peak RSS and threads per process
  i  a ticket's footprint on the shared services, N = --n at latency 0 on a private Redis:
     Redis commands, bytes and CPU, task messages, files, bytes written, fsyncs, renames and
     opens (strace, if on PATH); then on paper a 100,000-ticket run at pool 2,048 on 8
     machines with 2 s calls: what one Redis and one NFS volume must sustain, which gives
     out first, and its wall

Every figure is printed with its target, value / target and PASS or MISS (a figure without a
target is a reference); the load average and CPU steal of each section, and the machine,
are printed and stored with it. `--json FILE` writes every figure and every raw number.
The machine is shared and noisy: compare figures of one invocation, not across invocations.
The exit code is 0 when every chosen section ran (whatever the verdicts), 1 if one crashed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any

from bench import (
    compare,
    demo,
    distributed,
    fleet,
    footprint,
    harness_overhead,
    machine,
    scaling,
    services,
    web,
)
from bench.figures import Verdict, table_header, table_row
from bench.suite import Context, Options, Section, SectionRunner

SECTIONS: dict[str, tuple[str, SectionRunner]] = {
    "a": ("ticketgraph vs LangGraph (in memory, SQLite) vs the seed script", compare.run),
    "b": ("distributed: 1 vs 2 worker processes", distributed.run_scaling),
    "c": ("scaling at latency 0: wall, disk, memory", scaling.run),
    "d": ("the demo", demo.run),
    "e": ("broker bytes per task message", distributed.run_broker_bytes),
    "f": ("harness overhead per turn", harness_overhead.run_section),
    "g": ("the web view's server time", web.run),
    "h": ("the fleet regime: N = 10,000, pool 512, 2 s calls", fleet.run),
    "i": ("a ticket's footprint on Redis and the volume; 100,000 tickets on paper", footprint.run),
}
# c last: its largest run is sized to what is left of the time budget.
EXECUTION_ORDER = "fdeghiabc"
FULL_BUDGET_S = 900.0
QUICK_BUDGET_S = 60.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="small N everywhere (CI smoke)")
    parser.add_argument("--only", default="abcdefghi", help="sections to run, e.g. a,c")
    parser.add_argument("--n", type=int, default=1000, help="tickets in a, b, c and i (1,000)")
    parser.add_argument(
        "--big-n", type=int, default=10000, help="c's largest run and h's run (10,000)"
    )
    parser.add_argument("--runs", type=int, help="runs per figure (default: per section)")
    parser.add_argument("--budget", type=float, help="seconds for the whole suite (900; 60 quick)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write every figure here")
    parser.add_argument("--keep", action="store_true", help="keep the workspaces and logs")
    return parser.parse_args(argv)


def chosen_sections(only: str) -> list[str]:
    """The section letters of `--only`, in execution order; SystemExit on an unknown one."""
    letters = set(only.replace(",", "").replace(" ", ""))
    unknown = letters - set(SECTIONS)
    if unknown or not letters:
        raise SystemExit(f"--only: choose among {', '.join(SECTIONS)} (got {only!r})")
    return [x for x in EXECUTION_ORDER if x in letters]


def run_section(ctx: Context, letter: str) -> Section:
    """Run one section; a crash becomes the section's error, not the suite's end."""
    title, runner = SECTIONS[letter]
    section = Section(letter, title)
    window = machine.LoadWindow()
    print(f"[bench] {letter}: {title} …", file=sys.stderr, flush=True)
    try:
        runner(ctx, section)
    except Exception as exc:
        section.error = f"{type(exc).__name__}: {exc}"
        section.raw["traceback"] = traceback.format_exc()
    section.load = window.close()
    print(f"[bench] {letter}: done in {section.load['wall_s']} s", file=sys.stderr, flush=True)
    return section


def table(sections: list[Section], host: dict[str, Any], wall_s: float) -> str:
    """The printed report: machine, then each section's load and figures."""
    width = max((len(f.label) for s in sections for f in s.figures), default=20)
    lines = [f"ticketgraph benchmarks — {machine.one_line(host)}", f"  {table_header(width)}"]
    for section in sorted(sections, key=lambda s: s.letter):
        load = section.load
        lines.append(
            f"\n{section.letter}. {section.title}  [load {_load(load['loadavg_start'])} → "
            f"{_load(load['loadavg_end'])}, steal {load['steal_pct']}%, {load['wall_s']} s]"
        )
        if section.error:
            lines.append(f"  CRASHED: {section.error}")
        lines += [f"  {table_row(f, width)}" for f in section.figures]
    verdicts = [f.verdict for s in sections for f in s.figures if f.target is not None]
    counts = ", ".join(f"{verdicts.count(v)} {v.value}" for v in (Verdict.PASS, Verdict.MISS))
    missing = verdicts.count(Verdict.NOT_MEASURED)
    lines.append(f"\ntargets: {counts}, {missing} not measured; suite wall {wall_s:.0f} s")
    return "\n".join(lines)


def _load(values: list[float]) -> str:
    return " ".join(f"{v:.2f}" for v in values)


def report_json(
    sections: list[Section],
    host: dict[str, Any],
    options: Options,
    started: datetime,
    wall_s: float,
) -> dict[str, Any]:
    """Every figure (with its section's load and the machine) and every raw number."""
    host_line = machine.one_line(host)
    return {
        "started_at": started.isoformat(timespec="seconds"),
        "suite_wall_s": round(wall_s, 1),
        "machine": host,
        "options": asdict(options),
        "sections": {
            s.letter: {
                "title": s.title,
                "load": s.load,
                "error": s.error,
                "figures": [
                    f.to_json() | {"load": s.load, "machine": host_line} for f in s.figures
                ],
                "raw": s.raw,
            }
            for s in sorted(sections, key=lambda s: s.letter)
        },
    }


def options_from(args: argparse.Namespace) -> Options:
    """The sections' options from the command line."""
    budget = args.budget or (QUICK_BUDGET_S if args.quick else FULL_BUDGET_S)
    return Options(args.quick, args.n, args.big_n, runs=args.runs, budget_s=budget)


def main(argv: list[str] | None = None) -> int:
    """Run the chosen sections, print the table, write the JSON."""
    args = parse_args(argv)
    letters = chosen_sections(args.only)
    options = options_from(args)
    scratch = Path(tempfile.mkdtemp(prefix="tg-bench-"))
    host, started = machine.describe(scratch), datetime.now().astimezone()
    host["bytecode_precompiled"] = services.precompile()  # as pip leaves an installed package
    clock = time.monotonic()
    try:
        ctx = Context(options, scratch)
        sections = [run_section(ctx, letter) for letter in letters]
    finally:
        if args.keep:
            print(f"[bench] workspaces and logs kept in {scratch}", file=sys.stderr)
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    wall_s = time.monotonic() - clock
    print(table(sections, host, wall_s))
    if args.json:
        body = report_json(sections, host, options, started, wall_s)
        args.json.write_text(json.dumps(body, indent=1, default=str) + "\n", encoding="utf-8")
    return 1 if any(s.error for s in sections) else 0


if __name__ == "__main__":
    sys.exit(main())
