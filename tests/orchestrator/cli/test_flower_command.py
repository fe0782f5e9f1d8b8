"""`ticketgraph flower` (orchestrator/flowerctl.py) as a real process: it refuses to start
without a broker or a login, and otherwise serves Flower on loopback, its pages and API behind
basic auth and /metrics open.

The run it watches is test_flower.py's: a private Redis, a `ticketgraph worker` subprocess,
the scripted provider and `ticketgraph run` submitting to that broker.
"""

from __future__ import annotations

import ast
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from orchestrator.exit_codes import ExitCode
from tests.conftest import clean_env, state
from tests.orchestrator.cli import test_flower
from tests.orchestrator.cli.test_flower import (
    POLL_S,
    WAIT_S,
    Flower,
    Spawn,
    Spawned,
    _free_port,
    _stop,
    answering,
    watch_demo_run,
)

# test_flower.py's fixtures (private Redis, scripted model, child processes, the worker),
# found by pytest under these names in this module.
broker_url = test_flower.broker_url
model_url = test_flower.model_url
spawn = test_flower.spawn
worker = test_flower.worker

FLOWERCTL = [sys.executable, "-m", "orchestrator.cli", "flower"]  # `ticketgraph flower`
# A comma and a colon: FLOWER_PASSWORD is taken whole, not split as FLOWER_BASIC_AUTH is.
LOGIN = ("ops", "s3cret,with:punctuation")
NOBODY = "redis://127.0.0.1:9/0"  # a broker URL nothing answers: these runs never reach it
PER_TICKET = {"orchestrator.draft", "orchestrator.review"}


@pytest.fixture
def env(broker_url: str, model_url: str) -> dict[str, str]:
    """The broker and the model, and a login for Flower (its API is not opened without one)."""
    return {
        **clean_env("FLOWER_"),
        "TICKETGRAPH_BROKER_URL": broker_url,
        "LLM_BASE_URL": model_url,
        "FLOWER_USER": LOGIN[0],
        "FLOWER_PASSWORD": LOGIN[1],
    }


@pytest.fixture
def flower(spawn: Spawn) -> Iterator[Flower]:
    """`ticketgraph flower` on a free port at its default address, answering; its client logs in."""
    port = _free_port()
    with answering(spawn("flower", [*FLOWERCTL, f"--port={port}"]), port, auth=LOGIN) as ui:
        yield ui


