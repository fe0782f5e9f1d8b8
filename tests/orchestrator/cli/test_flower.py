"""Flower watches a distributed run: a `ticketgraph worker` subprocess, Flower as a subprocess,
a private Redis, the scripted provider, and `ticketgraph run` submitting to that broker.
"""

from __future__ import annotations

import contextlib
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from celery import Celery, states

from orchestrator.broker.redis_server import RedisServer
from tests.conftest import clean_env
from workers.provider import running_provider

REPO = Path(__file__).resolve().parents[3]
DEMO_SCENARIOS = REPO / "orchestrator" / "demo" / "scenarios" / "demo.yaml"

# One run of the six demo tickets: one route, a draft and a review per ticket, one merge and
# one report.
GRAPH_TASKS = {
    "orchestrator.route": 1,
    "orchestrator.draft": 6,
    "orchestrator.merge": 1,
    "orchestrator.review": 6,
    "orchestrator.report": 1,
}
DEMO_EXIT_CODE = 1  # T-1004 needs a human
PROBE_TASK = "celery.accumulate"  # Celery's own: it returns its arguments

# Bounds, not sleeps: every wait polls and returns as soon as its condition holds.
WAIT_S = 30.0
POLL_S = 0.1
RUN_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0

T = TypeVar("T")


@dataclass
class Spawned:
    """A child process and the file its output goes to."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def tail(self, chars: int = 2000) -> str:
        """The end of its output, for failure messages."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return f"--- {self.name} (pid {self.process.pid}) ---\n{text[-chars:]}"

    def assert_alive(self) -> None:
        """Fail at once, with its output, if it has exited."""
        if self.process.poll() is not None:
            pytest.fail(f"{self.name} exited with {self.process.returncode}\n{self.tail()}")


Spawn = Callable[[str, list[str]], Spawned]


# --- fixtures ------------------------------------------------------------------------------


@pytest.fixture
def broker_url() -> Iterator[str]:
    """A private redis-server on a free TCP port, stopped by PID at teardown."""
    with RedisServer(tcp=True) as server:
        yield server.url


@pytest.fixture
def model_url() -> Iterator[str]:
    """The scripted provider serving the demo scenarios, in a background thread."""
    with running_provider(DEMO_SCENARIOS) as url:
        yield url


@pytest.fixture
def spawn(tmp_path: Path, env: dict[str, str]) -> Iterator[Spawn]:
    """Factory: start a child process with `env`, logging to tmp_path; all are stopped by PID
    at teardown, before the broker and the model they use."""
    children: list[Spawned] = []

    def start(name: str, args: list[str]) -> Spawned:
        log = tmp_path / f"{name}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                args, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT
            )
        children.append(Spawned(name, process, log))
        return children[-1]

    try:
        yield start
    finally:
        for child in reversed(children):
            _stop(child.process)


@pytest.fixture
def env(broker_url: str, model_url: str) -> dict[str, str]:
    """This machine's environment minus any ticketgraph settings, plus the broker and model
    (and Flower's API opened without a login)."""
    return {
        **clean_env("FLOWER_"),
        "TICKETGRAPH_BROKER_URL": broker_url,
        "LLM_BASE_URL": model_url,
        "FLOWER_UNAUTHENTICATED_API": "true",
    }


@pytest.fixture
def worker(spawn: Spawn) -> Spawned:
    """`ticketgraph worker`: one process of two threads, named w1-1@<host>."""
    args = ["worker", "--processes", "1", "--threads", "2", "--hostname", "w1"]
    return spawn("worker", [sys.executable, "-m", "orchestrator.cli", *args])


@dataclass
class Flower:
    """A running Flower: its process and an HTTP client for it."""

    child: Spawned
    client: httpx.Client

    def get(self, path: str, **params: Any) -> Any:
        """JSON for /api/*, text otherwise; None while Flower does not answer 200."""
        try:
            response = self.client.get(path, params=params)
        except httpx.TransportError:
            return None
        if response.status_code != 200:
            return None
        return response.json() if path.startswith("/api/") else response.text


@pytest.fixture
def flower(spawn: Spawn, broker_url: str) -> Iterator[Flower]:
    """Flower on a free loopback port with its API open, answering."""
    port = _free_port()
    args = ["--broker=" + broker_url, "flower", f"--port={port}", "--address=127.0.0.1"]
    with answering(spawn("flower", [sys.executable, "-m", "celery", *args]), port) as ui:
        yield ui


@contextlib.contextmanager
def answering(child: Spawned, port: int, auth: tuple[str, str] | None = None) -> Iterator[Flower]:
    """The Flower `child` started on loopback `port`, once it answers /healthcheck, with a
    client (that logs in as `auth`)."""
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", auth=auth, timeout=10.0) as client:
        ui = Flower(child, client)
        _poll(lambda: ui.get("/healthcheck"), lambda text: text == "OK", "Flower", child)
        yield ui


# --- the test ------------------------------------------------------------------------------


