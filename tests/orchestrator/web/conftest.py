"""Fixtures for the web view's tests: demo workspaces with real runs, `ticketgraph web` as a
real process on a free port, and Debian's chromium driven by Playwright."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from orchestrator.config.workspace import init_demo
from tests.conftest import clean_env

USER, PASSWORD = "ann", "s3cret:with,commas"
LOGIN = {"TICKETGRAPH_WEB_USER": USER, "TICKETGRAPH_WEB_PASSWORD": PASSWORD}
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
NO_CHROMIUM = (
    "the web view's browser tests need Debian's `chromium` package "
    "(apt-get install chromium); .ci/run installs it"
)


def command(*args: str) -> list[str]:
    """`ticketgraph ARGS` as this interpreter runs it."""
    return [sys.executable, "-m", "orchestrator.cli", *args]


def run_cli(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120):
    """`ticketgraph ARGS` in `cwd`, to its end."""
    return subprocess.run(
        command(*args),
        cwd=cwd,
        env={**clean_env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A demo workspace after one real run (the reference run: exit 1, T-1004 needs a
    human), shared by the module's tests, which only read it."""
    root = tmp_path_factory.mktemp("web") / "demo"
    init_demo(root)
    done = run_cli("run", "--quiet", cwd=root)
    assert done.returncode == 1, done.stderr
    return root


def run_id_of(workspace: Path) -> str:
    """The workspace's newest run."""
    return sorted((workspace / "runs").glob("run-*/run.json"))[-1].parent.name


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def web_server(workspace: Path, *extra: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """`ticketgraph web` on a free port as a real process; its base URL. Stopped by PID."""
    port = free_port()
    log = (workspace.parent / f"web-{port}.log").open("w")
    process = subprocess.Popen(
        command("web", "--workspace", str(workspace), "--port", str(port), *extra),
        env={**clean_env(), **LOGIN, **(env or {})},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{url}/metrics", timeout=1)
                break
            except httpx.TransportError:
                if process.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    raise AssertionError(
                        f"ticketgraph web did not start: {Path(log.name).read_text()}"
                    ) from None
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """Debian's chromium, headless, through Playwright (which downloads nothing: it is given
    the executable). Skipped where the package is not installed."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(NO_CHROMIUM)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
        )
        try:
            yield chromium
        finally:
            chromium.close()
