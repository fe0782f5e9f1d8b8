"""Worker processes forked from a configured app: what each child sets up for itself."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.broker import cpu_quota, embedded, worker_processes
from orchestrator.broker.app import configure
from orchestrator.config.environment import GraphSettings
from workers.settings import HarnessSettings


def test_a_forked_worker_runs_young_collections_less_often_than_python(
    broker: str, tmp_path: Path
) -> None:
    """A real forked worker, on a real Redis, reports its collection thresholds from a task:
    young collections every YOUNG_COLLECTION_AFTER allocations, the older ones as Python's;
    the parent's own thresholds are untouched."""
    # No request is made: the workers only build their model client before the fork.
    app = configure(broker, GraphSettings(), HarnessSettings(base_url="http://127.0.0.1:9/v1"))
    seen = tmp_path / "thresholds.json"

    @app.task(name="tests.thresholds")
    def thresholds(path: str) -> None:
        Path(path).write_text(json.dumps(gc.get_threshold()), encoding="utf-8")

    parent = gc.get_threshold()
    fleet = worker_processes.spawn(app, "gc-probe", processes=1, threads=1)
    try:
        fleet.wait_ready()
        thresholds.delay(str(seen))
        deadline = time.monotonic() + 30
        while not seen.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        fleet.stop(graceful=False)
    young, *older = json.loads(seen.read_text(encoding="utf-8"))
    assert young == worker_processes.YOUNG_COLLECTION_AFTER != parent[0]
    assert tuple(older) == parent[1:]
    assert gc.get_threshold() == parent


_FIRST_SEND = """
import importlib.metadata, json, os, sys, time
from pathlib import Path
from orchestrator.broker import worker_processes
from orchestrator.broker.app import configure
from orchestrator.config.environment import GraphSettings
from orchestrator.plan import canvas
from workers.settings import HarnessSettings

# The installed-package scans of this process (a forked child: its own, from the fork).
# Counted where every entry-point lookup ends, however its caller imported entry_points.
scans = []
real = importlib.metadata.distributions
def counted(**kwargs):
    scans.append(repr(kwargs))
    return real(**kwargs)
importlib.metadata.distributions = counted
os.register_at_fork(after_in_child=scans.clear)

broker, seen = sys.argv[1], Path(sys.argv[2])
app = configure(broker, GraphSettings(), HarnessSettings(base_url="http://127.0.0.1:9/v1"))

@app.task(name="tests.first_send")
def first_send(path):
    canvas._send("tests.nobody_takes_this", "x")
    Path(path).write_text(json.dumps(scans), encoding="utf-8")

fleet = worker_processes.spawn(app, "send-probe", processes=1, threads=1)
try:
    fleet.wait_ready()
    first_send.delay(str(seen))
    deadline = time.monotonic() + 30
    while not seen.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
finally:
    fleet.stop(graceful=False)
"""