def test_flower_sees_the_worker_and_every_graph_task(
    tmp_path: Path, env: dict[str, str], worker: Spawned, flower: Flower
) -> None:
    seen = watch_demo_run(tmp_path / "demo", env, worker, flower)
    name, tasks = seen.worker, seen.tasks
    assert seen.workers[name]["stats"]["pool"]["max-concurrency"] == 2

    graph_tasks = [t for t in tasks.values() if t["name"] in GRAPH_TASKS]
    assert Counter(t["name"] for t in graph_tasks) == GRAPH_TASKS
    failed = [t for t in graph_tasks if t["state"] != states.SUCCESS]
    assert not failed, f"{failed}\n{worker.tail()}"
    assert {t["worker"] for t in graph_tasks} == {name}

    page = flower.client.get("/metrics")
    assert page.headers["content-type"].startswith("text/plain")
    assert "# TYPE flower_events_total counter" in page.text
    succeeded = (
        f'flower_events_total{{task="orchestrator.report",type="task-succeeded",worker="{name}"}}'
    )
    assert succeeded in page.text


# --- helpers -------------------------------------------------------------------------------


@dataclass
class Seen:
    """What Flower's API showed of one demo run: the worker's node name, /api/workers and
    /api/tasks once every graph task had finished."""

    worker: str
    workers: dict[str, Any]
    tasks: dict[str, Any]


