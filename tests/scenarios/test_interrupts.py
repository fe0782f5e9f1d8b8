"""Runs stopped by SIGTERM or killed by SIGKILL mid-fan-out, then resumed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import (
    REFERENCE_NODES,
    REFERENCE_TICKETS,
    Cli,
    clean_env,
    demo_scripts,
    embedded_redis_servers,
    node_numbers,
    state,
    ticket_rows,
    write_scenarios,
)
from workers.provider import running_provider

SLOW_MS = 400


def _slow_demo(path: Path) -> Path:
    scripts = demo_scripts()
    for script in scripts:
        script["latency_ms"] = SLOW_MS
    return write_scenarios(path, scripts)


def _start_run(workspace: Path, url: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "run"],
        cwd=workspace,
        env={**clean_env(), "LLM_BASE_URL": url, **env},
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _wait_for_turn(workspace: Path, ticket: str, timeout: float = 30) -> None:
    """Until the first drafting turn of `ticket` is in the trace (its state is on disk)."""
    deadline = time.monotonic() + timeout
    while True:
        trace = workspace / "run.jsonl"
        if trace.exists():
            lines = [json.loads(x) for x in trace.read_text().splitlines() if x.strip()]
            if any(e["event"] == "turn" and e.get("ticket") == ticket for e in lines):
                return
        assert time.monotonic() < deadline, "the run never reached the fan-out"
        time.sleep(0.02)


def _wait_gone(servers: set[str], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while servers & embedded_redis_servers():
        assert time.monotonic() < deadline, "the embedded redis-server outlived its killed parent"
        time.sleep(0.05)


def _server_dirs(servers: set[str]) -> list[Path]:
    """The folders of the redis-servers with these command lines."""
    sockets = (next(a for a in cmd.split() if a.startswith("unixsocket:")) for cmd in servers)
    return [Path(s.removeprefix("unixsocket:")).parent for s in sockets]


def _turns(workspace: Path) -> int:
    lines = (workspace / "run.jsonl").read_text().splitlines()
    return sum(json.loads(x)["event"] == "turn" for x in lines)


def test_sigterm_stops_an_embedded_run_cleanly_and_resume_finishes_it(
    demo: Path, cli: Cli, tmp_path: Path
) -> None:
    with running_provider(_slow_demo(tmp_path / "slow.yaml")) as url:
        run = _start_run(demo, url)
        _wait_for_turn(demo, "T-1001")
        run.send_signal(signal.SIGTERM)
        out, err = run.communicate(timeout=60)
        assert run.returncode == 2, err
        # Quiet: no traceback from a worker's broker connection; the stop is one notice.
        assert "Traceback" not in err and "OperationalError" not in err, err
        assert out.count("[stop] interrupted by a signal") == 1, out
        record = state(demo)
        assert (record["status"], record["error"]) == ("stopped_early", "interrupted by a signal")
        assert "tg-redis" not in subprocess.run(["ps", "ax"], capture_output=True, text=True).stdout

        resumed = cli("resume", record["run_id"], cwd=demo, env={"LLM_BASE_URL": url})
    assert resumed.returncode == 1, resumed.stderr
    assert ticket_rows(state(demo)) == REFERENCE_TICKETS


def test_a_killed_run_resumes_without_paying_twice(
    demo: Path, cli: Cli, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # A temp folder of their own: any embedded Redis started meanwhile (the suite's other
    # tests) sweeps folders of dead owners in its temp folder, this one's too. Short, for
    # the Redis socket's path.
    own_tmp = tempfile.mkdtemp(prefix="tg-")
    request.addfinalizer(lambda: shutil.rmtree(own_tmp, ignore_errors=True))
    with running_provider(_slow_demo(tmp_path / "slow.yaml")) as url:
        stats_url = url.replace("/v1", "/stats")
        run = _start_run(demo, url, TMPDIR=own_tmp)
        _wait_for_turn(demo, "T-1001")
        in_flight = httpx.get(stats_url).json()["in_flight"]
        servers = embedded_redis_servers(parent=run.pid)
        assert len(servers) == 1
        os.kill(run.pid, signal.SIGKILL)
        run.wait(10)
        _wait_gone(servers)  # the embedded redis-server dies with its parent, even by SIGKILL
        left = _server_dirs(servers)
        assert all(d.is_dir() for d in left)  # a killed parent could not remove its folder
        run_id = state(demo)["run_id"]
        resumed = cli("resume", run_id, cwd=demo, env={"LLM_BASE_URL": url, "TMPDIR": own_tmp})
        requests = httpx.get(stats_url).json()["requests"]
    assert resumed.returncode == 1, resumed.stderr
    assert not any(d.exists() for d in left)  # the next embedded Redis swept it: owner dead
    final = state(demo)
    assert ticket_rows(final) == REFERENCE_TICKETS
    # The nodes' counters come from each agent's saved state, so they match the reference.
    assert node_numbers(final) == REFERENCE_NODES
    # Every paid turn is recorded exactly once across both processes: 1 + 8 + 2.
    assert _turns(demo) == 11
    # Only a request in flight at the kill (its reply lost with the process) is paid again.
    assert 11 <= requests <= 11 + in_flight


def test_only_folders_whose_owner_is_gone_are_swept() -> None:
    """A folder naming a dead process goes; one naming a live process, or no owner, stays."""
    from orchestrator import process
    from orchestrator.broker import redis_server

    def folder(owner: str | None) -> Path:
        path = Path(tempfile.mkdtemp(prefix=redis_server.FOLDER_PREFIX))
        if owner is not None:
            (path / redis_server.OWNER_FILE).write_text(owner)
        return path

    dead = subprocess.Popen(["true"])
    dead.wait()
    gone = folder(f"{dead.pid} {process.started(os.getpid())}")
    mine, anonymous = folder(process.me()), folder(None)
    try:
        assert gone in redis_server.sweep_orphans()
        assert not gone.exists() and mine.is_dir() and anonymous.is_dir()
    finally:
        for path in (gone, mine, anonymous):
            shutil.rmtree(path, ignore_errors=True)
