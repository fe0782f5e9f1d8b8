"""bench.caps runs as its docs say, small: the ledger's cost per call is measured, not
assumed, and a short overhead pair finishes with the same verdict with and without a budget."""

from __future__ import annotations

from pathlib import Path

from bench import caps


def test_micro_measures_both_processes(tmp_path: Path) -> None:
    figures = caps.micro(tmp_path, 200)
    assert figures["calls"] == 200 and figures["prompt_tokens"] > 500
    assert figures["client_cpu_ms_per_call"] > 0 and figures["redis_cpu_ms_per_call"] > 0
    # An order of magnitude, not a time: a hold and a settlement are not 50 ms of work.
    assert figures["client_cpu_ms_per_call"] < 50


def test_overhead_runs_the_same_workload_with_and_without_a_budget(tmp_path: Path) -> None:
    figures = caps.overhead(tmp_path, 12, pairs=1)
    runs = figures["runs"]
    assert [r["budget"] for r in runs] == [False, True]
    assert {r["exit_code"] for r in runs} == {1}
    assert runs[0]["tail"][0].split(":", 1)[1] == runs[1]["tail"][0].split(":", 1)[1]
