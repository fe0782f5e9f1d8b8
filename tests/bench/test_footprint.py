"""Section i (a ticket's footprint on Redis and the volume, and the fleet on paper): strace's
lines counted as the section counts them, the estimate's arithmetic, and one quick run of the
section for real (200 tickets, about 15 s). Nothing here asserts a timing."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import estimate, syscalls
from bench.footprint import round_trips, sync_updates
from bench.workload import build

REPO = Path(__file__).resolve().parents[2]
WS = "/ws"

TMP = "runs/r1/.T-1.json.abc123.tmp"
TRACE = f"""\
10 100.000001 openat(AT_FDCWD</ws>, "/venv/json/__init__.py", O_RDONLY) = 3</venv/json/__init__.py>
10 100.000002 openat(AT_FDCWD</elsewhere>, "{TMP}", O_WRONLY|O_CREAT|O_EXCL, 0666 <unfinished ...>
11 100.000003 mkdir("{WS}/ledger", 0777) = -1 EEXIST (File exists)
10 100.000004 <... openat resumed>) = 4</elsewhere/{TMP}>
11 100.000005 openat(AT_FDCWD</x>, "{WS}/runs/r1/run.jsonl", O_WRONLY|O_CREAT|O_APPEND, 0644) = 5
10 100.000006 write(4<{WS}/{TMP}>, "{{\\"ticket\\": \\"T-1\\"}}", 17) = 17
10 100.000006 fsync(4<{WS}/{TMP}>) = 0
11 100.000006 write(1<pipe:[123]>, "{WS}/out/T-1.txt", 16) = 16
10 100.000007 close(4<{WS}/{TMP}>) = 0
10 100.000007 rename("{WS}/{TMP}", "{WS}/runs/r1/T-1.json") = 0
11 100.000007 write(5<{WS}/runs/r1/run.jsonl>, "{{}}\\n", 3) = 3
11 100.000007 close(5<{WS}/runs/r1/run.jsonl>) = 0
12 100.000008 openat(AT_FDCWD</x>, "{WS}/id", O_WRONLY|O_CREAT|O_EXCL, 0644) = -1 EEXIST (exists)
12 100.000009 +++ exited with 0 +++
12 200.000000 fsync(7</ws/late>) = 0
"""


def test_strace_lines_count_on_the_workspace_by_the_paths_they_name(tmp_path: Path) -> None:
    trace = tmp_path / "trace.txt"
    trace.write_text(TRACE.replace("</elsewhere>", f"<{WS}>"))
    calls = syscalls.count(trace, [Path(WS)], until=150.0)
    # The import is not on the workspace although the process's cwd is (AT_FDCWD</ws>).
    assert calls.all == {"openat": 4, "mkdir": 1, "fsync": 1, "rename": 1, "write": 3, "close": 2}
    assert calls.workspace == {
        "openat": 3, "mkdir": 1, "fsync": 1, "rename": 1, "write": 2, "close": 2
    }  # fmt: skip
    assert calls.bytes_written == 17 + 3  # the files', not the pipe's
    assert round_trips(calls) == 6  # an NFS client buffers writes; closes are local on v3
    # run.jsonl was written and closed without a sync: its close is an NFS flush and COMMIT.
    assert calls.close_flushes == 1
    # A relative path counts against its directory descriptor; a split call by its result.
    # The temp file, and run.jsonl: a path opened with O_CREAT for the first time is made.
    assert calls.creates == 2 and calls.maybe_creates == 1
    assert calls.failed["openat"] == 1 and calls.failed["mkdir"] == 1
    assert calls.patterns["rename runs/<run>/.T-#.json.<tmp>.tmp"] == 1
    # Only what succeeded must reach the server's stable storage: the fsync, the close that
    # flushes, the two creates and the rename.
    assert sync_updates(calls) == 5


def test_the_estimate_is_the_per_ticket_footprint_times_the_fleets_throughput(
    tmp_path: Path,
) -> None:
    workload = build(tmp_path / "ws", 60, 0, 16)
    per_ticket: dict[str, float | None] = {
        "redis_commands": 30.0,
        "redis_cpu_ms": 0.2,
        "redis_bytes_in": 1500.0,
        "redis_bytes_out": 500.0,
        "messages": 0.5,
        "syncs_workspace": 7.0,
        "creates_workspace": 8.0,
        "renames_workspace": 9.0,
        "sync_updates_workspace": 24.0,
        "file_bytes_workspace": 5_000.0,
        "opens_workspace": 40.0,
        "calls_workspace": 60.0,
    }
    idle = {"redis_commands": 10.0, "redis_bytes": 1000.0, "redis_cpu_ms": 1.0}
    paper = estimate.fleet(per_ticket, idle, workload, {"SET": 80_000.0, "GET": 90_000.0})
    calls = workload.calls
    per_call = (calls["fanout"] + calls["review"]) / 60
    assert paper.tickets_per_s == pytest.approx(2048 / (per_call * 2.0))
    assert paper.wall_s == pytest.approx(paper.route_s + 100_000 / paper.tickets_per_s)
    demands = {d.key: d for d in paper.demands}
    rate = paper.tickets_per_s
    assert demands["redis_ops"].rate == pytest.approx(30 * rate + 10 * 8)
    assert demands["redis_ops"].capacity == 85_000.0  # the median of the benchmark's tests
    assert demands["redis_mb"].rate == pytest.approx(2000e-6 * rate + 1000e-6 * 8)
    assert demands["sync_updates"].use == pytest.approx(24 * rate / estimate.NFS_SYNCS_S)
    assert "ASSUMPTION" in demands["fsyncs"].source.short
    assert paper.first is demands["sync_updates"]
    ceiling = paper.ceiling()
    assert ceiling is not None and ceiling[0] == pytest.approx(estimate.NFS_SYNCS_S / 24)
    table = paper.markdown()
    assert table.count("\n|") == len(paper.demands) + 2  # a row each, the header, its rule
    assert "First to give out" in table


@pytest.fixture(scope="module")
def section(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    """One quick run of section i: its JSON section and the printed table."""
    out = tmp_path_factory.mktemp("footprint") / "bench.json"
    argv = [sys.executable, "-m", "bench", "--quick", "--only", "i", "--json", str(out)]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(out.read_text())["sections"]["i"], done.stdout


@pytest.mark.timeout(200)
def test_the_footprint_section_measures_redis_files_and_calls_a_ticket(
    section: tuple[dict[str, Any], str],
) -> None:
    body, table = section
    assert body["error"] == "", body["error"]
    figures = {f["key"]: f for f in body["figures"]}
    raw = body["raw"]["footprint"]
    n = raw["tickets"]
    assert n == 200 and raw["run"]["problem"] == ""
    for key in ("redis_commands", "redis_bytes_in", "redis_bytes_out", "files_run"):
        figure = figures[f"i.ticket.{key}"]
        assert figure["value"] > 0 and figure["target"] is None, figure
    # Task messages are kombu's LPUSHes; the commands are INFO's, its own calls apart.
    assert raw["per_ticket"]["messages"] == raw["redis"]["calls"].get("lpush", 0) / n
    assert "info" not in raw["redis"]["calls"]
    assert raw["files_run"] >= 2 * n  # a record and a draft a ticket, at least
    assert raw["written_bytes"] > 0 and raw["worker_written_bytes"] > 0
    if shutil.which("strace"):
        calls = raw["syscalls"]
        assert calls["workspace"]["fsync"] >= n and calls["workspace"]["rename"] >= n
        assert calls["all"]["openat"] > calls["workspace"]["openat"]  # imports are elsewhere
    else:
        assert figures["i.ticket.syncs_workspace"]["verdict"] == "n/a"
    assert "Redis commands a ticket" in table


@pytest.mark.timeout(200)
def test_the_paper_fleet_follows_from_the_measured_figures(
    section: tuple[dict[str, Any], str],
) -> None:
    body, _table = section
    paper, per = body["raw"]["estimate"], body["raw"]["footprint"]["per_ticket"]
    assert paper["tickets_per_s"] == pytest.approx(2048 / (paper["calls_per_ticket"] * 2.0))
    demands = {d["key"]: d for d in paper["demands"]}
    assert demands["messages"]["rate"] == pytest.approx(per["messages"] * paper["tickets_per_s"])
    assert paper["verdict"].startswith("First to give out")
    figures = {f["key"]: f for f in body["figures"]}
    assert figures["i.fleet.wall"]["value"] == pytest.approx(paper["wall_s"], abs=0.1)
