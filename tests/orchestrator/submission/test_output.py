"""What `run`, `resume` and `runs` print, through the real CLI: the live view on a terminal (a
real pseudo-terminal), node lines for cron, --quiet, --log-format json, and the --json
document validated against its documented schema."""

from __future__ import annotations

import contextlib
import io
import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import yaml

from orchestrator.cli.console import Follower, ended_record
from orchestrator.plan.steps import PLAN
from orchestrator.run.records import TicketStatus
from orchestrator.run.store import RunStore
from orchestrator.submission import status
from orchestrator.submission.status import RunDocument, RunRow
from tests.conftest import Cli, clean_env, demo_scripts, settled, state

REPO = Path(__file__).resolve().parents[3]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# The demo's totals (the reference run): 1 + 8 + 2 model calls, 720 + 8,903 + 3,033 tokens.
DEMO_TOTALS = "11 model calls · 12,656 tokens · $0.0386"


def on_a_terminal(args: list[str], cwd: Path, timeout: float = 120) -> tuple[int, str]:
    """Run `ticketgraph ARGS` with stdout and stderr on a pseudo-terminal; (exit, output)."""
    leader, follower = pty.openpty()
    child = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", *args],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=follower,
        stderr=follower,
        env={**clean_env(), "TERM": "xterm-256color", "COLUMNS": "120"},
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    return child.wait(timeout=timeout), b"".join(chunks).decode("utf-8", "replace")


def frames(output: str) -> list[str]:
    """The live view's frames, escape codes removed."""
    return re.findall(r"run run-[\w-]+\r?\nroute.*?s elapsed", ANSI.sub("", output), re.S)


def test_a_terminal_gets_a_live_view_that_moves_while_tickets_are_drafted(demo: Path) -> None:
    """With every model reply slowed to 0.4 s, the view is redrawn during drafting with
    tickets drafted so far, calls and spend growing; its last frame has the run's totals,
    and the report and the verdict line follow."""
    scripts = demo_scripts()
    for script in scripts:
        script["latency_ms"] = 400
    (demo / "scenarios" / "demo.yaml").write_text(yaml.safe_dump(scripts, sort_keys=False))
    code, output = on_a_terminal(["run"], demo)
    assert code == 1, output
    shown = frames(output)
    drafting = [f for f in shown if re.search(r"fanout\s+running", f)]
    drafted = {int(m.group(1)) for f in drafting if (m := re.search(r"\n\s+6\s+(\d)\s", f))}
    assert drafted & {1, 2, 3, 4, 5}, drafting[-1:]  # counts moved between nodes
    elapsed = {m.group(1) for f in drafting if (m := re.search(r"([\d.]+) s elapsed", f))}
    assert len(elapsed) >= 3  # redrawn while nothing ended
    last = shown[-1]
    assert all(re.search(rf"{node}\s+done", last) for node in PLAN.nodes)
    assert DEMO_TOTALS in last
    assert "=== Per ticket ===" in output
    run_id = state(demo)["run_id"]
    assert f"run {run_id}: exit 1, some need a human" in ANSI.sub("", output)


def test_cron_gets_one_line_per_node_then_the_report_and_the_verdict(demo: Path, cli: Cli) -> None:
    done = cli("run", cwd=demo)
    assert done.returncode == 1, done.stderr
    assert "\x1b[" not in done.stdout  # no escape codes in a log file
    nodes = [line for line in done.stdout.splitlines() if line.startswith("[")]
    assert [line.split("]")[0] + "]" for line in nodes] == [
        "[route]",
        "[fanout]",
        "[merge]",
        "[review]",
    ]
    verdict = done.stdout.splitlines()[-1]
    assert verdict == (
        f"run {state(demo)['run_id']}: exit 1, some need a human; 6 tickets: "
        "1 needs_human, 5 pass; $0.0386"
    )


def test_only_a_view_that_shows_the_trace_reads_it(demo: Path, cli: Cli) -> None:
    # Node lines come from run-state.json and --quiet shows nothing as the run goes: the
    # trace (a dozen lines a ticket) is read only for the live view's counts or the JSON logs.
    assert cli("run", "--quiet", cwd=demo).returncode == 1
    store = RunStore(demo / "runs" / state(demo)["run_id"])
    size = store.trace_path.stat().st_size
    read = {}
    for mode, json_logs in (("lines", False), ("quiet", False), ("quiet", True)):
        follow = Follower(store, mode, json_logs=json_logs)
        with contextlib.redirect_stderr(io.StringIO()):
            follow(None)
        read[mode, json_logs] = follow.tail.offset
    assert read == {("lines", False): 0, ("quiet", False): 0, ("quiet", True): size}


