"""Infrastructure faults with real processes: a Redis restart mid-fan-out, a broker outage
under the waiting CLI, and a worker process killed with SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from celery import Celery

from orchestrator.broker.redis_server import RedisServer
from tests.conftest import (
    REFERENCE_TICKETS,
    Cli,
    clean_env,
    demo_scripts,
    start_run,
    state,
    ticket_rows,
    worker_processes,
    write_scenarios,
)
from workers.provider import running_provider

CLEAN_RUN_REQUESTS = 11  # the demo's reference run: 1 route + 8 drafting + 2 review turns
SLOW_MS = 1500  # every model call: long enough to restart Redis with calls in flight


def _stats(llm_url: str) -> dict[str, Any]:
    return dict(httpx.get(llm_url.replace("/v1", "/stats")).json())


def _slow_scenarios(
    tmp: Path,
    latency_ms: float,
    faults: dict[str, list[dict[str, Any]]] | None = None,
    **per_script: float,
) -> Path:
    scripts = demo_scripts()
    for script in scripts:
        script["latency_ms"] = per_script.get(script["name"], latency_ms)
        script["faults"] = script.get("faults", []) + (faults or {}).get(script["name"], [])
    return write_scenarios(tmp / "scenarios.yaml", scripts)


def _wait_for(predicate: Any, timeout: float, what: str) -> float:
    """Poll `predicate` until true; return when it became true (monotonic)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return time.monotonic()


def _drafting(llm_url: str) -> bool:
    """True once two drafting calls are in flight (routing is done)."""
    stats = _stats(llm_url)
    return stats["scripts"].get("router", 0) == 1 and stats["in_flight"] >= 2


@pytest.fixture
def slow_cluster(tmp_path: Path) -> Iterator[tuple[RedisServer, str, dict[str, str]]]:
    """Redis with appendonly, a provider answering in 1.5 s, and two worker processes."""
    scenario = _slow_scenarios(tmp_path, SLOW_MS)
    with RedisServer(tcp=True, appendonly=True) as redis, running_provider(scenario) as llm:
        env = {"TICKETGRAPH_BROKER_URL": redis.url, "LLM_BASE_URL": llm}
        with worker_processes(env, tmp_path, ["f1", "f2"], threads=2):
            yield redis, llm, env


def test_a_redis_restart_mid_fan_out_loses_nothing(
    slow_cluster: tuple[RedisServer, str, dict[str, str]], demo: Path, tmp_path: Path
) -> None:
    """Redis (appendonly) restarts while two drafts are in flight: the workers reconnect, the
    CLI waits it out, and the run ends with the reference verdict and request count (plus at
    most the two requests in flight)."""
    redis, llm, env = slow_cluster
    run = start_run(demo, env, tmp_path / "run.log")
    _wait_for(lambda: _drafting(llm), 60, "drafting to start")
    redis.restart(down_s=1.0)
    assert run.wait(120) == 1, (tmp_path / "run.log").read_text()[-3000:]
    assert ticket_rows(state(demo)) == REFERENCE_TICKETS
    served = _stats(llm)["requests"]
    assert CLEAN_RUN_REQUESTS <= served <= CLEAN_RUN_REQUESTS + 2


def test_a_broker_that_lost_its_data_stops_the_run_and_resume_finishes_it(
    tmp_path: Path, demo: Path, cli: Cli
) -> None:
    """Without appendonly the restart loses the queue: the CLI notices (exit 2, stopped, not
    crashed) and `resume` finishes the run with the reference verdict."""
    scenario = _slow_scenarios(tmp_path, SLOW_MS)
    with RedisServer(tcp=True) as redis, running_provider(scenario) as llm:
        env = {"TICKETGRAPH_BROKER_URL": redis.url, "LLM_BASE_URL": llm}
        with worker_processes(env, tmp_path, ["n1"], threads=2):
            run = start_run(demo, env, tmp_path / "run.log")
            _wait_for(lambda: _drafting(llm), 60, "drafting to start")
            redis.restart(down_s=1.0)
            assert run.wait(120) == 2, (tmp_path / "run.log").read_text()[-3000:]
            assert "lost this run's queued work" in (tmp_path / "run.log").read_text()
            assert state(demo)["status"] == "stopped_early"
            run_id = state(demo)["run_id"]
            # The worker rejoins on Celery's reconnect cadence (2 s, then 4, 6, ... after a
            # failed try): on a loaded machine Redis can still be starting at its first try,
            # and the worker back only after resume's 5 s default wait (seen once in the
            # suite); resume keeps asking until a worker answers, here for up to 30 s.
            resumed = cli("resume", run_id, "--wait", "--wait-for-workers", "30", cwd=demo, env=env)
            assert resumed.returncode == 1, resumed.stdout + resumed.stderr
            assert ticket_rows(state(demo)) == REFERENCE_TICKETS


