"""The same graph with a real Redis and workers as separate `ticketgraph worker` processes."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.distributed import MARKER, big_variant
from orchestrator.redis_server import RedisServer
from orchestrator.workspace import CONFIG_FILE, init_demo
from tests.orchestrator.conftest import (
    REFERENCE_NODES,
    REFERENCE_TICKETS,
    Cli,
    demo_scripts,
    node_numbers,
    state,
    ticket_rows,
    worker_processes,
    write_scenarios,
)
from workers.provider import running_provider


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A private Redis, the scripted provider and two worker processes."""
    tmp = tmp_path_factory.mktemp("cluster")
    scripts = demo_scripts()
    scenario = write_scenarios(tmp / "scenarios.yaml", big_variant(scripts) + scripts)
    with RedisServer(tcp=True) as redis, running_provider(scenario) as llm_url:
        env = {"TICKETGRAPH_BROKER_URL": redis.url, "LLM_BASE_URL": llm_url}
        with worker_processes(env, tmp, ["w1", "w2"]):
            yield {**env, "redis_port": str(redis.port)}


def test_workers_on_a_shared_broker_give_the_reference_verdict(
    cluster: dict[str, str], demo: Path, cli: Cli
) -> None:
    env = {k: v for k, v in cluster.items() if k != "redis_port"}
    done = cli("run", cwd=demo, env=env)
    assert done.returncode == 1, done.stderr
    record = state(demo)
    assert node_numbers(record) == REFERENCE_NODES
    assert ticket_rows(record) == REFERENCE_TICKETS


class _Monitor:
    """Every command the Redis server executes, via MONITOR, on a background thread."""

    def __init__(self, port: int) -> None:
        import redis

        self.client = redis.Redis(port=port)
        self.commands: list[str] = []
        self.stopped = False
        self.thread = threading.Thread(target=self._listen, daemon=True)

    def _listen(self) -> None:
        with self.client.monitor() as monitor:
            for item in monitor.listen():
                if self.stopped:
                    return
                self.commands.append(item["command"])

    def __enter__(self) -> _Monitor:
        self.thread.start()
        time.sleep(0.2)
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stopped = True
        self.client.ping()  # wakes the listener so it sees the flag
        self.thread.join(5)
        self.client.close()

    def pushes(self) -> list[str]:
        """LPUSH commands: the task messages kombu put on queues."""
        return [c for c in self.commands if c.startswith("LPUSH")]


def _run_monitored(cluster: dict[str, str], workspace: Path, cli: Cli) -> _Monitor:
    env = {k: v for k, v in cluster.items() if k != "redis_port"}
    with _Monitor(int(cluster["redis_port"])) as monitor:
        done = cli("run", cwd=workspace, env=env)
    assert done.returncode == 1, done.stderr
    return monitor


def test_only_references_cross_the_broker(
    cluster: dict[str, str], tmp_path: Path, cli: Cli
) -> None:
    small, big = tmp_path / "small", tmp_path / "big"
    for root in (small, big):
        init_demo(root)
    config = big / CONFIG_FILE
    config.write_text(config.read_text().replace('model = "demo"', 'model = "big"'))

    normal = _run_monitored(cluster, small, cli)
    heavy = _run_monitored(cluster, big, cli)

    assert (big / "out" / "T-1001.txt").stat().st_size > 100_000
    assert not any(MARKER in c for c in heavy.commands), "draft text went through Redis"
    assert len(normal.pushes()) == len(heavy.pushes()) > 0
    largest = max(map(len, heavy.pushes()))
    # Messages differ only by ids and paths, not by a 100 KB draft.
    assert abs(largest - max(map(len, normal.pushes()))) < 1000
    assert largest < 10_000


def _children(pid: int) -> list[int]:
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


def test_a_worker_process_that_dies_is_replaced(tmp_path: Path) -> None:
    """`ticketgraph worker --processes 2`: a child killed with SIGKILL is started again under
    its name; SIGTERM to the parent stops every child."""
    with RedisServer(tcp=True) as redis:
        env = {"TICKETGRAPH_BROKER_URL": redis.url, "LLM_BASE_URL": "http://127.0.0.1:9/v1"}
        with worker_processes(env, tmp_path, ["r"], processes=2, threads=1) as (parent,):
            first = _children(parent.pid)
            assert len(first) == 2
            os.kill(first[0], signal.SIGKILL)
            log = tmp_path / "r.log"
            deadline = time.monotonic() + 30
            while log.read_text().count(" ready.") < 3:
                assert time.monotonic() < deadline, log.read_text()[-2000:]
                time.sleep(0.05)
            now = _children(parent.pid)
            assert len(now) == 2 and first[0] not in now and first[1] in now
            assert "exited (-9); restarting" in log.read_text()
            parent.terminate()
            assert parent.wait(30) == 0
        assert all(not Path(f"/proc/{pid}").exists() for pid in now)


def test_a_run_with_no_worker_listening_fails_fast_and_claims_nothing(demo: Path, cli: Cli) -> None:
    """A shared broker that no worker listens on: exit 78 within the wait (here 2 s), the
    broker named with its password masked, every ticket still in inbox/."""
    with RedisServer(tcp=True) as redis:
        url = f"redis://:s3cret@127.0.0.1:{redis.port}/0"
        redis.client().config_set("requirepass", "s3cret")
        started = time.monotonic()
        done = cli("run", "--wait-for-workers", "2", cwd=demo, env={"TICKETGRAPH_BROKER_URL": url})
        took = time.monotonic() - started
    assert done.returncode == 78, done.stderr
    assert "no worker answered" in done.stderr and "redis://:**@127.0.0.1" in done.stderr
    assert "s3cret" not in done.stderr
    assert len(list((demo / "inbox").iterdir())) == 6
    assert took < 10  # the bound: fail fast, not after the 3,600 s run timeout
