"""Tokens, money and state on disk."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from workers import tokens
from workers.errors import TokenizerError
from workers.pricing import Price, PriceTable, cost
from workers.state import Message, RunState, ToolCall, new_run, pending
from workers.trace import Tracer, read
from workers.usage import Usage


def test_o200k_base_gives_tiktokens_ids() -> None:
    # Ids of o200k_base as published by tiktoken (gpt-4o's encoding).
    assert tokens.encoding().encode("hello world") == [24912, 2375]
    assert tokens.encoding().name == "o200k_base"
    assert tokens.count("worker 7 timed out after 30000 ms") == len(
        tokens.encoding().encode("worker 7 timed out after 30000 ms")
    )


def test_a_wrong_checksum_is_an_error_not_a_fallback() -> None:
    with pytest.raises(TokenizerError, match="fail verification"):
        tokens._read_ranks(expected_sha256="0" * 64)


def test_cost_is_the_price_formula() -> None:
    usage = Usage(prompt_tokens=815, completion_tokens=70)
    assert cost(usage, Price()) == pytest.approx(815 * 2e-6 + 70 * 12e-6, abs=1e-12)
    table = PriceTable(models={"big": Price(input_per_million=10, output_per_million=30)})
    assert cost(usage, table.for_model("big")) == pytest.approx(815 * 1e-5 + 70 * 3e-5)
    assert table.for_model("other") == Price()


def test_state_round_trips_atomically(tmp_path: Path) -> None:
    state = new_run("system", "task")
    state.messages.append(
        Message(
            role="assistant",
            tool_calls=[ToolCall.model_validate({"id": "c1", "function": {"name": "list_files"}})],
        )
    )
    path = tmp_path / "s.json"
    state.save(path)
    assert RunState.load(path) == state
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]
    assert [c.id for c in pending(RunState.load(path))] == ["c1"]


def test_atomic_writes_honour_the_umask(tmp_path: Path) -> None:
    """A file written atomically gets 0666 less the umask, as any tool's file does (not the
    0600 of the temp file it starts as); checked in a child with umask 027."""
    target = tmp_path / "out.txt"
    code = (
        "import os; os.umask(0o027); from workers import atomic; "
        f"atomic.write_text({str(target)!r}, 'x'); "
        f"atomic.write_many([(__import__('pathlib').Path({str(target)!r} + '2'), 'y')])"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert target.stat().st_mode & 0o777 == 0o640
    assert Path(str(target) + "2").stat().st_mode & 0o777 == 0o640


def test_a_trace_makes_its_folder_on_its_first_line_and_keeps_every_line(
    tmp_path: Path,
) -> None:
    """Tracers made per event (as steps make them) write to 40 runs' traces, interleaved: each
    trace's folder is made by its first line, and every line lands whole and in order."""
    paths = [tmp_path / f"run-{i}" / "run.jsonl" for i in range(40)]
    for line in range(3):
        for i, path in enumerate(paths):
            Tracer(path, f"run-{i}", ticket="T-1").emit("step", line=line)
    for i, path in enumerate(paths):
        events = read(path)
        assert [e["line"] for e in events] == [0, 1, 2]
        assert {e["run_id"] for e in events} == {f"run-{i}"}