def test_the_waiting_cli_rides_out_a_broker_outage(
    slow_cluster: tuple[RedisServer, str, dict[str, str]], demo: Path, tmp_path: Path
) -> None:
    """Redis down for 10 s mid-run: the CLI keeps waiting and reports the verdict (exit 1)."""
    redis, llm, env = slow_cluster
    run = start_run(demo, env, tmp_path / "run.log")
    _wait_for(lambda: _drafting(llm), 60, "drafting to start")
    redis.restart(down_s=10.0)
    assert run.wait(180) == 1, (tmp_path / "run.log").read_text()[-3000:]
    assert ticket_rows(state(demo)) == REFERENCE_TICKETS


def test_a_cli_that_gives_up_on_the_broker_exits_75_and_leaves_the_run_running(
    slow_cluster: tuple[RedisServer, str, dict[str, str]], demo: Path, tmp_path: Path
) -> None:
    """With a 2 s outage window and Redis down for 8 s, the CLI exits 75 and says how to check
    on the run, which stays `running`; once Redis is back the workers finish it alone."""
    redis, llm, env = slow_cluster
    log = tmp_path / "run.log"
    run = start_run(demo, {**env, "TICKETGRAPH_BROKER_OUTAGE_S": "2"}, log)
    _wait_for(lambda: _drafting(llm), 60, "drafting to start")
    redis.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    redis.process.wait(10)  # type: ignore[union-attr]
    assert run.wait(60) == 75, log.read_text()[-3000:]
    text = log.read_text()
    assert "unreachable for 2 s" in text and "goes on in the workers" in text
    run_id = state(demo)["run_id"]
    assert json.loads((demo / "runs" / run_id / "run.json").read_text())["status"] == "running"
    redis.start()
    _wait_for(lambda: state(demo)["status"] == "done", 120, "the workers to finish the run")
    assert ticket_rows(state(demo)) == REFERENCE_TICKETS


def _inspect(broker_url: str, what: str, timeout: float = 1.0) -> dict[str, Any]:
    """Every live worker's answer to one of Celery's inspect commands, by worker name."""
    control = Celery(broker=broker_url)
    try:
        return getattr(control.control.inspect(timeout=timeout), what)() or {}
    finally:
        control.close()


def _active(broker_url: str) -> dict[str, list[dict[str, Any]]]:
    """Celery's own view of what every worker is running (remote control over the broker)."""
    return _inspect(broker_url, "active")


def _running(broker_url: str, ticket_id: str) -> list[dict[str, Any]]:
    return [
        task
        for tasks in _active(broker_url).values()
        for task in tasks
        if task["name"] == "orchestrator.draft" and task["args"][2] == ticket_id
    ]


