"""A file of versions (workers/versions.py): saved by appending a line, read as its newest
whole line; made once, never replaced at a save; a writer killed mid-line loses only its own
version."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from workers import versions
from workers.state import RunState, new_run


def _doc(n: int, pad: int = 0) -> str:
    return json.dumps({"n": n, "pad": "x" * pad})


def test_each_save_appends_one_line_to_the_same_file_and_the_newest_is_read(
    tmp_path: Path,
) -> None:
    path = tmp_path / "agents" / "T-1.draft.json"  # its folder is made on the first save
    versions.append(path, _doc(1))
    made = path.stat().st_ino
    for n in (2, 3):
        versions.append(path, _doc(n))
    assert versions.read_json(path)["n"] == 3
    assert path.stat().st_ino == made  # one file, never a new one a save
    assert [json.loads(x)["n"] for x in path.read_text().split("\n") if x] == [1, 2, 3]


def test_a_state_saved_at_each_turn_loads_its_last_save(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    state = new_run("system", "task")
    for turns in (1, 2, 3):
        state.turns = turns
        state.save(path)
    assert RunState.load(path).turns == 3
    assert len([x for x in path.read_text().split("\n") if x]) == 3


def test_a_torn_last_line_is_skipped_and_the_next_save_is_not_glued_to_it(
    tmp_path: Path,
) -> None:
    """What a writer killed mid-line leaves: its line cut short, without its newline."""
    path = tmp_path / "r.json"
    versions.append(path, _doc(1))
    with path.open("ab") as handle:
        handle.write(b'\n{"n": 2, "pad": "xx')
    assert versions.read_json(path)["n"] == 1  # the old version, whole
    versions.append(path, _doc(3))
    assert versions.read_json(path)["n"] == 3
    with path.open("ab") as handle:  # torn again: now a torn line lies between two whole ones
        handle.write(b'\n{"n": 4, "p')
    assert versions.read_json(path)["n"] == 3


def test_a_file_written_whole_is_its_one_version_until_a_save_appends(tmp_path: Path) -> None:
    """A state saved before versions (pretty-printed), or a record written by a single-writer
    step's `write_many`, reads as it is; a save after it is the newest."""
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"n": 1, "list": [3, 4]}, indent=1))
    assert versions.read_json(path) == {"n": 1, "list": [3, 4]}
    versions.append(path, _doc(2))
    assert versions.read_json(path)["n"] == 2


def test_a_state_pretty_printed_before_versions_survives_a_torn_first_append(
    tmp_path: Path,
) -> None:
    """None of a pretty-printed document's lines is JSON alone: after a torn append the
    document written whole is still the newest whole version."""
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"n": 1, "list": [{"a": 3}, 4]}, indent=1))
    with path.open("ab") as handle:
        handle.write(b'\n{"n": 2, "li')
    assert versions.read_json(path) == {"n": 1, "list": [{"a": 3}, 4]}


def test_a_file_with_no_whole_version_raises_the_parsers_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(b'{"n": 1')
    with pytest.raises(ValueError):
        versions.read_json(path)
    with pytest.raises(ValueError, match="one line"):
        versions.append(path, '{\n"n": 2}')


def test_a_whole_newest_version_that_does_not_validate_is_an_error_not_the_one_before(
    tmp_path: Path,
) -> None:
    """Only torn lines are passed over: a state whose newest save was damaged (or edited)
    must not load as the save before it, which would pay its last turn again."""
    path = tmp_path / "s.json"
    state = new_run("system", "task")
    state.turns = 1
    state.save(path)
    versions.append(path, json.dumps({"turns": "not a number"}))
    with pytest.raises(ValueError, match="turns"):
        RunState.load(path)


def test_a_file_that_outgrows_its_newest_version_is_rewritten_with_it_alone(
    tmp_path: Path,
) -> None:
    path = tmp_path / "big.json"
    for n in range(1, 40):
        versions.append(path, _doc(n, pad=4000))
        assert versions.read_json(path)["n"] == n
    # Never far past the threshold: compacted to one version whenever it got there.
    assert path.stat().st_size <= versions.COMPACT_AT + 4100
    assert path.read_text().count("\n{") < 20


def test_a_save_moves_its_folders_time_as_a_rename_would(tmp_path: Path) -> None:
    """The web view and the people's queue know a record changed by its folder's time."""
    path = tmp_path / "records" / "T-1.json"
    versions.append(path, _doc(1))
    os.utime(path.parent, ns=(1_000_000_000, 1_000_000_000))
    versions.append(path, _doc(2))
    assert path.parent.stat().st_mtime_ns > 1_000_000_000


def test_a_reader_beside_a_writer_reads_whole_versions_only(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    versions.append(path, _doc(0, pad=20_000))
    done = threading.Event()
    seen: list[int] = []

    def read() -> None:
        while not done.is_set():
            seen.append(versions.read_json(path)["n"])  # raises on half a version

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for n in range(1, 200):
            versions.append(path, _doc(n, pad=20_000), durable=False)
    finally:
        done.set()
        reader.join()
    assert seen and seen == sorted(seen)  # never an older version after a newer one


_WRITER = """
import json, sys
from workers import versions
path, n = sys.argv[1], 0
print("ready", flush=True)
while True:
    n += 1
    versions.append(path, json.dumps({"n": n, "pad": "x" * 3_000_000}), durable=False)
"""


def test_a_writer_killed_mid_save_leaves_a_whole_version_and_the_next_save_reads_back(
    tmp_path: Path,
) -> None:
    """A real process appending 3 MB versions (many pages a write: a kill can cut one),
    SIGKILLed at four moments, the first as it makes the file: each time the file is absent
    or reads as a whole version, and a save after the kill is read back."""
    path = tmp_path / "r.json"
    for wait in (0.0, 0.05, 0.2, 0.35):  # the first likely inside the first save
        child = subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(path)],
            stdout=subprocess.PIPE,
            cwd=Path(__file__).resolve().parents[2],
        )
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == b"ready"
            time.sleep(wait)
        finally:
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
        if path.exists():
            # A whole version of the writer's, or (killed before its first line was whole,
            # as a loaded machine can make it) the save after the last kill, untouched.
            got = versions.read_json(path)
            assert (got["pad"] == "x" * 3_000_000 and got["n"] >= 1) or got == {"n": -1, "pad": ""}
        versions.append(path, _doc(-1))
        assert versions.read_json(path)["n"] == -1
