"""Section h (the fleet regime), small: 200 tickets at pool 512 and 2 s a call, ours embedded,
ours on two and on three `ticketgraph worker` processes and the LangGraph peer against one
provider process. Nothing here asserts a timing: the section must run all three, count the requests
each kept in flight at the provider, and report our processes' peak memory, threads and CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import fleet
from orchestrator.broker import embedded

REPO = Path(__file__).resolve().parents[2]
N = 200


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_fleet_section_measures_in_flight_memory_and_threads(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    argv = [sys.executable, "-m", "bench", "--only", "h", "--big-n", str(N), "--json", str(out)]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout + done.stderr
    section = json.loads(out.read_text())["sections"]["h"]
    assert section["error"] == "", section["error"]
    figures = {f["key"]: f for f in section["figures"]}
    keys = ("h.ours.wall", "h.peer.wall", "h.ours_over_langgraph", "h.ours.rss")
    spread = [
        f"h.{layout}{figure}"
        for layout in ("distributed", "three")
        for figure in (".wall", "_over_langgraph", ".rss")
    ]
    for key in (*keys, *spread, "h.ours.cpu_ms_per_ticket"):
        assert figures[key]["value"] is not None and figures[key]["valid"], figures[key]
    # Every ticket's first call goes out at once: the provider saw many in flight from each,
    # never more than there are tickets.
    for key in ("ours", "distributed", "three", "peer"):
        assert N // 2 <= figures[f"h.{key}.in_flight"]["value"] <= N, figures[f"h.{key}.in_flight"]
    assert figures["h.ours.in_flight"]["target"]["bound"] == 512
    for key in ("ours", "distributed", "three"):
        assert figures[f"h.{key}.ideal"]["target"]["bound"] == 0.9
    # The embedded layout's worker processes (pool 512: up to two a core), each waiting on
    # its share of the requests on its threads.
    processes, _threads = embedded.layout(512)
    per_process = N // min(processes, N)
    assert figures["h.ours.threads"]["value"] >= per_process // 2, figures["h.ours.threads"]
    # Each worker starts its threads as tickets come: the busier of the two ran a quarter of
    # the tickets at once, at least.
    assert figures["h.distributed.threads"]["value"] >= N // 4, figures["h.distributed.threads"]
    assert figures["h.three.threads"]["value"] >= N // 6, figures["h.three.threads"]
    for key, processes in (("distributed", 2), ("three", 3)):
        workers = section["raw"][f"{key}_workers"]
        assert len({p["pid"] for p in workers}) >= processes
        assert all(p["peak_rss_mb"] > 0 for p in workers)
    # The pool's 512 threads split over three workers, the first ones taking the remainder.
    assert [spec.threads for spec in fleet.WORKER_LAYOUTS["three"]] == [171, 171, 170]
    assert "ours (embedded): most requests in flight at the provider" in done.stdout