@pytest.mark.timeout(400)  # a 24 s model call by design
def test_a_killed_workers_ticket_comes_back_and_a_slow_one_runs_once(
    tmp_path: Path, demo: Path
) -> None:
    """Two workers of one thread each, with an 8 s visibility timeout and a restore every
    second (the defaults, 30 s and 5 s, bring a ticket back within a minute; these keep the
    suite short, the mechanism is the same). T-1001's first drafting call takes 24 s, three
    timeouts: its message must not be delivered again while its worker lives. The worker
    drafting T-1002 is SIGKILLed mid-call: T-1002 must be delivered again within the
    timeout, a restore interval and the restore lock's expiry (if the dead worker held it),
    plus the time to notice."""
    visibility_s, restore_s = 8, 1
    lock_expiry_s = max(5, 2 * restore_s)  # orchestrator/broker/app.py
    scenario = _slow_scenarios(
        tmp_path,
        60,
        faults={"T-1001#1": [{"turn": 0, "hang_ms": visibility_s * 3000}]},
        **{"T-1002#1": 3_000},
    )
    with RedisServer(tcp=True) as redis, running_provider(scenario) as llm:
        env = {
            "TICKETGRAPH_BROKER_URL": redis.url,
            "LLM_BASE_URL": llm,
            "TICKETGRAPH_VISIBILITY_TIMEOUT_S": str(visibility_s),
            "TICKETGRAPH_RESTORE_INTERVAL_S": str(restore_s),
        }
        with worker_processes(env, tmp_path, ["k1", "k2"], threads=1):
            run = start_run(demo, env, tmp_path / "run.log")
            # The provider counts a script's request when it answers: 1 = T-1002's first turn
            # is done and its second is in flight.
            _wait_for(lambda: _stats(llm)["scripts"].get("T-1002#1") == 1, 60, "T-1002 drafting")
            (victim,) = _running(redis.url, "T-1002")
            (slow,) = _running(redis.url, "T-1001")  # its first delivery
            os.kill(victim["worker_pid"], signal.SIGKILL)
            killed_at = time.monotonic()
            _wait_for(lambda: not _running(redis.url, "T-1002"), 30, "T-1002's worker to die")
            # Redelivered: a live worker runs T-1002's task again (Celery's own view of it).
            back_at = _wait_for(lambda: bool(_running(redis.url, "T-1002")), 90, "redelivery")
            assert back_at - killed_at < visibility_s + restore_s + lock_expiry_s + 6
            assert [t["id"] for t in _running(redis.url, "T-1001")] == [slow["id"]]
            assert run.wait(240) == 1, (tmp_path / "run.log").read_text()[-3000:]
            seen = _stats(llm)
            served = seen["scripts"]
    assert served["T-1001#1"] == 2  # its two turns, each asked once: never delivered twice
    # Turn 1, then turn 2 again after the redelivery: the turn 2 in flight at the kill was
    # abandoned (the dead process's connection closed), never answered.
    assert served["T-1002#1"] == 2 and seen["abandoned"] == 1
    assert ticket_rows(state(demo)) == REFERENCE_TICKETS
    logs = (tmp_path / "k1.log").read_text() + (tmp_path / "k2.log").read_text()
    assert logs.count(f"orchestrator.draft[{slow['id']}] received") == 1


def _transport_options(broker_url: str) -> list[dict[str, Any]]:
    """Each live worker's broker transport options, as it reports its own configuration."""
    confs = _inspect(broker_url, "conf", timeout=2)
    return [dict(conf.get("broker_transport_options") or {}) for conf in confs.values()]