# --- refusals: exit 78, one sentence, nothing listening ------------------------------------


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"TICKETGRAPH_BROKER_URL": NOBODY}, "Flower needs a login: set FLOWER_USER and"),
        ({"TICKETGRAPH_BROKER_URL": NOBODY, "FLOWER_USER": "ops"}, "FLOWER_PASSWORD is not set"),
        ({"FLOWER_USER": LOGIN[0], "FLOWER_PASSWORD": LOGIN[1]}, "set TICKETGRAPH_BROKER_URL"),
    ],
    ids=["no-login", "user-without-password", "no-broker"],
)
def test_refuses_to_start_without_a_broker_or_a_login(settings: dict[str, str], says: str) -> None:
    port = _free_port()
    command = [*FLOWERCTL, f"--port={port}"]
    with subprocess.Popen(
        command,
        env={**clean_env("FLOWER_"), **settings},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as refused:
        heard = _listeners_until_exit(refused, port)
        stdout, stderr = refused.communicate()
    assert refused.returncode == ExitCode.CONFIG, stderr
    assert stderr.startswith(f"ticketgraph flower: {says}") and stderr.count("\n") == 1, stderr
    assert stdout == ""
    assert LOGIN[1] not in stderr
    assert heard == set(), f"listened on {heard} before refusing"


def test_a_taken_port_is_one_sentence_not_a_traceback() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        refused = subprocess.run(
            [*FLOWERCTL, f"--port={port}"],
            env={
                **clean_env("FLOWER_"),
                "TICKETGRAPH_BROKER_URL": NOBODY,
                "FLOWER_BASIC_AUTH": "a:b",
            },
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert refused.returncode == ExitCode.CONFIG, refused.stderr
    assert refused.stderr.splitlines()[-1] == (
        f"ticketgraph flower: cannot listen on 127.0.0.1:{port}: Address already in use"
    ), refused.stderr
    assert "Traceback" not in refused.stderr


# --- serving ------------------------------------------------------------------------------


def test_no_auth_opens_the_pages_but_not_the_api_and_sigterm_exits_0(spawn: Spawn) -> None:
    """--no-auth drops the login from the environment; Flower itself still keeps /api shut
    unless FLOWER_UNAUTHENTICATED_API=true."""
    port = _free_port()
    child = spawn("flower", [*FLOWERCTL, f"--port={port}", "--no-auth"])
    with answering(child, port) as ui:
        assert ui.client.get("/").status_code == 200
        api = ui.client.get("/api/workers")
        assert api.status_code == 401 and "FLOWER_UNAUTHENTICATED_API" in api.text
    _stop(child.process)
    assert child.process.returncode == 0, child.tail()
    assert "no login (--no-auth)" in child.log.read_text()


def test_flower_command_serves_the_run_on_loopback_behind_the_login(
    tmp_path: Path, env: dict[str, str], worker: Spawned, flower: Flower
) -> None:
    port = flower.client.base_url.port
    assert port is not None
    assert _listeners(port) == {"127.0.0.1"}
    assert LOGIN[1] not in Path(f"/proc/{flower.child.process.pid}/cmdline").read_text()
    workspace = tmp_path / "demo"
    with httpx.Client(base_url=flower.client.base_url, timeout=10.0) as anonymous:
        # Watched for the worker without a login: /metrics is open.
        seen = watch_demo_run(workspace, env, worker, flower, Flower(flower.child, anonymous))
        for path in ("/", "/api/workers", "/api/tasks"):
            assert anonymous.get(path).status_code == 401, path
            assert anonymous.get(path, auth=(LOGIN[0], "wrong")).status_code == 401, path
    assert seen.workers[seen.worker]["stats"]["pool"]["max-concurrency"] == 2
    run_dir = str(workspace / "runs" / state(workspace)["run_id"])
    tickets = set(state(workspace)["tickets"])
    for task in seen.tasks.values():
        refs = _references(task)
        assert refs[0] == run_dir and refs[1].isprintable() and len(refs[1]) < 40, task
        assert refs[2:] == ([refs[2]] if task["name"] in PER_TICKET else []), task
        assert set(refs[2:]) <= tickets, task


# --- helpers -------------------------------------------------------------------------------


def _references(task: dict[str, object]) -> list[str]:
    """A task's arguments as Flower shows them, checked to be strings and nothing else."""
    args = ast.literal_eval(str(task["args"]))
    assert ast.literal_eval(str(task["kwargs"])) == {}, task
    assert all(isinstance(a, str) for a in args), task
    return list(args)


def _listeners_until_exit(process: subprocess.Popen[str], port: int) -> set[str]:
    """Every address that listened on `port` while `process` ran (sampled every POLL_S / 10);
    a process still running after WAIT_S is killed by PID (its exit code then fails the test)."""
    heard: set[str] = set()
    deadline = time.monotonic() + WAIT_S
    while process.poll() is None:
        heard |= _listeners(port)
        if time.monotonic() > deadline:
            process.kill()
            break
        time.sleep(POLL_S / 10)
    return heard


def _listeners(port: int) -> set[str]:
    """The addresses with a TCP socket listening on `port`, IPv4 and IPv6 (/proc/net)."""
    found = set()
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for row in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            local, listening = row.split()[1], row.split()[3] == "0A"
            address, hex_port = local.split(":")
            if listening and int(hex_port, 16) == port:
                found.add(_address(address, family))
    return found


def _address(hex_address: str, family: socket.AddressFamily) -> str:
    """/proc/net's address (32-bit words in host order, little-endian here) as text."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return socket.inet_ntop(family, words)
