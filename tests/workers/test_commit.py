"""Group commit (workers/commit.py): threads that save at once share one flush to disk, each
returns only once its own file is flushed, a failed flush reaches every saver of its batch,
and a process forked in the middle of a flush saves on its own."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from workers import atomic, commit

REPO = Path(__file__).resolve().parents[2]
THREADS, SAVES = 16, 5


@pytest.fixture
def commits(monkeypatch: pytest.MonkeyPatch) -> commit.GroupCommit:
    """This process's group commit with a 20 ms window, its counts at zero, and every flush
    it makes checked: the files of a batch are still temp files (not renamed into place)."""
    fresh = commit.GroupCommit(window_s=0.02)
    monkeypatch.setattr(commit, "commits", fresh)
    real = commit.flush

    def checked(paths: list[str]) -> None:
        # Every file of a batch is still its temp, not renamed into place before its flush
        # (a failure here reaches the saver as the flush's error, and the test sees it).
        if not all(os.path.basename(p).startswith(".") and os.path.exists(p) for p in paths):
            raise OSError(errno.EINVAL, f"renamed before its flush: {paths}")
        real(paths)

    monkeypatch.setattr(commit, "flush", checked)
    return fresh


def _save_at_once(folder: Path, errors: list[BaseException]) -> None:
    start = threading.Barrier(THREADS)

    def saver(k: int) -> None:
        start.wait()
        for n in range(SAVES):
            text = f"thread {k} save {n}\n" * 50
            try:
                atomic.write_text(folder / f"{k}.txt", text)
            except OSError as exc:
                errors.append(exc)
                return
            if (folder / f"{k}.txt").read_text() != text:  # its own, whole, at once
                errors.append(AssertionError(f"{k}.txt is not what thread {k} saved"))

    threads = [threading.Thread(target=saver, args=(k,)) for k in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)


def test_threads_saving_at_once_share_flushes_and_each_waits_for_its_own(
    tmp_path: Path, commits: commit.GroupCommit
) -> None:
    errors: list[BaseException] = []
    _save_at_once(tmp_path, errors)
    assert errors == []
    assert commits.files == THREADS * SAVES  # every save went through a flush
    # 80 saves by 16 threads that start together, with a 20 ms window: batches, not one
    # flush a file (one a file would be 80; measured here 5).
    assert commits.flushes <= commits.files // 4, (commits.flushes, commits.files)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{k}.txt" for k in range(16))


def test_a_failed_flush_reaches_every_saver_of_its_batch_and_renames_none(
    tmp_path: Path, commits: commit.GroupCommit, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = commit.flush

    def failing(paths: list[str]) -> None:
        real(paths)
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(commit, "flush", failing)
    errors: list[BaseException] = []
    _save_at_once(tmp_path, errors)
    assert len(errors) == THREADS  # each thread's first save failed
    assert all(isinstance(e, OSError) and e.errno == errno.EIO for e in errors)
    named = sorted(Path(e.filename).name for e in errors if isinstance(e, OSError))
    assert named == sorted(f"{k}.txt" for k in range(THREADS))  # its own file, not a temp
    assert list(tmp_path.iterdir()) == []  # nothing renamed into place, no temp left


FORK_WHILE_FLUSHING = """
import os, sys, threading, time
from workers import atomic, commit
commit.configure(3000, most=1000)  # a leader waits out 3 s before its flush
folder = sys.argv[1]
held = threading.Thread(target=atomic.write_text, args=(os.path.join(folder, "held"), "x"))
held.start()
time.sleep(0.3)  # the thread leads a batch and waits out its window, holding the flush
pid = os.fork()
if pid == 0:  # the child: no thread of its parent is here to lead that batch
    commit.configure(0)
    atomic.write_text(os.path.join(folder, "child"), "y")
    os._exit(0)
began = time.monotonic()
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status), round(time.monotonic() - began, 2))
held.join()
"""


def test_a_process_forked_during_a_flush_saves_without_waiting_for_it(tmp_path: Path) -> None:
    """A worker process is forked from a parent whose threads may be in a flush: the child
    starts with no batch and no lock held, and its first save does not wait for the
    parent's flush (3 s away here)."""
    done = subprocess.run(
        [sys.executable, "-c", FORK_WHILE_FLUSHING, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr
    code, seconds = done.stdout.split()
    assert code == "0"
    assert float(seconds) < 2.5  # not held up by the parent's 3 s window
    assert (tmp_path / "child").read_text() == "y" and (tmp_path / "held").read_text() == "x"


def test_a_leader_interrupted_while_it_waits_fails_its_batch_and_the_next_save_leads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interrupt (Ctrl-C in the CLI's thread, a SIGTERM's KeyboardInterrupt) that lands
    in a leader waiting out its window ends its batch failed, not flushed, and a later save
    leads a batch of its own instead of waiting for a leader that is gone."""
    fresh = commit.GroupCommit(window_s=5.0)
    monkeypatch.setattr(commit, "commits", fresh)
    real_wait = fresh._cond.wait

    def interrupted(timeout: float | None = None) -> bool:
        if timeout is not None:  # the leader's window
            raise KeyboardInterrupt
        return real_wait(timeout)

    monkeypatch.setattr(fresh._cond, "wait", interrupted)
    with pytest.raises(KeyboardInterrupt):
        atomic.write_text(tmp_path / "a.txt", "a")
    assert not (tmp_path / "a.txt").exists() and list(tmp_path.iterdir()) == []
    fresh.window_s = 0.0
    atomic.write_text(tmp_path / "b.txt", "b")  # leads its own flush, at once
    assert (tmp_path / "b.txt").read_text() == "b" and fresh.flushes == 2
