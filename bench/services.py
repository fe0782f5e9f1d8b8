"""The processes a benchmark runs beside the command it measures, each stopped by its PID.

- `Provider`: the scripted provider as its own process (`python -m workers.provider.server`),
  with its /stats: requests served and the CPU seconds of the whole provider process.
- `Workers`: `ticketgraph worker` processes on a shared broker, ready when each has printed
  "ticketgraph worker ready:".
- `Monitor`: every command a Redis server runs, via MONITOR on a background thread.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import redis

from bench.watch import children
from orchestrator.broker.redis_server import free_port

REPO = Path(__file__).resolve().parents[1]
READY_LINE = "ticketgraph worker ready:"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
LOOPBACK = "127.0.0.1"


PACKAGES = ("orchestrator", "workers", "bench")  # what `ticketgraph` runs from this checkout


def precompile() -> bool:
    """Byte-compile this checkout's packages before anything is measured; True if every
    module compiled.

    pip compiles an installed package's modules when it installs them (the LangGraph peer's
    are), but this checkout's are compiled on first import, and never where
    PYTHONDONTWRITEBYTECODE is set (as on the machines the bench runs on): there every
    measured `ticketgraph` process compiled ~100 modules from source, 0.1-0.2 s of the
    demo's whole command. A user's second run reads the bytecode; so does the bench.
    """
    return all(compileall.compile_dir(REPO / name, quiet=1) for name in PACKAGES)


def child_env(**extra: str) -> dict[str, str]:
    """This environment without ticketgraph's settings, with the repository importable."""
    drop = ("TICKETGRAPH_", "LLM_")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(drop) and k not in ("POOL_SIZE", "STOP_AFTER")
    }
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{path}" if path else str(REPO)
    return env | extra


def ticketgraph(*args: str) -> list[str]:
    """The argv of `ticketgraph ARGS` with this interpreter."""
    return [sys.executable, "-m", "orchestrator.cli", *args]


def stop_process(proc: subprocess.Popen[bytes], timeout: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM by PID, then SIGKILL if it outlives `timeout`; reap it."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout)


class Provider:
    """The scripted provider serving `scenarios` in its own process on a free port."""

    def __init__(self, scenarios: Path | str, log: Path, args: list[str] | None = None) -> None:
        self.scenarios, self.log, self.args = scenarios, log, args or []
        self.port = free_port()
        self.url = f"http://{LOOPBACK}:{self.port}/v1"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Provider:
        cmd = [sys.executable, "-m", "workers.provider.server"]
        cmd += ["--scenarios", str(self.scenarios), "--port", str(self.port), "--host", LOOPBACK]
        cmd += self.args
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(cmd, env=child_env(), stdout=log, stderr=log)
        try:
            self._wait_healthy()
        except BaseException:
            stop_process(self.proc)
            raise
        return self

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                httpx.get(f"http://{LOOPBACK}:{self.port}/healthz", timeout=1).raise_for_status()
                return
            except httpx.HTTPError:
                if self.proc is None or self.proc.poll() is not None or time.monotonic() > deadline:
                    tail = self.log.read_text(errors="replace")[-500:]
                    raise RuntimeError(f"the scripted provider did not start: {tail}") from None
                time.sleep(0.05)

    def stats(self, reset: bool = False) -> dict[str, Any]:
        """GET /stats (or POST /stats/reset first): requests, in flight, tokens, `cpu_s`."""
        url = f"http://{LOOPBACK}:{self.port}/stats"
        response = httpx.post(f"{url}/reset", timeout=10) if reset else httpx.get(url, timeout=10)
        response.raise_for_status()
        return dict(response.json())

    @contextlib.contextmanager
    def metered(self) -> Iterator[Meter]:
        """Zero the stats, run the block, then fill the meter with what it cost the provider."""
        meter = Meter()
        before = self.stats(reset=True)  # zeroes max_in_flight too, so it is this block's
        yield meter
        meter.cost = provider_cost(before, self.stats())

    def __exit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        if self.proc is not None:
            stop_process(self.proc)


@dataclass(frozen=True)
class ProviderCost:
    """What the provider spent on a stretch of requests: /stats before and after."""

    requests: int
    cpu_s: float
    max_in_flight: int

    @property
    def cpu_ms_per_request(self) -> float | None:
        """Provider CPU per chat-completions request, in ms."""
        return 1000 * self.cpu_s / self.requests if self.requests else None

    def to_json(self) -> dict[str, Any]:
        """The counts and the per-request CPU."""
        per = self.cpu_ms_per_request
        return {
            "requests": self.requests,
            "cpu_s": round(self.cpu_s, 3),
            "cpu_ms_per_request": None if per is None else round(per, 3),
            "max_in_flight": self.max_in_flight,
        }


@dataclass
class Meter:
    """Filled by `Provider.metered` when its block ends."""

    cost: ProviderCost = field(default_factory=lambda: ProviderCost(0, 0.0, 0))


def provider_cost(before: dict[str, Any], after: dict[str, Any]) -> ProviderCost:
    """The difference of two /stats snapshots (no reset between them)."""
    return ProviderCost(
        after["requests"] - before["requests"],
        after["cpu_s"] - before["cpu_s"],
        after["max_in_flight"],
    )


@dataclass(frozen=True)
class WorkerSpec:
    """One `ticketgraph worker` process: its name, processes and threads."""

    name: str
    processes: int
    threads: int


class Workers:
    """`ticketgraph worker` processes with `env`, ready to take tasks; stopped by PID after.

    `wrap` puts a command in front of each worker's (strace, bench/syscalls.py): the worker
    is then the wrapper's child, and it is the worker that is sent SIGTERM.
    """

    def __init__(
        self,
        specs: list[WorkerSpec],
        env: dict[str, str],
        logs: Path,
        wrap: Callable[[WorkerSpec], list[str]] | None = None,
    ) -> None:
        self.specs, self.env, self.logs, self.wrap = specs, env, logs, wrap
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Workers:
        self.logs.mkdir(parents=True, exist_ok=True)
        try:
            for spec in self.specs:
                self.procs.append(self._start(spec))
            for proc, spec in zip(self.procs, self.specs, strict=True):
                self._wait_ready(proc, self.logs / f"{spec.name}.log")
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, spec: WorkerSpec) -> subprocess.Popen[bytes]:
        cmd = ticketgraph("worker", "--hostname", spec.name, "--loglevel", "WARNING")
        cmd += ["--processes", str(spec.processes), "--threads", str(spec.threads)]
        cmd = [*self.wrap(spec), *cmd] if self.wrap else cmd
        with (self.logs / f"{spec.name}.log").open("wb") as log:
            return subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT)

    def _wait_ready(self, proc: subprocess.Popen[bytes], log: Path) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while READY_LINE not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-800:]
                raise RuntimeError(f"worker {log.stem} not ready (exit {proc.poll()}): {tail}")
            time.sleep(0.05)

    @property
    def pids(self) -> list[int]:
        """PIDs of the `ticketgraph worker` parents (the wrappers' children, when wrapped)."""
        if self.wrap is None:
            return [p.pid for p in self.procs]
        return [pid for p in self.procs for pid in children(p.pid)[:1]]

    def stop(self) -> None:
        """SIGTERM every worker (warm shutdown), SIGKILL any that outlives the timeout."""
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        for proc in self.procs:
            stop_process(proc)
        self.procs.clear()

    def __exit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self.stop()


