"""Group commit: one flush to disk for the files a process's threads save at the same time.

Every durable save (a ticket's record, an agent's state after a turn, a draft, an out/
reply, a fence's epoch) used to fsync its own file: about seven a ticket, the largest cost
a ticket has (#51: 7.1 s of the 15.4 s of CPU a 1,000-ticket run took went to them). Here
a saver writes its temp file without flushing and asks `flushed(path)`: the first thread
to ask while no flush runs leads, waits out the window for others to join, flushes the
filesystem once (`syncfs`), and every thread of the batch then renames its own file into
place. A saver returns only once its data is on disk, as before: a killed process or an
OS crash loses nothing more than it did with one fsync a file, and never leaves a torn
file (a file is renamed into place only after its bytes are flushed).

What it costs is latency, not durability: a saver that arrives while a flush runs waits
for that one and the next, and the leader waits up to the window (`configure`,
TICKETGRAPH_COMMIT_WINDOW_MS, default 0: no wait, batches form from the savers that
arrive during a flush) or until `most` savers joined. Batches are per process; a fork
starts with its own, empty.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import threading
import time
from dataclasses import dataclass, field

try:
    _SYNCFS = ctypes.CDLL(None, use_errno=True).syncfs
except (OSError, AttributeError):  # not Linux: the leader fsyncs each file instead
    _SYNCFS = None

DEFAULT_MOST = 64  # savers in one batch before the leader stops waiting out the window


@dataclass
class _Batch:
    paths: list[str] = field(default_factory=list)
    done: bool = False
    error: OSError | None = None


class GroupCommit:
    """One process's batches of files waiting to be flushed."""

    def __init__(self, window_s: float = 0.0, most: int = DEFAULT_MOST) -> None:
        self.window_s, self.most = window_s, most
        self._reset()

    def _reset(self) -> None:
        self._cond = threading.Condition()
        self._open = _Batch()
        self._flushing = False
        self.flushes = 0  # flushes made, and files they covered: for benches and tests
        self.files = 0

    def flushed(self, path: str) -> None:
        """Return once `path`, written and closed but not flushed, is on disk: flushed by a
        flush that began after this call. The flush's error (EIO, ENOSPC), naming `path`,
        if it failed; a flush cut short (an interrupt in its leader) is an EIO for all."""
        with self._cond:
            batch = self._open
            batch.paths.append(path)
            if len(batch.paths) >= self.most:
                self._cond.notify_all()  # a leader waiting out its window goes now
            try:
                while not batch.done:
                    if not self._flushing:  # the open batch has no leader: this thread leads
                        self._lead(batch)
                    else:
                        self._cond.wait()
            except BaseException:
                if not batch.done and batch is self._open:
                    batch.paths.remove(path)  # given up before its flush began: not in it
                raise
        if batch.error is not None:
            raise OSError(batch.error.errno, batch.error.strerror, path) from batch.error

    def _lead(self, batch: _Batch) -> None:
        """Flush `batch` (called under the lock, with no flush running). Whatever stops it
        (an interrupt while it waits or flushes) ends the batch failed, never done as if
        flushed, and leaves the next batch a leader."""
        self._flushing = True
        flushed = False
        try:
            deadline = time.monotonic() + self.window_s
            while len(batch.paths) < self.most and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)  # others join `batch`: it is still the open one
            self._open = _Batch()  # who comes now rides the next flush
            self._cond.release()
            try:
                flush(batch.paths)
                flushed = True
            except OSError as exc:
                batch.error, flushed = exc, True
            finally:
                self._cond.acquire()
        finally:
            if self._open is batch:
                self._open = _Batch()
            if not flushed:
                batch.error = OSError(errno.EIO, "the flush to disk was interrupted")
            self.flushes, self.files = self.flushes + 1, self.files + len(batch.paths)
            batch.done, self._flushing = True, False
            self._cond.notify_all()


def flush(paths: list[str]) -> None:
    """Put the contents of `paths` on disk: one syncfs per filesystem that holds SYNCFS_MIN
    of them or more, where syncfs is known to flush as fsync does, else an fsync of each."""
    if len(paths) < SYNCFS_MIN:  # a small batch, the usual one: no stat a file
        _fsync_each(paths)
        return
    by_device: dict[int, list[str]] = {}
    for path in paths:
        with contextlib.suppress(FileNotFoundError):  # its saver gave up and removed it
            by_device.setdefault(os.stat(path).st_dev, []).append(path)
    for device, files in by_device.items():
        if len(files) >= SYNCFS_MIN and (fd := _syncfs_fd(device, files[0])) is not None:
            if _SYNCFS(fd) != 0:
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err), files[0])
        else:
            _fsync_each(files)


def _fsync_each(paths: list[str]) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):  # its saver gave up and removed it
            fsync_path(path)


def fsync_path(path: str) -> None:
    """fsync a file (or folder) by its path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# Filesystems whose syncfs writes back and flushes every dirty file as fsync would, and
# reports a writeback error (Linux 5.8 on) to each descriptor opened before it: FUSE and
# SMB may not pass a syncfs on to their server at all, so their files are fsynced one by
# one.
SYNCFS_TYPES = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "tmpfs", "nfs", "nfs4"})
# Fewer files than this are fsynced one by one: a syncfs also writes back every dirty
# metadata block of the filesystem (directories, inode tables), which per-file fsyncs on
# ext4 leave to the periodic writeback; one for every small batch wrote 4.5× the bytes a
# ticket (48 → 210-227 KB at N = 1,000-4,000, growing with the run's folders: #51).
SYNCFS_MIN = 8
_syncfs_fds: dict[int, int | None] = {}  # device -> a descriptor on it kept open, or None


def _syncfs_fd(device: int, path: str) -> int | None:
    """A descriptor on `device`'s filesystem for syncfs, opened once a process (so a
    writeback error after its opening reaches the next syncfs), or None where syncfs is not
    to be trusted there."""
    if device not in _syncfs_fds:
        usable = _SYNCFS is not None and _kernel() >= (5, 8) and _fs_type(device) in SYNCFS_TYPES
        _syncfs_fds[device] = os.open(os.path.dirname(path) or ".", os.O_RDONLY) if usable else None
    return _syncfs_fds[device]


def _kernel() -> tuple[int, int]:
    try:
        major, minor = os.uname().release.split(".")[:2]
        return int(major), int("".join(c for c in minor if c.isdigit()) or 0)
    except ValueError:
        return (0, 0)


def _fs_type(device: int) -> str:
    """The type of the filesystem mounted from `device` (/proc/self/mountinfo), or ""."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as mounts:
            for line in mounts:
                fields = line.split()
                major, minor = fields[2].split(":")
                if os.makedev(int(major), int(minor)) == device:
                    return fields[fields.index("-") + 1]
    except (OSError, ValueError, IndexError):
        pass
    return ""


def _forget_descriptors() -> None:
    """In a forked child: its own descriptors, not its parent's (whose errors they share)."""
    for fd in _syncfs_fds.values():
        if fd is not None:
            os.close(fd)
    _syncfs_fds.clear()


commits = GroupCommit()
os.register_at_fork(after_in_child=commits._reset)  # a lock held at the fork is not ours
os.register_at_fork(after_in_child=_forget_descriptors)


def configure(window_ms: float, most: int = DEFAULT_MOST) -> None:
    """How long a flush's leader waits for more savers (ms), and how many it waits for."""
    commits.window_s, commits.most = window_ms / 1000, most


def flushed(path: str) -> None:
    """`path` on disk, through this process's group commit (see the module's doc)."""
    commits.flushed(path)
