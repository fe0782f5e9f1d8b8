"""README.md stays true: its sample output is what a real run prints, and its many-machines
section runs as written."""

from __future__ import annotations

import contextlib
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from orchestrator.broker.redis_server import RedisServer
from tests.orchestrator.conftest import REFERENCE_TICKETS, Cli, clean_env, state, ticket_rows
from tests.orchestrator.test_flower import _free_port, _stop

README = Path(__file__).resolve().parents[2] / "README.md"
SAMPLE_COMMAND = "    $ ticketgraph run      # output of a real run"
MANY_MACHINES = "spread the work, start to finish with the demo"
TICKETGRAPH = [sys.executable, "-m", "orchestrator.cli"]


def indented_block(after: str) -> list[str]:
    """The README's indented code lines after the line starting with `after` (blank lines
    inside the block kept), without their indent."""
    lines = README.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(after)) + 1
    while not lines[start].startswith("    "):  # the rest of the paragraph, a blank line
        start += 1
    block: list[str] = []
    for line in lines[start:]:
        if line and not line.startswith("    "):
            break
        block.append(line[4:])
    while block and not block[-1]:
        block.pop()
    return block


def normalised(lines: list[str]) -> list[str]:
    """Lines with what differs between runs (times, run ids) replaced."""
    out = []
    for line in lines:
        line = re.sub(r"run-\d{8}-\d{6}-[0-9a-f]{4}", "RUN_ID", line)
        line = re.sub(r"\b\d+ms\b", "Nms", line)
        out.append(re.sub(r"\s+$", "", line))
    return out


def test_the_readme_sample_output_is_what_the_demo_prints(demo: Path, cli: Cli) -> None:
    done = cli("run", cwd=demo)
    assert done.returncode == 1, done.stderr
    shown = normalised(indented_block(SAMPLE_COMMAND))
    printed = normalised(done.stdout.splitlines())
    # Column widths of the time column move with the digits: compare words, not spaces.
    assert [line.split() for line in printed] == [line.split() for line in shown]


def test_the_many_machines_section_runs_as_written(tmp_path: Path) -> None:
    """Each line of the README's many-machines block, with host names, ports and the shared
    folder replaced: exports set the environment, `&` lines start processes (stopped by PID
    after), and the run gives the demo's reference verdict on the two workers, which the
    Flower it started lists behind the README's login."""
    with RedisServer(tcp=True) as redis:
        redis.client().config_set("requirepass", "change-me")
        model_port, flower_port = _free_port(), _free_port()
        places = {
            "redis-host:6379": f"127.0.0.1:{redis.port}",
            "model-host:8400": f"127.0.0.1:{model_port}",
            "--port 8400": f"--port {model_port}",
            "--host 0.0.0.0": "--host 127.0.0.1",
            "--port 5555": f"--port {flower_port}",
            "/shared/tickets": str(tmp_path / "shared" / "tickets"),
        }
        lines = [line for line in indented_block(MANY_MACHINES) if line and line[0] != "#"]
        assert len(lines) == 8, lines
        env = clean_env("FLOWER_")
        with _background() as start:
            for line in lines:
                for written, here in places.items():
                    line = line.replace(written, here)
                if line.startswith("export "):
                    env.update(_assignments(shlex.split(line)[1:])[0])
                    continue
                words = shlex.split(line.removesuffix("&"))
                extra, words = _assignments(words)
                assert words[0] == "ticketgraph", line
                command, child_env = TICKETGRAPH + words[1:], {**env, **extra}
                if line.endswith("&"):
                    start(command, child_env, tmp_path / f"{len(lines)}-{words[1]}.log")
                    continue
                done = subprocess.run(
                    command, env=child_env, capture_output=True, text=True, timeout=180
                )
                last = done
                assert done.returncode in (0, 1), done.stdout + done.stderr
            assert last.returncode == 1, last.stdout + last.stderr  # the demo's verdict
            workspace = Path(places["/shared/tickets"])
            assert ticket_rows(state(workspace)) == REFERENCE_TICKETS
            workers = _flower_workers(flower_port, ("ops", "change-me-too"))
            assert {name.split("-")[0] for name in workers} == {"worker1", "worker2"}


def _assignments(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """Leading NAME=value words as a dict, and the words after them."""
    found: dict[str, str] = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        found[name] = value
    return found, words


@contextlib.contextmanager
def _background() -> Iterator:
    """Start processes that run until the block is left, then stop each by PID."""
    children: list[subprocess.Popen[bytes]] = []

    def start(command: list[str], env: dict[str, str], log: Path) -> None:
        with log.open("wb") as out:
            children.append(
                subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
            )

    try:
        yield start
    finally:
        for child in children:
            _stop(child)


def _flower_workers(port: int, login: tuple[str, str], expected: int = 2) -> list[str]:
    """The worker nodes Flower's API lists, once it answers (it may still be starting) and
    lists `expected` of them: a refresh collects the workers' replies for a second, and a
    busy worker may answer the next one only (what it lists at the deadline otherwise)."""
    deadline = time.monotonic() + 30
    url = f"http://127.0.0.1:{port}/api/workers"
    seen: list[str] = []
    while time.monotonic() < deadline:
        try:
            refused = httpx.get(url, timeout=10)
            answer = httpx.get(url, params={"refresh": 1}, auth=login, timeout=10)
            if answer.status_code == 200 and answer.json():
                assert refused.status_code == 401  # no login, no API
                seen = list(answer.json())
                if len(seen) >= expected:
                    return seen
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    assert seen, "Flower never listed the workers"
    return seen
