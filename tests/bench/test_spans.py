"""bench.spans: an instrumented embedded run adds up each span's thread CPU in its workers."""

from __future__ import annotations

from pathlib import Path

from bench import spans

N = 12


def test_every_span_is_counted_in_the_tasks_and_nested_spans_fit_in_their_parents(
    tmp_path: Path,
) -> None:
    result = spans.measure(N, tmp_path)
    sums = result["spans"]
    # Each ticket is one draft task and one review task, each writing its record once; the
    # model calls are the workload's drafts and rewrites. Only what runs inside the tasks
    # counts: not the router's call (route is a whole-run step), nor what the CLI wrote
    # before it forked the workers, nor the records whole-run steps read and write.
    assert sums["per-ticket tasks"]["calls"] == 2 * N
    assert sums["  write a ticket's record"]["calls"] == 2 * N
    assert sums["        model call (client)"]["calls"] == result["model_calls_expected"]
    assert all(s["calls"] > 0 for s in sums.values()), sums  # every wrapper was installed
    top = sums["per-ticket tasks"]["cpu_s"]
    assert all(s["cpu_s"] <= top for s in sums.values()), sums
    # A span's CPU is inside its parent's, measured on the same thread.
    for chain in (
        ["per-ticket tasks", "  the step under the fence", "    hand the slot on"],
        ["    agent runs", "      harness loop", "        model call (client)"],
    ):
        spent = [sums[label]["cpu_s"] for label in chain]
        assert spent == sorted(spent, reverse=True), dict(zip(chain, spent, strict=True))
        assert spent[-1] > 0
    # Two forked worker processes, whose CPU holds the tasks', inside the whole run's.
    assert result["worker_processes"] == 2
    assert result["cpu_all_s"] >= result["cpu_workers_s"] >= top
    assert "per-ticket tasks" in spans.table(result)
