"""ticketgraph under cron: runs that overlap, repeat, die and resume, through real processes.

Each ticket file is claimed by exactly one run, a run with nothing to claim pays nothing,
a run has one live owner, and resume pays again only for what failed for a reason a retry
may fix. The provider's /stats counts what was paid.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.workload import Workload, build
from orchestrator.broker.redis_server import RedisServer
from tests.conftest import (
    REFERENCE_TICKETS,
    Cli,
    clean_env,
    demo_scripts,
    events,
    state,
    ticket_rows,
    variant,
    worker_processes,
    write_scenarios,
)
from workers.provider import running_provider

REQUESTS_OF_THE_DEMO = 11  # route 1 + drafts 8 + rewrites 2


def _stats(url: str) -> dict[str, Any]:
    return httpx.get(url.replace("/v1", "/stats")).json()


def _run_ids(workspace: Path) -> list[str]:
    runs = workspace / "runs"
    return sorted(p.name for p in runs.iterdir()) if runs.is_dir() else []


def test_cron_twice_the_second_run_claims_nothing_and_pays_nothing(demo: Path, cli: Cli) -> None:
    with running_provider(demo / "scenarios" / "demo.yaml") as url:
        first = cli("run", cwd=demo, env={"LLM_BASE_URL": url})
        paid = _stats(url)["requests"]
        second = cli("run", cwd=demo, env={"LLM_BASE_URL": url})
        assert _stats(url)["requests"] == paid == REQUESTS_OF_THE_DEMO
    assert first.returncode == 1, first.stderr
    assert second.returncode == 0, second.stderr
    assert "nothing to claim" in second.stdout
    (run_id,) = _run_ids(demo)  # the second run left no folder
    assert list((demo / "inbox").iterdir()) == []
    claimed = sorted(p.name for p in (demo / "runs" / run_id / "claimed").iterdir())
    assert claimed == [f"T-100{i}.txt" for i in range(1, 7)]


def _start(workspace: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "run", "--workspace", str(workspace)],
        env={**clean_env(), **env},
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _overlap(workload: Workload, env: dict[str, str], runs: int) -> list[int]:
    procs = [_start(workload.root, env) for _ in range(runs)]
    codes = []
    for proc in procs:
        _out, err = proc.communicate(timeout=120)
        assert proc.returncode in (0, 1), err
        codes.append(proc.returncode)
    return codes


def _assert_each_ticket_once(workload: Workload, requests: int) -> None:
    """Every ticket is in exactly one run, and the provider was paid for each ticket once
    (plus one routing call per run that claimed something)."""
    owners: dict[str, list[str]] = {}
    for run_id in _run_ids(workload.root):
        record = state_of(workload.root, run_id)
        for ticket_id in record["tickets"]:
            owners.setdefault(ticket_id, []).append(run_id)
    assert sorted(owners) == workload.clone_ids()
    assert all(len(runs) == 1 for runs in owners.values()), owners
    calls = workload.calls
    routed = len(_run_ids(workload.root))
    assert requests == routed + calls["fanout"] + calls["review"]
    assert len(list((workload.root / "out").glob("T-*.txt"))) == workload.n


def state_of(workspace: Path, run_id: str) -> dict[str, Any]:
    import json

    return json.loads((workspace / "runs" / run_id / "run-state.json").read_text())


@pytest.mark.parametrize("runs", [2, 4])
def test_overlapping_embedded_runs_claim_each_ticket_once(tmp_path: Path, runs: int) -> None:
    workload = build(tmp_path / "w", 24, latency_ms=20, pool_size=4)
    with running_provider(workload.root / "scenarios" / "demo.yaml") as url:
        _overlap(workload, {"LLM_BASE_URL": url}, runs)
        requests = _stats(url)["requests"]
    _assert_each_ticket_once(workload, requests)


@pytest.mark.parametrize("runs", [2, 4])
def test_overlapping_distributed_runs_claim_each_ticket_once(tmp_path: Path, runs: int) -> None:
    workload = build(tmp_path / "w", 24, latency_ms=20, pool_size=4)
    scenario = workload.root / "scenarios" / "demo.yaml"
    with RedisServer(tcp=True) as redis, running_provider(scenario) as url:
        env = {"TICKETGRAPH_BROKER_URL": redis.url, "LLM_BASE_URL": url}
        with worker_processes(env, tmp_path, ["a", "b"], processes=1, threads=4):
            _overlap(workload, env, runs)
            requests = _stats(url)["requests"]
    _assert_each_ticket_once(workload, requests)


def _slow_demo(path: Path, latency_ms: int) -> Path:
    scripts = demo_scripts()
    for script in scripts:
        script["latency_ms"] = latency_ms
    return write_scenarios(path, scripts)


def _wait_for_turn(workspace: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not (workspace / "run.jsonl").exists() or not any(
        e["event"] == "turn" and e.get("ticket") for e in events(workspace)
    ):
        assert time.monotonic() < deadline, "the run never reached the fan-out"
        time.sleep(0.05)


def test_resume_of_a_run_its_workers_still_run_waits_and_pays_nothing_more(
    demo: Path, cli: Cli, tmp_path: Path
) -> None:
    """kill -9 of the distributed run's CLI mid-fan-out: its workers go on, so an immediate
    resume refuses (75); `resume --wait` waits for them and reports the verdict."""
    with (
        RedisServer(tcp=True) as redis,
        # 1.2 s a call: the workers still have seconds of drafting left when the resume
        # starts (at 0.3 s a loaded machine's workers finished first, and it exited 1).
        running_provider(_slow_demo(tmp_path / "slow.yaml", 1200)) as url,
    ):
        env = {"TICKETGRAPH_BROKER_URL": redis.url, "LLM_BASE_URL": url}
        with worker_processes(env, tmp_path, ["a"], processes=1, threads=2):
            run = _start(demo, env)
            _wait_for_turn(demo)
            os.kill(run.pid, signal.SIGKILL)
            run.wait(10)
            run_id = state(demo)["run_id"]
            busy = cli("resume", run_id, cwd=demo, env=env)
            waited = cli("resume", run_id, "--wait", cwd=demo, env=env, timeout=120)
            requests = _stats(url)["requests"]
    assert busy.returncode == 75, busy.stdout + busy.stderr
    assert "--wait" in busy.stderr
    assert waited.returncode == 1, waited.stdout + waited.stderr
    assert ticket_rows(state(demo)) == REFERENCE_TICKETS
    assert requests == REQUESTS_OF_THE_DEMO  # nothing was redone


def test_resume_after_a_provider_outage_pays_only_for_what_failed(
    demo: Path, cli: Cli, tmp_path: Path
) -> None:
    """Two tickets' first call fails with a 500 three times, the first try and both retries
    (the provider was down for them): the run ends with them worker_failed; resume retries
    those two only (2 turns each)."""
    scripts = demo_scripts()
    for name in ("T-1001#1", "T-1002#1"):
        scripts = variant(scripts, name, faults=[{"turn": 0, "status": 500, "times": 3}])
    with running_provider(write_scenarios(tmp_path / "s.yaml", scripts)) as url:
        first = cli("run", cwd=demo, env={"LLM_BASE_URL": url})
        failed = {i: t["stop"] for i, t in state(demo)["tickets"].items()}
        before = _stats(url)["requests"]
        resumed = cli("resume", state(demo)["run_id"], cwd=demo, env={"LLM_BASE_URL": url})
        paid_again = _stats(url)["requests"] - before
    assert first.returncode == 1, first.stderr
    assert failed["T-1001"] == failed["T-1002"] == "worker_failed"
    assert resumed.returncode == 1, resumed.stderr
    assert "retrying 2 failed tickets: T-1001, T-1002" in resumed.stdout
    assert ticket_rows(state(demo)) == REFERENCE_TICKETS
    assert paid_again == 4


def test_a_permanent_router_failure_is_kept_until_asked(
    demo: Path, cli: Cli, tmp_path: Path
) -> None:
    """A 401 at routing is for a person to fix: resume keeps it (0 requests, exit 3) until
    `--retry-failed all`."""
    scripts = variant(demo_scripts(), "router", faults=[{"status": 401, "times": 1}])
    with running_provider(write_scenarios(tmp_path / "s.yaml", scripts)) as url:
        env = {"LLM_BASE_URL": url}
        first = cli("run", cwd=demo, env=env)
        run_id = state(demo)["run_id"]
        kept = cli("resume", run_id, cwd=demo, env=env)
        after_kept = _stats(url)["requests"]
        retried = cli("resume", run_id, "--retry-failed", "all", cwd=demo, env=env)
        total = _stats(url)["requests"]
    assert first.returncode == 3 and "--retry-failed all" in first.stderr, first.stderr
    assert kept.returncode == 3, kept.stderr
    assert after_kept == 1  # the one failed routing call; resume asked nothing
    assert retried.returncode == 1, retried.stderr
    assert ticket_rows(state(demo)) == REFERENCE_TICKETS
    assert total == 1 + REQUESTS_OF_THE_DEMO


def _lease_of_a_dead_distributed_cli(run_dir: Path) -> None:
    """What a `ticketgraph run` on a shared broker leaves when it is killed: its lease, in
    distributed mode, touched just now by the workers that finish the run without it."""
    import socket

    from orchestrator.run import lease

    dead = subprocess.Popen(["true"])
    dead.wait()
    holder = lease.Holder(
        host=socket.gethostname(), pid=dead.pid, pid_started="1", mode="distributed"
    )
    (run_dir / lease.LEASE_FILE).write_text(holder.model_dump_json())


def test_resume_of_a_finished_run_reports_its_verdict_whatever_its_lease_says(
    demo: Path, cli: Cli
) -> None:
    """A finished run whose lease is still fresh (its distributed CLI was killed and the
    workers finished it within the last 30 s): resume exits by the verdict, 1, not 75. The
    same lease on an unfinished run still means someone works on it: 75."""
    first = cli("run", "--stop-after", "merge", cwd=demo)
    assert first.returncode == 2, first.stderr
    run_id = state(demo)["run_id"]
    run_dir = demo / "runs" / run_id
    assert cli("resume", run_id, cwd=demo).returncode == 1  # now done
    _lease_of_a_dead_distributed_cli(run_dir)
    again = cli("resume", run_id, cwd=demo)
    assert again.returncode == 1, again.stdout + again.stderr
    assert "being worked on" not in again.stderr

    (run_dir / "run.json").write_text(
        (run_dir / "run.json").read_text().replace('"status": "done"', '"status": "running"')
    )
    _lease_of_a_dead_distributed_cli(run_dir)
    busy = cli("resume", run_id, cwd=demo)
    assert busy.returncode == 75, busy.stdout + busy.stderr
    assert "being worked on" in busy.stderr


def test_the_readme_crontab_runs_as_written_with_the_model_from_its_own_lines(
    demo: Path, tmp_path: Path
) -> None:
    """README's crontab, run as cron runs it: the schedule line by /bin/sh with only the
    crontab's variables and cron's bare environment. The model it names (here the demo's
    scripts, served on their own) answers every call of the run; nothing from this shell's
    environment reaches it."""
    from tests.scenarios.test_readme import indented_block

    crontab = indented_block("## From cron")
    variables = dict(line.split("=", 1) for line in crontab if re.match(r"^[A-Z_]+=", line))
    assert {"LLM_BASE_URL", "LLM_API_KEY"} <= set(variables), crontab
    schedule = next(line for line in crontab if line.startswith("*/5 "))
    command = schedule.split(None, 5)[5]
    command = command.replace("/srv/tickets", str(demo))
    command = command.replace(
        "/srv/ticketgraph/.venv/bin/ticketgraph", f"{sys.executable} -m orchestrator.cli"
    )
    with running_provider(demo / "scenarios" / "demo.yaml") as url:
        variables["LLM_BASE_URL"], variables["LLM_API_KEY"] = url, "sk-test"  # placeholders
        cron_env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SHELL": "/bin/sh"}
        cron_env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])  # this checkout
        done = subprocess.run(["/bin/sh", "-c", command], env={**cron_env, **variables})
        assert done.returncode == 0
        assert _stats(url)["requests"] == REQUESTS_OF_THE_DEMO
    log = (demo / "cron.log").read_text()
    assert log.splitlines()[-1] == "exit 1", log
    assert ticket_rows(state(demo)) == REFERENCE_TICKETS
