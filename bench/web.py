"""Section g: the web view's server time for its two large pages.

One real demo run (`ticketgraph init` + `ticketgraph run`) gives the files; its run folder is
then copied, as the run would have written them, into
  - a run of 10,000 tickets (each of the six tickets' records cloned, run-state.json
    materialised with all of them), once ended and once live (run.json says running, so the
    page reads records/, one file per ticket), and
  - 1,000 ended runs (the demo run's folder under 1,000 run ids), and
  - a workspace whose queue holds 10,000 waiting items (/queue): an ended run whose every
    ticket needs a person (the demo's needs_human record, T-1004's, cloned).
The application (`orchestrator.web.app`) then serves the pages in this process through
Starlette's TestClient: the time from request to the last byte of the response, first on a
fresh application in a fresh process (nothing cached: every file read; the median of five
such processes) and then again, each time after the
catalog's LIVE_TTL_S (what the live page's 1 s refresh costs: a live run's records/ scanned
again, changed files re-read). Target: under 300 ms each (issue 20; the queue: issue 48),
at the default page size.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.figures import Figure, Target, rounded
from bench.services import child_env, ticketgraph
from bench.suite import Context, Section
from orchestrator.run import waitlist
from orchestrator.run.store import RunStore
from workers import versions

TARGET_MS = 300.0
BIG_RUN = "run-20261201-000000-big0"
LIVE_RUN = "run-20261201-000000-live"
QUEUE_RUN = "run-20261201-000000-queu"


def demo_run(root: Path) -> Path:
    """A demo workspace with one finished real run; the run's folder."""
    subprocess.run(ticketgraph("init", str(root)), env=child_env(), check=True, capture_output=True)
    subprocess.run(
        ticketgraph("run", "--quiet"), cwd=root, env=child_env(), capture_output=True, check=False
    )
    return sorted((root / "runs").glob("run-*/run.json"))[-1].parent


def big_run(
    source: Path,
    runs_dir: Path,
    run_id: str,
    n: int,
    live: bool = False,
    status: str | None = None,
) -> Path:
    """A copy of `source` with `n` tickets (its records cloned as T-00001...), ended (with
    run-state.json and waitlist.json) or `live` (run.json running, no run-state.json);
    `status`: only the records of that status are cloned."""
    target = runs_dir / run_id
    (target / "records").mkdir(parents=True)
    shutil.copytree(source / "nodes", target / "nodes")
    records = [versions.read_json(p) for p in sorted((source / "records").glob("*.json"))]
    records = [r for r in records if status in (None, r["status"])]
    tickets: dict[str, Any] = {}
    for k in range(n):
        ticket_id = f"T-{k + 1:05d}"
        record = records[k % len(records)]
        tickets[ticket_id] = record
        (target / "records" / f"{ticket_id}.json").write_text(json.dumps(record))
    meta = json.loads((source / "run.json").read_bytes())
    meta["run_id"] = run_id
    if live:
        meta.update(status="running", exit_code=None, totals=None)
    else:
        counts: dict[str, int] = {}
        for record in tickets.values():
            counts[record["status"]] = counts.get(record["status"], 0) + 1
        meta["totals"] = dict(meta.get("totals") or {}, tickets=n, by_status=counts)
    (target / "run.json").write_text(json.dumps(meta))
    if not live:
        state = json.loads((source / "run-state.json").read_bytes())
        state.update(meta, tickets=tickets)
        (target / "run-state.json").write_text(json.dumps(state))
        waitlist.write(RunStore(target))  # as the run's end writes it (run/ending.py)
    return target


def many_runs(source: Path, runs_dir: Path, count: int) -> list[str]:
    """`count` copies of the ended run `source` under new run ids; their ids."""
    made = []
    for k in range(count):
        run_id = f"run-20261101-{k // 3600:02d}{k // 60 % 60:02d}{k % 60:02d}-{k % 65536:04x}"
        target = runs_dir / run_id
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("agents", "run.jsonl"))
        meta = json.loads((target / "run.json").read_bytes())
        meta["run_id"] = run_id
        (target / "run.json").write_text(json.dumps(meta))
        made.append(run_id)
    return made


def timed_get(client: Any, url: str) -> float:
    """Milliseconds to fetch `url` to its last byte (an error status raises)."""
    clock = time.perf_counter()
    response = client.get(url)
    elapsed = (time.perf_counter() - clock) * 1000
    response.raise_for_status()
    return elapsed


