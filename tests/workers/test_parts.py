"""Tokens, money and state on disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from workers import atomic, commit, tokens
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


def test_link_many_publishes_each_file_as_a_second_name_of_it(tmp_path: Path) -> None:
    """Each target becomes the source's file (one inode, its bytes), replacing what was
    there; a missing target folder is made; no temp name is left; writing the target again
    leaves the source as it was."""
    sources = tmp_path / "drafts"
    sources.mkdir()
    out = tmp_path / "out"
    pairs = []
    for i in range(3):
        (sources / f"T-{i}.txt").write_text(f"draft {i}\n")
        pairs.append((sources / f"T-{i}.txt", out / f"T-{i}.txt"))
    atomic.link_many(pairs[:1])  # out/ made by the first
    (out / "T-1.txt").write_text("an older reply\n")
    atomic.link_many(pairs)
    for source, target in pairs:
        assert target.read_text() == source.read_text()
        assert os.path.samefile(source, target)
    assert sorted(p.name for p in out.iterdir()) == ["T-0.txt", "T-1.txt", "T-2.txt"]
    atomic.write_text(out / "T-1.txt", "rewritten\n")
    assert (sources / "T-1.txt").read_text() == "draft 1\n"


def test_link_many_copies_what_it_cannot_link(tmp_path: Path) -> None:
    """A source on another filesystem (tmpfs here, the target's on the test's disk) cannot be
    linked: it is copied, beside the ones that are linked."""
    here = tmp_path / "here.txt"
    here.write_text("linked\n")
    with tempfile.TemporaryDirectory(dir="/dev/shm") as shm:
        there = Path(shm) / "there.txt"
        there.write_text("copied\n")
        assert os.stat(shm).st_dev != os.stat(tmp_path).st_dev
        out = tmp_path / "out"
        atomic.link_many([(here, out / "a.txt"), (there, out / "b.txt")])
        assert os.path.samefile(here, out / "a.txt")
        assert (out / "b.txt").read_text() == "copied\n"
        assert not os.path.samefile(there, out / "b.txt")
    assert sorted(p.name for p in out.iterdir()) == ["a.txt", "b.txt"]


def test_link_many_on_a_filesystem_that_syncs_no_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Some filesystems (FUSE ones) answer EINVAL to a folder's fsync: the links are made
    all the same; any other error of it is the caller's."""
    (tmp_path / "a.txt").write_text("a\n")
    real = os.fsync

    def folders_refused(fd: int, errno: int = 22) -> None:
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            raise OSError(errno, os.strerror(errno))
        real(fd)

    monkeypatch.setattr(os, "fsync", folders_refused)
    atomic.link_many([(tmp_path / "a.txt", tmp_path / "out" / "a.txt")])
    assert (tmp_path / "out" / "a.txt").read_text() == "a\n"
    monkeypatch.setattr(os, "fsync", lambda fd: folders_refused(fd, errno=5))  # EIO
    with pytest.raises(OSError, match="Input/output error"):
        atomic.link_many([(tmp_path / "a.txt", tmp_path / "out" / "b.txt")])


def test_link_many_stops_at_a_missing_source_and_leaves_no_temp_name(tmp_path: Path) -> None:
    """A source that is gone is an error: what came before it is published whole, nothing
    after it, and no temp name is left (the one replacing an older reply included)."""
    for name in ("a", "c"):
        (tmp_path / f"{name}.txt").write_text(f"{name}\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "c.txt").write_text("older\n")
    pairs = [(tmp_path / "a.txt", out / "a.txt"), (tmp_path / "c.txt", out / "c.txt")]
    with pytest.raises(FileNotFoundError):
        atomic.link_many([*pairs, (tmp_path / "gone", out / "b.txt")])
    assert sorted(p.name for p in out.iterdir()) == ["a.txt", "c.txt"]
    assert (out / "a.txt").read_text() == "a\n" and (out / "c.txt").read_text() == "older\n"


def test_a_batched_trace_appends_its_lines_at_the_end_whole_among_other_writers(
    tmp_path: Path,
) -> None:
    """A batch's lines reach the file when its block ends (also when the block raises), in
    the order they were emitted, each with the time it was emitted; threads appending single
    lines meanwhile never split one of them."""
    path = tmp_path / "run.jsonl"
    trace = Tracer(path, "run-1", node="merge")
    stop = threading.Event()

    def others() -> None:
        while not stop.is_set():
            Tracer(path, "run-1", node="review").emit("gate")

    threads = [threading.Thread(target=others) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        with pytest.raises(RuntimeError), trace.batched() as lines:
            for i in range(2000):
                lines.emit("collected", ticket=f"T-{i}", pad="x" * 100)
            assert not [e for e in read(path) if e["node"] == "merge"]  # held until the end
            raise RuntimeError("the step failed after tracing")
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    events = [json.loads(line) for line in path.read_text().splitlines()]  # every line whole
    batch = [e for e in events if e["node"] == "merge"]
    assert [e["ticket"] for e in batch] == [f"T-{i}" for i in range(2000)]
    assert [e["ts"] for e in batch] == sorted(e["ts"] for e in batch)
    assert {e["run_id"] for e in events} == {"run-1"}


def test_link_many_flushes_the_folder_of_a_target_it_copied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy's rename is put on disk as a link's is: its folder is synced after it."""
    with tempfile.TemporaryDirectory(dir="/dev/shm") as shm:
        there = Path(shm) / "there.txt"
        there.write_text("copied\n")
        events: list[tuple[str, str]] = []
        real_sync, real_replace = commit.fsync_path, os.replace
        monkeypatch.setattr(
            commit, "fsync_path", lambda p: (events.append(("sync", p)), real_sync(p))
        )
        monkeypatch.setattr(
            os,
            "replace",
            lambda a, b: (events.append(("replace", os.fspath(b))), real_replace(a, b)),
        )
        out = tmp_path / "out"
        atomic.link_many([(there, out / "b.txt")])
    assert events[-1] == ("sync", str(out))
    assert events.index(("replace", str(out / "b.txt"))) < len(events) - 1


def test_a_batch_inside_a_batch_keeps_the_order_of_its_lines(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    with Tracer(path, "run-1").batched() as outer:
        outer.emit("a")
        with outer.batched() as inner:
            inner.emit("b")
        outer.emit("c")
    outer.emit("d")  # after its block: appended, not held forever
    assert [e["event"] for e in read(path)] == ["a", "b", "c", "d"]
