"""bench.phases: an instrumented embedded run adds up each phase's thread CPU in its workers."""

from __future__ import annotations

from pathlib import Path

from bench import phases

N = 12


def test_every_phase_is_counted_in_the_workers_and_nested_phases_fit_in_their_parents(
    tmp_path: Path,
) -> None:
    result = phases.measure(N, tmp_path)
    sums = result["phases"]
    # Each ticket is one draft task and one review task; the model calls are the workload's
    # (the router's one call too: its agent runs in route, a whole-run step).
    assert sums["task: one ticket"]["calls"] == 2 * N
    assert sums["        model call (client)"]["calls"] == result["model_calls_expected"]
    assert all(s["calls"] > 0 for s in sums.values()), sums  # every wrapper was installed
    # A phase's CPU is inside its parent's, measured on the same thread.
    for chain in (
        ["task: one ticket", "  the step under the fence", "    hand the slot on"],
        ["    agent run", "      harness loop", "        model call (client)"],
    ):
        spent = [sums[label]["cpu_s"] for label in chain]
        assert spent == sorted(spent, reverse=True), dict(zip(chain, spent, strict=True))
        assert spent[-1] > 0
    # Two forked worker processes, whose CPU holds the tasks', inside the whole run's.
    assert result["worker_processes"] == 2
    top = sums["task: one ticket"]["cpu_s"]
    assert result["cpu_all_s"] >= result["cpu_workers_s"] >= top
    assert "task: one ticket" in phases.table(result)