# One page's first request in a process of its own: what a process keeps from an earlier
# application (route's decisions, parsed once a process) would make a second one warm.
_COLD = """
import sys
from pathlib import Path
from starlette.testclient import TestClient
from bench.web import timed_get
from orchestrator.config.workspace import Workspace
from orchestrator.web.app import application
with TestClient(application(Workspace(Path(sys.argv[1])), read_only=True)) as client:
    print(timed_get(client, sys.argv[2]))
"""


def cold_ms(workspace: Path, url: str) -> float:
    """The first request of `url` on a fresh application in a fresh process, in ms."""
    done = subprocess.run(
        [sys.executable, "-c", _COLD, str(workspace), url],
        env=child_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    return float(done.stdout.split()[-1])


def measure(workspace: Path, url: str, repeats: int, colds: int) -> dict[str, Any]:
    """Cold (the median of `colds` fresh processes' first request: one is a single sample
    of a noisy machine) and warm (again, `repeats` times) times of one page."""
    from starlette.testclient import TestClient

    from orchestrator.config.workspace import Workspace
    from orchestrator.web.app import application
    from orchestrator.web.catalog import LIVE_TTL_S

    cold_all = [round(cold_ms(workspace, url), 1) for _ in range(colds)]
    with TestClient(application(Workspace(workspace), read_only=True)) as client:
        timed_get(client, url)  # its first request: the cold figure is the processes' above
        warm = []
        for _ in range(repeats):
            time.sleep(LIVE_TTL_S + 0.05)  # past the live view's reuse: a real re-read
            warm.append(timed_get(client, url))
        size = len(client.get(url).content)
    cold = statistics.median(cold_all)
    return {"cold_ms": round(cold, 1), "cold_all_ms": cold_all, "warm_ms": warm, "bytes": size}


def run(ctx: Context, section: Section) -> None:
    """Build the workspaces, then time the pages."""
    n, count = (2000, 200) if ctx.options.quick else (10_000, 1_000)
    section.title = (
        f"web view: server time, {n:,}-ticket run page, {count:,}-run list and {n:,}-item queue"
    )
    root = ctx.folder("g-web")
    source = demo_run(root)
    big = ctx.folder("g-big")
    os.makedirs(big / "runs")
    big_run(source, big / "runs", BIG_RUN, n)
    big_run(source, big / "runs", LIVE_RUN, n, live=True)
    shutil.copy(root / "ticketgraph.toml", big / "ticketgraph.toml")
    lots = ctx.folder("g-runs")
    os.makedirs(lots / "runs")
    many_runs(source, lots / "runs", count)
    waiting = ctx.folder("g-queue")
    os.makedirs(waiting / "runs")
    big_run(source, waiting / "runs", QUEUE_RUN, n, status="needs_human")
    shutil.copy(root / "ticketgraph.toml", waiting / "ticketgraph.toml")
    repeats = ctx.options.runs_or(10, quick=3)
    colds = ctx.options.runs_or(5, quick=1)
    pages = {
        "run_page": (big, f"/runs/{BIG_RUN}"),
        "live_run_page": (big, f"/runs/{LIVE_RUN}"),
        "run_list": (lots, "/"),
        "queue_page": (waiting, "/queue"),
    }
    for key, (workspace, url) in pages.items():
        got = measure(workspace, url, repeats, colds)
        section.raw[key] = got
        warm = statistics.median(got["warm_ms"])
        label = {
            "run_page": f"a {n:,}-ticket run's page (ended)",
            "live_run_page": f"a {n:,}-ticket run's page (live: records/)",
            "run_list": f"the list of {count:,} runs",
            "queue_page": f"the queue of {n:,} waiting tickets",
        }[key]
        target = Target("<", TARGET_MS, f"< {TARGET_MS:.0f} ms")
        section.add(
            Figure(
                f"{key}_cold_ms",
                f"{label}, first request (median of {colds} processes)",
                rounded(got["cold_ms"], 1),
                "ms",
                target,
                note=f"{got['bytes']:,} bytes",
            ),
            Figure(
                f"{key}_warm_ms",
                f"{label}, again (median of {repeats})",
                rounded(warm, 1),
                "ms",
                target,
            ),
        )