@pytest.mark.timeout(300)
def test_a_worker_killed_holding_the_restore_lock_delays_a_ticket_seconds_not_minutes(
    tmp_path: Path, demo: Path
) -> None:
    """Workers bring back a dead worker's messages under one Redis lock, taken for a few
    milliseconds every restore interval; a worker SIGKILLed inside that window leaves the
    lock to expire (the crash soak hit it once in 30 kills). Here the lock is left held as
    that dead worker leaves it (with the expiry the workers report they set), the worker
    drafting T-1002 is killed, and T-1002 must still come back within visibility timeout +
    that expiry, and the run end with the reference verdicts. kombu's own expiry, 300 s,
    stalled the run for five minutes."""
    scenario = _slow_scenarios(tmp_path, 60, **{"T-1002#1": 3_000})
    with RedisServer(tcp=True) as redis, running_provider(scenario) as llm:
        env = {
            "TICKETGRAPH_BROKER_URL": redis.url,
            "LLM_BASE_URL": llm,
            "TICKETGRAPH_VISIBILITY_TIMEOUT_S": "6",
            "TICKETGRAPH_RESTORE_INTERVAL_S": "1",
        }
        with worker_processes(env, tmp_path, ["m1", "m2"], threads=1):
            options = _transport_options(redis.url)
            assert len(options) == 2
            # What a worker sets when it takes the lock (kombu's default where it sets none).
            expiries = {o.get("unacked_mutex_expire", 300) for o in options}
            (expiry,) = expiries
            run = start_run(demo, env, tmp_path / "run.log")
            _wait_for(lambda: _stats(llm)["scripts"].get("T-1002#1") == 1, 60, "T-1002 drafting")
            (victim,) = _running(redis.url, "T-1002")
            # A worker that died holding the lock: kombu's lock, taken and never released.
            client = redis.client()
            lock = client.lock("unacked_mutex", timeout=expiry)
            assert lock.acquire(blocking=True, blocking_timeout=5)  # between two restores
            os.kill(victim["worker_pid"], signal.SIGKILL)
            killed_at = time.monotonic()
            _wait_for(lambda: not _running(redis.url, "T-1002"), 30, "T-1002's worker to die")
            back_at = _wait_for(lambda: bool(_running(redis.url, "T-1002")), 90, "redelivery")
            assert back_at - killed_at < 6 + expiry + 10
            assert run.wait(120) == 1, (tmp_path / "run.log").read_text()[-3000:]
    assert expiry <= 10
    assert ticket_rows(state(demo)) == REFERENCE_TICKETS


def test_stopping_workers_again_after_a_failed_stop_closes_only_their_own_pipes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A stop that fails half way (here: reaping the second process) is followed by the
    cluster's second stop. The first child's pipe was closed already; closing its number
    again closed whatever file had been given that number since, or failed with EBADF."""
    from orchestrator.broker import worker_processes as wp

    fleet = wp.Fleet(app=Celery("t"), threads=1)
    for name in ("a", "b"):
        read_fd, write_fd = os.pipe()
        os.close(write_fd)
        child = subprocess.Popen(["sleep", "60"])
        fleet.children.append(wp.Child(child.pid, name, read_fd))
    reap, calls = wp._reap, []

    def fails_on_the_second(pid: int, deadline: float | None) -> bool:
        calls.append(pid)
        if len(calls) == 2:
            raise OSError("reaping failed")
        return reap(pid, deadline)

    monkeypatch.setattr(wp, "_reap", fails_on_the_second)
    with pytest.raises(OSError, match="reaping failed"):
        fleet.stop(graceful=False)
    first = fleet.children[0]
    someone_elses = os.open(tmp_path / "another file", os.O_RDWR | os.O_CREAT)
    try:
        fleet.stop(graceful=False)  # what the cluster's outer `finally` does
        os.fstat(someone_elses)  # still open: the stop closed only what it owned
    finally:
        os.close(someone_elses)
    assert fleet.children == [] and first.ready_fd == -1
    with pytest.raises(ProcessLookupError):  # the first child was reaped by the first stop
        os.kill(calls[0], 0)


def test_a_failure_after_the_verdict_leaves_the_verdict(demo: Path) -> None:
    """The embedded cluster fails while it is torn down, after the report recorded exit 1:
    the run stays `done` with exit 1 (the failure is said on stderr), not crashed."""
    failing_stop = (
        "import errno, sys\n"
        "from orchestrator.broker import worker_processes as wp\n"
        "stop = wp.Fleet.stop\n"
        "def failing(self, *a, **k):\n"
        "    stop(self, *a, **k)\n"
        "    raise OSError(errno.EBADF, 'Bad file descriptor')\n"
        "wp.Fleet.stop = failing\n"
        "from orchestrator.cli.main import main\n"
        "sys.argv = ['ticketgraph', 'run']\n"
        "raise SystemExit(main())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", failing_stop],
        cwd=demo,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    record = state(demo)
    assert done.returncode == 1, done.stderr
    assert record["status"] == "done" and record["exit_code"] == 1
    assert ticket_rows(record) == REFERENCE_TICKETS
    assert "ended: OSError: [Errno 9] Bad file descriptor" in done.stderr
    trace = (demo / "run.jsonl").read_text()
    assert "run_crashed" not in trace