def watch_demo_run(
    workspace: Path,
    env: dict[str, str],
    worker: Spawned,
    flower: Flower,
    metrics: Flower | None = None,
) -> Seen:
    """`ticketgraph init` and `run` the demo in `workspace` on `worker`, once `flower` (or the
    `metrics` client of the same Flower) shows it online; then what Flower's API shows."""
    # Task events travel over Redis pub/sub, which drops what nobody listens to: start the
    # run only once Flower has heard the worker, so it hears every task of the run too.
    online = _poll(
        lambda: (metrics or flower).get("/metrics"),
        _worker_online,
        "Flower to see the worker online through its events",
        worker,
        flower.child,
    )
    name = _worker_online(online)
    assert name is not None
    probes = _until_task_events_are_on(env["TICKETGRAPH_BROKER_URL"], flower, worker)

    init = _cli(env, "init", str(workspace))
    assert init.returncode == 0, init.stderr
    run = _cli(env, "run", "--workspace", str(workspace), "--timeout", str(RUN_TIMEOUT_S))
    assert run.returncode == DEMO_EXIT_CODE, f"{run.stdout}\n{run.stderr}\n{worker.tail()}"

    workers = _poll(
        lambda: flower.get("/api/workers", refresh=1),
        lambda found: "stats" in found.get(name, {}),
        f"Flower's /api/workers to list {name}",
        worker,
        flower.child,
    )
    tasks = _poll(
        lambda: flower.get("/api/tasks"),
        lambda found: _finished(found) == GRAPH_TASKS,
        "Flower's /api/tasks to show every graph task finished",
        worker,
        flower.child,
    )
    return Seen(name, workers, {k: v for k, v in tasks.items() if k not in probes})


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`ticketgraph ARGS` as a real subprocess with the broker environment."""
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S + 30,
    )


def _until_task_events_are_on(broker_url: str, flower: Flower, worker: Spawned) -> set[str]:
    """Workers send task events once a monitor asks (broker/app.py): Flower asks every 5 s
    while it runs. Send a probe task (Celery's own `celery.accumulate`) until Flower shows
    one, so the run's tasks are all seen; the ids of the probes sent.

    A probe the worker took while its events were off, and finished once they were on, is
    listed by Flower without its name (it saw only the success): its id tells it apart."""
    sender = Celery(broker=broker_url)
    sent: set[str] = set()
    try:

        def probe() -> dict[str, Any]:
            sent.add(sender.send_task(PROBE_TASK, args=["probe"]).id)
            return flower.get("/api/tasks", taskname=PROBE_TASK)

        _poll(probe, bool, "Flower to turn the worker's task events on", worker, flower.child)
    finally:
        sender.close()
    return sent


def _poll(
    fetch: Callable[[], T | None], done: Callable[[T], Any], what: str, *children: Spawned
) -> T:
    """Fetch until `done` holds, for at most WAIT_S; fail early if one of `children` exited."""
    deadline = time.monotonic() + WAIT_S
    while True:
        value = fetch()
        if value is not None and done(value):
            return value
        for child in children:
            child.assert_alive()
        if time.monotonic() > deadline:
            logs = "\n".join(child.tail() for child in children)
            pytest.fail(f"waited {WAIT_S:.0f} s for {what}; last answer: {value!r:.1000}\n{logs}")
        time.sleep(POLL_S)


def _worker_online(metrics: str) -> str | None:
    """The w1-1 worker's name if Flower's metrics show it online."""
    found = re.search(r'^flower_worker_online\{worker="(w1-1@[^"]+)"\} 1\.0$', metrics, re.M)
    return found.group(1) if found else None


def _finished(tasks: dict[str, Any]) -> Counter[str]:
    """How many tasks of each graph name Flower shows in a final state (success or not)."""
    return Counter(
        t["name"]
        for t in tasks.values()
        if t["name"] in GRAPH_TASKS and t["state"] in states.READY_STATES
    )


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM by PID (a warm shutdown for Celery and Flower); SIGKILL if it lingers."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(STOP_TIMEOUT_S)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_celerys_own_tools_find_the_app_and_the_broker_from_the_environment(
    tmp_path: Path,
) -> None:
    """`celery -A orchestrator inspect ping` with TICKETGRAPH_BROKER_URL alone reaches the
    workers; without it the command refuses rather than trying amqp://localhost."""
    from orchestrator.broker.redis_server import RedisServer
    from tests.conftest import clean_env, worker_processes

    celery = [sys.executable, "-m", "celery", "-A", "orchestrator"]
    with RedisServer(tcp=True) as redis:
        env = {"TICKETGRAPH_BROKER_URL": redis.url, "LLM_BASE_URL": "http://127.0.0.1:9/v1"}
        with worker_processes(env, tmp_path, ["tools"], threads=1):
            ping = subprocess.run(
                [*celery, "inspect", "ping", "--timeout", "5"],
                env={**clean_env(), **env},
                capture_output=True,
                text=True,
                timeout=60,
            )
    assert ping.returncode == 0, ping.stdout + ping.stderr
    assert "tools-1@" in ping.stdout and "pong" in ping.stdout
    refused = subprocess.run(
        [*celery, "report"], env=clean_env(), capture_output=True, text=True, timeout=60
    )
    assert refused.returncode != 0 and "TICKETGRAPH_BROKER_URL" in refused.stderr


@pytest.mark.parametrize("from_the_start", [False, True], ids=["once-asked", "task-events-flag"])
def test_a_worker_sends_task_events_once_a_monitor_asks_or_from_the_start_if_told(
    tmp_path: Path, env: dict[str, str], spawn: Spawn, broker_url: str, from_the_start: bool
) -> None:
    """Task events cost three publishes a ticket: a `ticketgraph worker` sends none until a
    monitor asks (Celery's enable_events, what Flower sends every 5 s), or `--task-events`."""
    args = ["worker", "--processes", "1", "--threads", "2", "--hostname", "w1"]
    flag = ["--task-events"] if from_the_start else []
    worker = spawn("worker", [sys.executable, "-m", "orchestrator.cli", *args, *flag])
    tasks = sum(GRAPH_TASKS.values())
    expected = tasks if from_the_start else 0
    seen = _events_of_a_demo_run(tmp_path / "first", env, worker, broker_url, expected)
    if not from_the_start:
        assert seen == Counter(), seen
        control = Celery(broker=broker_url)
        try:
            replies = control.control.enable_events(reply=True, timeout=10, limit=1)
        finally:
            control.close()
        assert replies, "the worker did not answer enable_events"
        seen = _events_of_a_demo_run(tmp_path / "second", env, worker, broker_url, tasks)
    assert seen["task-received"] == seen["task-started"] == seen["task-succeeded"] == tasks, seen


def _events_of_a_demo_run(
    workspace: Path, env: dict[str, str], worker: Spawned, broker_url: str, expected: int
) -> Counter[str]:
    """Run the demo in `workspace`: the task events a listener on the broker heard meanwhile
    (waiting for `expected` task-succeeded), by type (task-received, task-started, ...)."""
    init = _cli(env, "init", str(workspace))
    assert init.returncode == 0, init.stderr
    with _Listener(broker_url) as heard:
        run = _cli(env, "run", "--workspace", str(workspace), "--timeout", str(RUN_TIMEOUT_S))
        # Events are buffered and sent in batches: wait for the last task's to arrive (a
        # worker sending none would have sent the run's first tasks' long before it ended).
        deadline = time.monotonic() + (WAIT_S if expected else 0)
        while heard.kinds["task-succeeded"] < expected and time.monotonic() < deadline:
            time.sleep(POLL_S)
        time.sleep(1.5)  # one more flush: nothing more, or nothing at all, arrives
    assert run.returncode == DEMO_EXIT_CODE, f"{run.stdout}\n{run.stderr}\n{worker.tail()}"
    return Counter({k: v for k, v in heard.kinds.items() if k.startswith("task-")})


class _Listener:
    """Celery's event receiver on a thread (what Flower runs): listening does not turn a
    worker's events on, only enable_events does."""

    def __init__(self, broker_url: str) -> None:
        self.app = Celery(broker=broker_url)
        self.kinds: Counter[str] = Counter()
        self._listening = threading.Event()
        self._thread = threading.Thread(target=self._listen, daemon=True)
        self._receiver: Any = None

    def _listen(self) -> None:
        with self.app.connection() as connection:
            self._receiver = self.app.events.Receiver(connection, handlers={"*": self._heard})
            for _ in self._receiver.itercapture(limit=None, timeout=None, wakeup=False):
                self._listening.set()

    def _heard(self, event: dict[str, Any]) -> None:
        self.kinds[event["type"]] += 1

    def __enter__(self) -> _Listener:
        self._thread.start()
        assert self._listening.wait(WAIT_S), "the event receiver did not start"
        return self

    def __exit__(self, *_exc: object) -> None:
        self._receiver.should_stop = True
        self._thread.join(WAIT_S)
        self.app.close()
