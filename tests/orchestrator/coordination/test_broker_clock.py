"""Workers whose wall clocks are wrong: what decides that a message is held is Redis's clock.

Real parts: a private Redis, the scripted provider, three `ticketgraph worker` processes,
two of them under Debian's libfaketime, one 120 s ahead and one 120 s behind, and `run` as
a subprocess. Before the fix (issue 45) the ahead worker's restore sweep brought back the
others' live tasks and the behind worker's deliveries and beats were stamped "long ago":
8 of 19 task messages delivered twice in a 24-ticket run, 8 paid requests too many.

libfaketime is loaded the way the `faketime` command loads it (LD_PRELOAD and FAKETIME), so
the worker is this test's own child, stopped by its PID. FAKETIME_DONT_FAKE_MONOTONIC=1:
a skewed wall clock leaves the monotonic one alone, and so must the fake. With monotonic
faked too, libfaketime 0.9.10 shifts it to the faked epoch, and Python's timed lock waits
(`sem_clockwait` on CLOCK_MONOTONIC, which it does not intercept) wait for decades: the
heartbeat thread and a warm shutdown hang. The price: `time.sleep` raises EINVAL under it
(its `clock_nanosleep` intercept shifts the absolute monotonic deadline below zero), so the
run has no budget and no endpoint cap, whose lease renewer sleeps.
"""

from __future__ import annotations

import collections
import glob
import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.workload import build
from orchestrator.broker.redis_server import RedisServer
from tests.conftest import Cli, worker_processes
from workers.provider import running_provider

LIBFAKETIME = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
SKEW_S = 120
RECEIVED = re.compile(r"Task \S+\[([0-9a-f-]+)\] received")
LOGGED_AT = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+: ", re.M)


def _skewed(offset_s: int) -> dict[str, str]:
    """The environment that runs a process on a wall clock `offset_s` off."""
    return {
        "LD_PRELOAD": LIBFAKETIME[0],
        "FAKETIME": f"{offset_s:+d}s",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }


def _first_logged_at(log: Path) -> datetime:
    """When a worker's log says its first line was written, by the worker's own clock."""
    found = LOGGED_AT.search(log.read_text())
    assert found, log.read_text()[-2000:]
    return datetime.strptime(found[1], "%Y-%m-%d %H:%M:%S")


@pytest.mark.skipif(not LIBFAKETIME, reason="Debian's libfaketime is not installed")
def test_workers_whose_clocks_are_minutes_off_take_no_live_task_twice(
    tmp_path: Path, cli: Cli
) -> None:
    workload = build(tmp_path / "ws", 24, latency_ms=300, pool_size=8)
    scenario = workload.root / "scenarios" / "demo.yaml"
    names = ["right", "ahead", "behind"]
    with RedisServer(tcp=True) as redis, running_provider(scenario) as llm:
        env = {
            "TICKETGRAPH_BROKER_URL": redis.url,
            "LLM_BASE_URL": llm,
            # The timeouts the other fleet tests use: a beat every 1.3 s, a sweep every second.
            "TICKETGRAPH_VISIBILITY_TIMEOUT_S": "4",
            "TICKETGRAPH_RESTORE_INTERVAL_S": "1",
        }
        with (
            worker_processes(env, tmp_path, names[:1], threads=4),
            worker_processes({**env, **_skewed(SKEW_S)}, tmp_path, names[1:2], threads=4),
            worker_processes({**env, **_skewed(-SKEW_S)}, tmp_path, names[2:], threads=4),
        ):
            done = cli("run", "--quiet", cwd=workload.root, env=env, timeout=300)
            served = httpx.get(llm.replace("/v1", "/stats")).json()
    assert done.returncode == 1, done.stdout + done.stderr  # clones of T-1004 need a human

    logs = {name: tmp_path / f"{name}.log" for name in names}
    right_at = _first_logged_at(logs["right"])
    # The fakes took: each skewed worker wrote its log on its own clock, minutes off.
    assert (_first_logged_at(logs["ahead"]) - right_at).total_seconds() > SKEW_S / 2
    assert (_first_logged_at(logs["behind"]) - right_at).total_seconds() < -SKEW_S / 2

    received = {name: RECEIVED.findall(log.read_text()) for name, log in logs.items()}
    assert received["ahead"] and received["behind"], received  # both took tasks
    every = collections.Counter(tag for ids in received.values() for tag in ids)
    assert [tag for tag, n in every.items() if n > 1] == []  # no message delivered twice

    events = _events(workload.root)
    taken = collections.Counter((e["node"], e["ticket"]) for e in events if e["event"] == "taken")
    assert set(taken.values()) == {1}
    assert [e for e in events if e["event"] == "superseded"] == []
    assert served["requests"] == sum(workload.calls.values())  # no turn paid twice


def _events(workspace: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (workspace / "run.jsonl").read_text().splitlines()]