def test_a_forked_worker_scans_no_installed_package_to_start_and_send(
    broker: str, tmp_path: Path
) -> None:
    """Celery looks its result backend (and the names a worker's control commands match)
    up by scanning every installed package's entry points, ~10 ms each; the parent does it
    once before the fork, so a real forked worker scans none from its fork to the end of
    its first send from a task, as every step makes. In a fresh interpreter, so nothing
    done earlier in this one has done it already."""
    seen = tmp_path / "scans.json"
    done = subprocess.run(
        [sys.executable, "-c", _FIRST_SEND, broker, str(seen)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert seen.exists(), done.stderr
    assert json.loads(seen.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize(
    ("pool", "processes", "expected"),
    [
        (1, None, (1, 1)),  # never more processes than tickets in flight
        (16, None, (2, 8)),  # one a core
        (256, None, (2, 128)),
        (257, None, (3, 86)),  # past 128 threads a process: one more process
        (512, None, (4, 128)),
        (2048, None, (4, 512)),  # at most two processes a core
        (512, 2, (2, 256)),  # TICKETGRAPH_PROCESSES decides when set
    ],
)
def test_an_embedded_run_spreads_a_pool_over_128_threads_a_process_up_to_two_a_core(
    monkeypatch: pytest.MonkeyPatch, pool: int, processes: int | None, expected: tuple[int, int]
) -> None:
    """One worker process a core (2 here), and up to two a core once a process would keep
    over MAX_THREADS threads waiting on the model (BENCHMARKS.md, #21's fifteenth step)."""
    monkeypatch.setattr(worker_processes, "cores", lambda: 2)
    assert embedded.layout(pool, processes) == expected


def test_the_cores_are_those_this_process_may_run_on() -> None:
    """Pinned to one CPU (as `taskset -c 0` or a container's cpuset pins it): one core,
    whatever the machine has."""
    code = "from orchestrator.broker import worker_processes as w; print(w.cores())"
    first = min(os.sched_getaffinity(0))
    pinned = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        preexec_fn=lambda: os.sched_setaffinity(0, {first}),
    )
    assert pinned.returncode == 0, pinned.stderr
    assert pinned.stdout.strip() == "1"
    free = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert free.stdout.strip() == str(len(os.sched_getaffinity(0)))


V1_CPU = Path("/sys/fs/cgroup/cpu")


@pytest.mark.skipif(
    not (os.access(V1_CPU, os.W_OK) and (V1_CPU / "cpu.cfs_quota_us").is_file()),
    reason="needs a writable cgroup v1 cpu controller (root on a cgroup v1 host) to set a quota",
)
def test_a_cpu_quota_of_the_cgroup_or_one_above_it_caps_the_cores() -> None:
    """In a cgroup under one limited to one CPU (as `docker --cpus 1` limits a container),
    one core, however many the process may run on; the figure the layout starts from."""
    code = "from orchestrator.broker import worker_processes as w; print(w.cores())"
    outer = V1_CPU / f"ticketgraph-test-{os.getpid()}"
    inner = outer / "inner"  # no quota of its own: its parent's holds
    inner.mkdir(parents=True)
    try:
        (outer / "cpu.cfs_period_us").write_text("100000")
        (outer / "cpu.cfs_quota_us").write_text("100000")

        def join() -> None:
            (inner / "cgroup.procs").write_text(str(os.getpid()))

        limited = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, preexec_fn=join
        )
        assert limited.returncode == 0, limited.stderr
        assert limited.stdout.strip() == "1"
        (outer / "cpu.cfs_quota_us").write_text("250000")  # 2.5 CPUs: 3, or the affinity
        more = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, preexec_fn=join
        )
        assert more.stdout.strip() == str(min(3, len(os.sched_getaffinity(0))))
    finally:
        inner.rmdir()
        outer.rmdir()


def test_cgroup_quotas_are_read_as_each_version_writes_them(tmp_path: Path) -> None:
    """cgroup v2 (cpu.max, the smallest on the way up) and v1 in a container without its
    own cgroup namespace (its path is the host's; its mount holds its own cgroup), from
    files laid out as the kernel lays them out: this machine has only one of the versions."""
    proc = tmp_path / "cgroup"
    v2 = tmp_path / "v2"
    (v2 / "kubepods" / "pod1" / "ctr").mkdir(parents=True)
    (v2 / "kubepods" / "cpu.max").write_text("150000 100000\n")
    (v2 / "kubepods" / "pod1" / "ctr" / "cpu.max").write_text("max 100000\n")
    proc.write_text("0::/kubepods/pod1/ctr\n")
    assert cpu_quota.of_this_process(proc, v2) == 1.5
    (v2 / "kubepods" / "cpu.max").write_text("max 100000\n")
    assert cpu_quota.of_this_process(proc, v2) is None  # no limit anywhere

    v1 = tmp_path / "v1"
    (v1 / "cpu,cpuacct").mkdir(parents=True)
    (v1 / "cpu,cpuacct" / "cpu.cfs_quota_us").write_text("200000\n")
    (v1 / "cpu,cpuacct" / "cpu.cfs_period_us").write_text("100000\n")
    proc.write_text("12:cpu,cpuacct:/docker/0123abcd\n1:name=systemd:/docker/0123abcd\n")
    assert cpu_quota.of_this_process(proc, v1) == 2.0
    (v1 / "cpu,cpuacct" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cpu_quota.of_this_process(proc, v1) is None
    assert cpu_quota.of_this_process(tmp_path / "absent", v1) is None
