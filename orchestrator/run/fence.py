"""Fencing: only the newest delivery of a step may write its ticket's files.

Delivery is at least once. A worker stalled past the visibility timeout (a GC pause, a frozen
VM, a partition, SIGSTOP) stops beating, its message comes back and is run again elsewhere;
when the stalled copy wakes up, two copies of one task hold the same ticket. Redis's owner
key cannot tell them apart (a redelivered message keeps its id), so each copy, as it starts,
takes a new epoch in the run folder, and every write it makes is conditional on that epoch
still being the newest:

    runs/<run>/fences/<ticket>    the epoch of the delivery that holds the ticket, any step
    runs/<run>/fences/_<step>     the same for a whole-run step (route, merge, report)

Taking increments the number under an exclusive `flock` of that file; each later write of
the copy (its record, draft, agent state, out/ file, run.json) is made under the same lock
after checking the number is still its own, so a write can never land after a takeover.
The copy that finds the number moved raises `Superseded`: it stops before its next write or
model call, writes nothing more, and its task traces `superseded`. The epoch lives beside
the files it guards (a broker that lost its data cannot reset it), and `flock` holds across
threads, processes and, on NFS, machines.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path

from workers import atomic, commit
from workers.errors import Superseded
from workers.fence import Fence

FOLDER = "fences"
_RDWR = os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)  # an epoch file, opened to lock it


def path(run_dir: Path, name: str) -> Path:
    """The epoch file of a ticket (its id) or of a whole-run step (`_route`, ...)."""
    return run_dir / FOLDER / name


@contextlib.contextmanager
def locked(file: Path) -> Iterator[int]:
    """An exclusive flock of `file` (created if absent); yields its descriptor."""
    fd = _open(file)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _open(file: Path) -> int:
    try:
        return os.open(file, _RDWR, 0o644)
    except FileNotFoundError:
        file.parent.mkdir(parents=True, exist_ok=True)
        return os.open(file, _RDWR, 0o644)


def _epoch(fd: int) -> int:
    raw = os.pread(fd, 32, 0).strip()
    return int(raw) if raw else 0


def _bump(fd: int, file: Path) -> int:
    """The next epoch, written and flushed to disk (through the process's group commit,
    with whatever its other threads save at once) before it is returned.

    It must outlive an OS crash: a volume exported by a machine that runs workers too can
    lose an unflushed epoch with that machine while a stalled copy elsewhere still holds
    the epoch before it, which the file would then call the newest again.
    """
    epoch = _epoch(fd) + 1
    os.pwrite(fd, f"{epoch}\n".encode(), 0)  # numbers only grow: nothing to truncate
    commit.flushed(os.fspath(file))
    return epoch


class EpochFence(Fence):
    """One delivery's hold on a ticket's (or a whole-run step's) files.

    The copy keeps its epoch file open from `take` to `release`, and locks and unlocks that
    descriptor around each write and check, instead of opening the file for each (9.3 opens
    a ticket became 2, BENCHMARKS.md's section i). Taking the lock is also what makes the
    read behind it current on NFS (a lock is a cache coherency point there, as an open is).
    Threads of one copy share its descriptor, and one `flock` cannot tell them apart, so
    they take turns by a lock of the copy's own; a write inside another of the same thread's
    writes is already covered by the outer one. After `release` (or without a descriptor),
    each write and check opens the file as before.
    """

    def __init__(self, file: Path, epoch: int, fd: int | None = None) -> None:
        self.file, self.epoch = file, epoch
        self._fd = fd
        self._turn = threading.RLock()  # the copy's threads, one at a time on its descriptor
        self._depth = 0  # writes of the thread holding `_turn` under way, nested
        self._releasing = False  # `release` was asked during a write: done when it ends
        # A copy dropped without `release` (a test, a step that raised) closes it when
        # collected.
        self._closer = weakref.finalize(self, os.close, fd) if fd is not None else None

    @classmethod
    def take(cls, file: Path) -> EpochFence:
        """Take a new epoch, superseding every earlier copy."""
        taken = cls.take_if(file, lambda: True)
        assert taken is not None
        return taken

    @classmethod
    def take_if(cls, file: Path, may_take: Callable[[], bool]) -> EpochFence | None:
        """`take`, unless `may_take()`, asked under the lock, says the work is no longer
        there to do (then None, and nothing changes)."""
        fd = _open(file)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if not may_take():
                os.close(fd)
                return None
            epoch = _bump(fd, file)
            fcntl.flock(fd, fcntl.LOCK_UN)
        except BaseException:
            os.close(fd)
            raise
        return cls(file, epoch, fd)

    def release(self) -> None:
        """Close the epoch file's descriptor (the copy's writes and checks open the file
        each time from now on; asked during one of this thread's writes, once it ends).
        The hold itself does not end: only a newer copy ends it."""
        with self._turn:
            if self._depth:  # closing it now would drop the lock under the write
                self._releasing = True
                return
            if self._closer is not None:
                self._closer()  # closes it, once
            self._fd = None

    def newest(self) -> int:
        """The epoch of the newest copy (for a check, not a write: released at once)."""
        with self._turn:
            if self._depth:  # this thread writes under the lock already
                return _epoch(self._fd) if self._fd is not None else self._read()
            if self._fd is None:
                return self._read()
            fd = self._fd
            try:
                fcntl.flock(fd, fcntl.LOCK_SH)
                return _epoch(fd)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def _read(self) -> int:
        try:
            return int(atomic.read_bytes(self.file).strip() or 0)
        except FileNotFoundError:
            return 0

    def check(self) -> None:
        """`Superseded` if a newer copy took over (before paying for a model call)."""
        if (newest := self.newest()) != self.epoch:
            raise self._superseded(newest)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """The body runs under the lock, only while this copy's epoch is the newest."""
        with self._turn:
            if self._depth:  # inside this thread's own write: already held and checked
                self._depth += 1
                try:
                    yield
                finally:
                    self._depth -= 1
                return
            try:
                with self._locked() as fd:
                    if (newest := _epoch(fd)) != self.epoch:
                        raise self._superseded(newest)
                    self._depth = 1
                    try:
                        yield
                    finally:
                        self._depth = 0
            finally:
                if self._releasing:
                    self._releasing = False
                    self.release()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[int]:
        if self._fd is None:
            with locked(self.file) as fd:
                yield fd
            return
        fd = self._fd
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield fd
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def _superseded(self, newest: int) -> Superseded:
        return Superseded(
            f"{self.file.name}: epoch {self.epoch} was superseded by epoch {newest}",
            self.epoch,
            newest,
        )