class Monitor:
    """Every command a Redis server executes, collected by MONITOR on a background thread."""

    def __init__(self, port: int) -> None:
        self.client = redis.Redis(host=LOOPBACK, port=port)
        self.commands: list[str] = []
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._listen, name="redis-monitor", daemon=True)

    def _listen(self) -> None:
        with self.client.monitor() as monitor:
            for item in monitor.listen():
                if self._stopped.is_set():
                    return
                self.commands.append(item["command"])

    def __enter__(self) -> Monitor:
        self._thread.start()
        deadline = time.monotonic() + 5
        while not self.commands and time.monotonic() < deadline:
            self.client.ping()  # MONITOR is on once it sees this PING
            time.sleep(0.02)
        return self

    def __exit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self._stopped.set()
        self.client.ping()  # wakes the listener so it sees the flag
        self._thread.join(5)
        self.client.close()

    def pushes(self) -> list[bytes]:
        """The values of every LPUSH (kombu's task messages), UTF-8 encoded."""
        values = []
        for command in self.commands:
            parts = command.split(" ", 2)  # LPUSH key value (kombu pushes one at a time)
            if parts[0].upper() == "LPUSH" and len(parts) == 3:
                values.append(parts[2].encode())
        return values


def add_folder_option(parser: argparse.ArgumentParser) -> None:
    """A soak's `--folder`, checked after parsing by `trials_folder`."""
    parser.add_argument(
        "--folder",
        type=Path,
        help="an absent or empty folder for the trials (default: a new temporary folder)",
    )


def trials_folder(parser: argparse.ArgumentParser, folder: Path | None, name: str) -> Path:
    """Where a soak's trials go: `folder` if absent or empty (a reused one would hand its
    trials old workspaces), else a new temporary folder; printed either way."""
    if folder is None:
        folder = Path(tempfile.mkdtemp(prefix=f"ticketgraph-{name}-"))
    elif folder.exists() and any(folder.iterdir()):
        parser.error(f"--folder {folder} is not empty: its trials' workspaces would be reused")
    print(f"{name} folder: {folder}", flush=True)
    return folder
