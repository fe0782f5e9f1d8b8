"""Per-task time limits hold in both modes: a model slower than the soft limit is cancelled
mid-request and its ticket stops with reason `time_limit`; the rest of the run goes on."""

from __future__ import annotations

from pathlib import Path

import httpx

from orchestrator.broker.redis_server import RedisServer
from tests.conftest import Cli, demo_scripts, state, worker_processes, write_scenarios
from workers.provider import running_provider

LIMITS = {"TICKETGRAPH_SOFT_TIME_LIMIT_S": "3", "TICKETGRAPH_TIME_LIMIT_S": "60"}


def _slow_t1001(tmp: Path) -> Path:
    """The demo, with T-1001's first model call taking 40 s: far past the 3 s soft limit."""
    scripts = demo_scripts()
    next(s for s in scripts if s["name"] == "T-1001#1")["latency_ms"] = 40_000
    return write_scenarios(tmp / "slow.yaml", scripts)


def _check(demo: Path, done_code: int, stderr: str, llm: str) -> None:
    assert done_code == 1, stderr
    record = state(demo)
    t1001 = record["tickets"]["T-1001"]
    assert (t1001["stop"], t1001["status"]) == ("time_limit", "needs_human")
    assert "time_limit" in t1001["error"]
    others = {i: t["stop"] for i, t in record["tickets"].items() if i != "T-1001"}
    assert others == {
        "T-1002": "gate_pass",
        "T-1003": "gate_pass",
        "T-1004": "no_progress",
        "T-1005": "gate_pass",
        "T-1006": "gate_pass",
    }
    # The slow call was abandoned at the soft limit, not waited for: its connection was cut,
    # and the provider saw it go long before its 30 s reply.
    seen = httpx.get(llm.replace("/v1", "/stats")).json()
    assert (seen["abandoned"], seen["in_flight"]) == (1, 0)


def test_the_soft_time_limit_stops_a_slow_ticket_in_an_embedded_run(
    demo: Path, cli: Cli, tmp_path: Path
) -> None:
    with running_provider(_slow_t1001(tmp_path)) as llm:
        done = cli("run", cwd=demo, env={"LLM_BASE_URL": llm, **LIMITS})
        _check(demo, done.returncode, done.stderr, llm)


def test_the_soft_time_limit_stops_a_slow_ticket_on_a_worker(
    demo: Path, cli: Cli, tmp_path: Path
) -> None:
    with RedisServer(tcp=True) as redis, running_provider(_slow_t1001(tmp_path)) as llm:
        env = {"TICKETGRAPH_BROKER_URL": redis.url, "LLM_BASE_URL": llm}
        with worker_processes({**env, **LIMITS}, tmp_path, ["limited"]):
            done = cli("run", cwd=demo, env=env)  # the limits are the worker's settings
            _check(demo, done.returncode, done.stderr, llm)


def test_a_task_that_ended_leaves_nothing_of_itself_with_the_watchdog() -> None:
    """Each task arms its soft and hard limits and disarms them as it ends. Disarmed
    deadlines stayed in the watchdog's heap, with the task's context in their actions,
    until their time came: a worker held every ticket of the last hard limit's span (peak
    RSS 505 MB at 10,000 tickets, growing with the run)."""
    import gc
    import weakref

    from orchestrator.broker import timelimits
    from workers.cancel import CancelToken

    class Context:  # stands for what a task's actions hold: its store, records, config
        pass

    alive = []
    for _ in range(5000):
        context = Context()
        alive.append(weakref.ref(context))
        with timelimits.enforced(CancelToken(), 600, 660, lambda c=context: None, "a ticket"):
            pass
    del context
    gc.collect()
    assert sum(ref() is not None for ref in alive) == 0
    heap = timelimits._watchdog()._heap
    assert len(heap) <= 2 * timelimits.COMPACT_AFTER + 2, len(heap)