def test_the_command_shows_the_run_state_its_end_wrote_and_makes_it_again_if_stale(
    demo: Path, cli: Cli
) -> None:
    # A run that is done got run-state.json from its end: read as it is, not made again from
    # every record. One older than run.json (its end's write lost) is made again.
    assert cli("run", "--quiet", cwd=demo).returncode == 1
    store = RunStore(demo / "runs" / state(demo)["run_id"])
    written = store.state_path.stat().st_ino
    assert ended_record(store).exit_code == 1
    assert store.state_path.stat().st_ino == written
    stale = json.loads(store.state_path.read_text()) | {"updated_at": "2026-01-01T00:00:00.000Z"}
    stale["tickets"]["T-1001"]["status"] = "drafted"
    store.state_path.write_text(json.dumps(stale))
    assert ended_record(store).tickets["T-1001"].status is TicketStatus.PASS
    assert json.loads(store.state_path.read_text())["tickets"]["T-1001"]["status"] == "pass"


def test_quiet_prints_only_the_verdict(demo: Path, cli: Cli) -> None:
    done = cli("run", "--quiet", cwd=demo)
    assert done.returncode == 1, done.stderr
    assert done.stdout.splitlines() == [
        f"run {state(demo)['run_id']}: exit 1, some need a human; 6 tickets: "
        "1 needs_human, 5 pass; $0.0386"
    ]
    assert done.stderr == ""


def test_json_logs_are_the_trace_events_on_stderr(demo: Path, cli: Cli) -> None:
    done = cli("run", "--log-format", "json", cwd=demo)
    assert done.returncode == 1, done.stderr
    logged = [json.loads(line) for line in done.stderr.splitlines()]
    run_id = state(demo)["run_id"]
    trace = demo / "runs" / run_id / "run.jsonl"
    assert logged == [json.loads(line) for line in trace.read_text().splitlines()]
    assert all(e["run_id"] == run_id for e in logged)
    verdicts = {e["ticket"]: e["status"] for e in logged if e["event"] == "verdict"}
    assert verdicts == {f"T-100{i}": "needs_human" if i == 4 else "pass" for i in range(1, 7)}
    assert "[review]" in done.stdout  # stdout is unchanged


def test_run_and_resume_json_documents_follow_the_documented_schema(demo: Path, cli: Cli) -> None:
    stopped = cli("run", "--stop-after", "merge", "--json", cwd=demo)
    assert stopped.returncode == 2, stopped.stderr
    first = RunDocument.model_validate_json(stopped.stdout)
    assert (first.verdict, first.exit_code, first.status) == ("stopped", 2, "stopped_early")
    assert first.record is not None and first.report is None
    resumed = cli("resume", first.run_id or "", "--json", cwd=demo)
    assert resumed.returncode == 1, resumed.stderr
    doc = RunDocument.model_validate_json(resumed.stdout)
    assert (doc.run_id, doc.verdict, doc.exit_code) == (first.run_id, "needs_human", 1)
    assert doc.by_status == {"pass": 5, "needs_human": 1}
    assert round(doc.cost_usd, 4) == 0.0386
    assert doc.record is not None and doc.record.model_dump(mode="json") == state(demo)
    assert (demo / (doc.report or "")).read_text().startswith("=== Graph run summary ===")
    again = cli("run", "--json", cwd=demo)  # inbox/ is empty now
    assert again.returncode == 0
    assert RunDocument.model_validate_json(again.stdout).verdict == "nothing_to_claim"


def test_the_documented_schema_is_the_one_the_code_emits() -> None:
    documented = json.loads((REPO / "docs" / "run-document.schema.json").read_text())
    assert documented == status.schema()


def test_runs_lists_recent_runs_newest_first(demo: Path, cli: Cli) -> None:
    assert cli("runs", cwd=demo).stdout.startswith("no runs under")
    assert cli("run", "--stop-after", "route", cwd=demo).returncode == 2
    stopped = state(demo)["run_id"]
    assert cli("resume", stopped, cwd=demo).returncode == 1
    (demo / "inbox" / "T-2001.txt").write_text("My invoice shows the wrong company name.")
    settled(demo / "inbox" / "T-2001.txt")
    assert cli("run", cwd=demo).returncode in (0, 1)
    newest = state(demo)["run_id"]
    listed = cli("runs", "--json", cwd=demo)
    assert listed.returncode == 0, listed.stderr
    rows = [RunRow.model_validate(row) for row in json.loads(listed.stdout)]
    assert [r.run_id for r in rows] == [newest, stopped]
    assert (rows[1].verdict, rows[1].exit_code, rows[1].tickets, rows[1].need_a_human) == (
        "needs_human",
        1,
        6,
        1,
    )
    assert rows[0].tickets == 1 and all(r.duration_s is not None for r in rows)
    table = cli("runs", "-n", "1", cwd=demo).stdout.splitlines()
    assert len(table) == 2 and table[1].startswith(newest)
