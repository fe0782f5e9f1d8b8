"""The same graph with a real Redis and workers as separate `ticketgraph worker` processes."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.distributed import MARKER, big_variant, use_big_model
from orchestrator.broker.redis_server import RedisServer, free_port
from orchestrator.config.workspace import init_demo
from tests.conftest import (
    DEMO_SCENARIOS,
    REFERENCE_NODES,
    REFERENCE_TICKETS,
    Cli,
    child_pids,
    demo_scripts,
    node_numbers,
    start_run,
    state,
    ticket_rows,
    variant,
    wait_for,
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
        """LPUSH commands: the task messages kombu put on queues (not the workers' replies to
        a control ping, whose number depends on how many answered in time)."""
        return [
            c for c in self.commands if c.startswith("LPUSH") and ".reply.celery.pidbox" not in c
        ]


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
    use_big_model(big)

    normal = _run_monitored(cluster, small, cli)
    heavy = _run_monitored(cluster, big, cli)

    assert (big / "out" / "T-1001.txt").stat().st_size > 100_000
    assert not any(MARKER in c for c in heavy.commands), "draft text went through Redis"
    assert len(normal.pushes()) == len(heavy.pushes()) > 0
    largest = max(map(len, heavy.pushes()))
    # Messages differ only by ids and paths, not by a 100 KB draft.
    assert abs(largest - max(map(len, normal.pushes()))) < 1000
    assert largest < 10_000


def test_a_worker_process_that_dies_is_replaced(tmp_path: Path) -> None:
    """`ticketgraph worker --processes 2`: a child killed with SIGKILL is started again under
    its name; SIGTERM to the parent stops every child."""
    with RedisServer(tcp=True) as redis:
        env = {"TICKETGRAPH_BROKER_URL": redis.url, "LLM_BASE_URL": "http://127.0.0.1:9/v1"}
        with worker_processes(env, tmp_path, ["r"], processes=2, threads=1) as (parent,):
            first = child_pids(parent.pid)
            assert len(first) == 2
            os.kill(first[0], signal.SIGKILL)
            log = tmp_path / "r.log"
            deadline = time.monotonic() + 30
            while log.read_text().count(" ready.") < 3:
                assert time.monotonic() < deadline, log.read_text()[-2000:]
                time.sleep(0.05)
            now = child_pids(parent.pid)
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
    assert took < 10  # the issue's bound: fail fast, not after the 3,600 s run timeout


def test_a_run_waiting_for_workers_starts_when_one_comes_up_within_the_wait(
    tmp_path: Path, demo: Path
) -> None:
    """`--wait-for-workers 30` on a shared broker no worker listens on yet: a worker started
    a few seconds into the wait is found (a ping sent before it listened never reaches it,
    so the wait keeps asking) and the run ends with the reference verdict."""
    with RedisServer(tcp=True) as redis, running_provider(DEMO_SCENARIOS) as llm_url:
        env = {"TICKETGRAPH_BROKER_URL": redis.url, "LLM_BASE_URL": llm_url}
        log = tmp_path / "run.log"
        run = start_run(demo, env, log, "--wait-for-workers", "30")
        try:
            waiting = "waiting up to 30 s for a worker"
            wait_for(waiting, lambda: waiting in log.read_text() or run.poll() is not None, 30)
            assert run.poll() is None, log.read_text()
            time.sleep(1.5)  # the first long ping is out before any worker listens
            with worker_processes(env, tmp_path, ["late"]):
                assert run.wait(60) == 1, log.read_text()[-3000:]
        finally:
            if run.poll() is None:
                run.kill()
                run.wait()
    assert ticket_rows(state(demo)) == REFERENCE_TICKETS


def test_a_run_that_times_out_stops_and_what_it_queued_pays_nothing(
    tmp_path: Path, demo: Path, cli: Cli
) -> None:
    """One worker thread. Run A's routing call takes 12 s; run B, submitted meanwhile, waits
    in the queue behind it. Both `run --timeout 0.5`: exit 2 (stopped, resumable). A's call
    in flight finishes and is kept but starts nothing more; B's queued route task, taken
    once the thread is free, pays nothing: the provider sees A's one request. `resume` then
    finishes A from its routing, paying for it once."""
    import httpx

    # Long enough for B's command to start and stop its run while the thread is busy, also
    # on a loaded machine (at 3 s, and at 6 s with the suite on 4 processes beside other
    # work, B's run was sometimes still running when the thread freed).
    slow = variant(demo_scripts(), "router", latency_ms=12000)
    scenario = write_scenarios(tmp_path / "slow.yaml", slow)
    queued = tmp_path / "queued"
    init_demo(queued)
    with RedisServer(tcp=True) as redis, running_provider(scenario) as llm_url:
        env = {"TICKETGRAPH_BROKER_URL": redis.url, "LLM_BASE_URL": llm_url}
        stats = llm_url.replace("/v1", "/stats")
        with worker_processes(env, tmp_path, ["w1"], threads=1):
            first = cli("run", "--timeout", "0.5", cwd=demo, env=env)
            second = cli("run", "--timeout", "0.5", cwd=queued, env=env)
            for done in (first, second):
                assert done.returncode == 2, done.stdout + done.stderr
                assert "no verdict after 0.5 s" in done.stdout
            a, b = state(demo), state(queued)
            assert a["status"] == b["status"] == "stopped_early"
            deadline = time.monotonic() + 30  # A's call ends (12 s), then B's task is taken
            while httpx.get(stats).json()["in_flight"] or not _route_done(demo, a["run_id"]):
                assert time.monotonic() < deadline, "the route call never finished"
                time.sleep(0.1)
            time.sleep(1.0)  # B's route task, or a draft of A, would be at the provider by now
            assert httpx.get(stats).json()["requests"] == 1  # A's routing only
            assert not _route_done(queued, b["run_id"]) and redis.client().keys("*draft*") == []
            assert redis.client().llen("celery") == 0  # B's route task was taken, and did nothing
            resumed = cli("resume", a["run_id"], cwd=demo, env=env)
            assert resumed.returncode == 1, resumed.stderr
            assert httpx.get(stats).json()["requests"] == 11  # the reference run's calls
    assert ticket_rows(state(demo)) == REFERENCE_TICKETS


def _route_done(workspace: Path, run_id: str) -> bool:
    route = workspace / "runs" / run_id / "nodes" / "route.json"
    return route.exists() and json.loads(route.read_text())["status"] == "ok"


def test_a_stray_celery_broker_url_does_not_send_workers_elsewhere(
    tmp_path: Path, demo: Path, cli: Cli
) -> None:
    """Celery reads CELERY_BROKER_URL ahead of its own setting; a worker and a run that have
    it pointing at nothing still use TICKETGRAPH_BROKER_URL, and say what they ignored."""
    with RedisServer(tcp=True) as redis, running_provider(DEMO_SCENARIOS) as llm_url:
        env = {
            "TICKETGRAPH_BROKER_URL": redis.url,
            "LLM_BASE_URL": llm_url,
            "CELERY_BROKER_URL": "redis://127.0.0.1:9/0",
        }
        with worker_processes(env, tmp_path, ["stray"]):
            done = cli("run", cwd=demo, env=env)
    assert done.returncode == 1, done.stderr
    assert "CELERY_BROKER_URL ignored" in done.stderr
    assert "CELERY_BROKER_URL ignored" in (tmp_path / "stray.log").read_text()
    assert ticket_rows(state(demo)) == REFERENCE_TICKETS


@contextlib.contextmanager
def _tls_redis(folder: Path) -> Iterator[str]:
    """Debian's redis-server (the wheel's has no TLS) on a free port, TLS only, with a
    certificate from a throwaway CA; yields its `rediss://` URL; stopped by PID."""
    import redis
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_pem.write_to_path(folder / "key.pem")
    cert.cert_chain_pems[0].write_to_path(folder / "cert.pem")
    ca.cert_pem.write_to_path(folder / "ca.pem")
    port = free_port()
    files = {f"--tls-{part}-file": str(folder / f"{name}.pem") for part, name in _TLS_FILES}
    cmd = [TLS_REDIS, "--port", "0", "--tls-port", str(port), "--tls-auth-clients", "no"]
    cmd += [*itertools.chain(*files.items()), "--save", "", "--dir", str(folder)]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    url = f"rediss://127.0.0.1:{port}/0"
    try:
        probe = redis.Redis.from_url(url, ssl_ca_certs=str(folder / "ca.pem"))
        wait_for("the TLS redis-server", lambda: _answers(probe), 10)
        yield url
    finally:
        server.terminate()
        server.wait(10)


def _answers(client: Any) -> bool:
    import redis

    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


TLS_REDIS = "/usr/bin/redis-server"
_TLS_FILES = (("cert", "cert"), ("key", "key"), ("ca-cert", "ca"))


@pytest.mark.skipif(not Path(TLS_REDIS).exists(), reason="no system redis-server with TLS")
def test_a_tls_broker_gets_the_transport_that_judges_on_the_brokers_clock(
    tmp_path: Path, demo: Path, cli: Cli
) -> None:
    """`rediss://` went to stock kombu, whose delivery stamps and restore sweep read the
    worker's clock; now it gets ticketgraph's transport too, over TLS as kombu would: the
    URL's certificate options are used (here with the run's own redis-py clients, which read
    the same URL), and without options kombu's default, no check, with its warning."""
    with _tls_redis(tmp_path) as url, running_provider(DEMO_SCENARIOS) as llm_url:
        checked = f"{url}?ssl_cert_reqs=required&ssl_ca_certs={tmp_path / 'ca.pem'}"
        env = {"TICKETGRAPH_BROKER_URL": checked, "LLM_BASE_URL": llm_url}
        with worker_processes(env, tmp_path, ["checked"]):
            done = cli("run", cwd=demo, env=env)
        with worker_processes({**env, "TICKETGRAPH_BROKER_URL": url}, tmp_path, ["plain"]):
            pass  # ready: its consumer connected over TLS
    assert done.returncode == 1, done.stdout + done.stderr
    assert ticket_rows(state(demo)) == REFERENCE_TICKETS
    for name in ("checked", "plain"):
        log = (tmp_path / f"{name}.log").read_text()
        assert "Connected to orchestrator.broker.transport:Transport://" in log, log[-2000:]
        assert ("insecure SSL" in log) is (name == "plain")
