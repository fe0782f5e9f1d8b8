"""Atomic file writes: a reader sees the old file or the new one, never half of either."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from collections.abc import Iterable, Iterator

from workers import commit

Content = str | bytes | Iterable[bytes]  # text, UTF-8 bytes, or such bytes in pieces


def write_text(path: str | os.PathLike[str], text: Content, durable: bool = True) -> None:
    """Write `text` (or bytes, already UTF-8, whole or as an iterable of pieces written as
    they come) to `path` via a temp file in the same folder, flush it to disk (through the
    process's group commit, workers/commit.py), then rename over it.

    `durable=False` skips the fsync: still atomic for any reader and through a killed
    process (the page cache outlives it), but an OS crash may bring the old file back.
    For state that can be derived again (a read-only tool's result, a stop reason).
    """
    target = os.fspath(path)
    tmp = _write_temp(target, text, fsync=False)
    try:
        if durable:  # with whatever other threads of this process save now: one flush
            _flushed(tmp, target)
        os.replace(tmp, target)
    except BaseException:
        _unlink(tmp)
        raise


def write_many(items: Iterable[tuple[str | os.PathLike[str], str | bytes]]) -> None:
    """Write many files atomically with one flush to disk instead of one fsync per file.

    Every temp file is written, then the filesystem is flushed once (`syncfs`), then each is
    renamed into place: each file is still old or new and complete, and all new contents are
    on disk before the first rename. A single-writer step that writes one file per ticket
    uses this (0.6 ms per fsync here against about 15 ms for one flush of 1,000 files).
    """
    with _renamed_into_place() as temps:
        for target, text in items:
            path = os.fspath(target)
            temps.append((_write_temp(path, text, fsync=False), path))
        commit.flush([tmp for tmp, _target in temps])  # one syncfs, where it can be trusted


@contextlib.contextmanager
def _renamed_into_place() -> Iterator[list[tuple[str, str]]]:
    """A list for (temp file, target) pairs, each temp renamed over its target in order when
    the block ends; if the block or a rename raises, every temp left is removed."""
    temps: list[tuple[str, str]] = []
    try:
        yield temps
        for tmp, path in temps:
            with _named(path):  # the temp's name would point at a file nobody knows
                os.replace(tmp, path)
    except BaseException:
        for tmp, _target in temps:
            _unlink(tmp)
        raise


def link_many(items: Iterable[tuple[str | os.PathLike[str], str | os.PathLike[str]]]) -> None:
    """Make each file `source`, already on disk (written durably), appear at `target` too.

    Each is hard-linked at `target`, or, if another file is there, under a temp name beside
    it and renamed over it, so a reader of `target` sees the old file or the new one, whole;
    then one fsync of each target folder puts the new names on disk. No data is written:
    the sources' contents were flushed when they were written. A target that is its source
    already is left as it is. Where a link cannot be made (`target` on another filesystem,
    or one without hard links) the file is copied instead, as `write_many` writes. On an
    error, every target holds a whole file, its old one or its new one. The two
    names are one file until either is replaced: write `target` again with `write_text` (a
    new file, as every write here makes), never in place.
    """
    published: list[str] = []
    copies: list[tuple[str, str]] = []
    with _renamed_into_place() as temps:
        for source, target in items:
            path = os.fspath(target)
            try:
                tmp = _link(os.fspath(source), path)
            except _NoLink:
                copies.append((os.fspath(source), path))
                continue
            published.append(path)
            if tmp is not None:
                temps.append((tmp, path))
    if copies:  # renamed before the folders' fsync below, which puts their names on disk too
        write_many((target, read_bytes(source)) for source, target in copies)
    targets = published + [target for _source, target in copies]
    for folder in dict.fromkeys(os.path.dirname(path) or "." for path in targets):
        try:
            commit.fsync_path(folder)
        except OSError as exc:  # a filesystem that syncs no folder (some FUSE ones) says so
            if exc.errno not in _NO_FOLDER_SYNC:
                raise


_NO_FOLDER_SYNC = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP}


class _NoLink(Exception):
    """No hard link can be made there: the caller copies."""


# What `link` answers where a hard link cannot be made but a copy can: another filesystem,
# a filesystem without hard links, a source with as many links as it may have.
_NO_LINK = {errno.EXDEV, errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK}


def _link(source: str, target: str) -> str | None:
    """A hard link to `source` at `target` if nothing is there, or if `target` is that file
    already (None); else under a new temp name beside `target`, returned for the caller to
    rename over it. `_NoLink` where no link can be made."""
    folder, name = os.path.split(target)
    made = False
    tmp = target
    while True:
        try:
            os.link(source, tmp)
            return None if tmp == target else tmp
        except FileExistsError:
            if tmp == target and os.path.samefile(source, target):
                return None  # published before (merge run again on resume)
            tmp = _temp_name(folder, name)
        except FileNotFoundError:
            if made or os.path.isdir(folder or "."):
                raise  # the source is gone
            os.makedirs(folder or ".", exist_ok=True)
            made = True
        except OSError as exc:
            if exc.errno in _NO_LINK:
                raise _NoLink from exc
            # The new name is what failed (a read-only or full target folder), not the
            # source the error names first.
            raise _naming(exc, target) from exc


def _write_temp(target: str, text: Content, fsync: bool) -> str:
    """`text` in a new temp file beside `target`, flushed to disk if `fsync`.

    Plain descriptor calls, not `tempfile` and a file object: a file object costs four more
    system calls (fstat, isatty, lseek), each of which hands the GIL to another thread, and
    `os.open`'s mode already honours the umask. Plain strings, not `pathlib`: every record
    write of every ticket comes here, and a Path parses itself again at each step. The
    folder is made only if it is missing.
    """
    pieces = (text.encode("utf-8"),) if isinstance(text, str) else text
    pieces = (pieces,) if isinstance(pieces, bytes) else pieces
    folder, name = os.path.split(target)
    made = False
    while True:
        tmp = _temp_name(folder, name)
        try:
            fd = os.open(tmp, _CREATE, 0o666)
        except FileNotFoundError:
            if made:
                raise
            os.makedirs(folder or ".", exist_ok=True)
            made = True
            continue
        except FileExistsError:  # another writer's name: draw again
            continue
        break
    try:
        for piece in pieces:  # a producer's own error (a record it read) goes out as it is
            write_all(fd, piece, target)
        if fsync:
            fsync_naming(fd, target)
    except BaseException:
        os.close(fd)
        _unlink(tmp)
        raise
    os.close(fd)
    return tmp


def _flushed(tmp: str, target: str) -> None:
    """`tmp` on disk through the group commit; a failed flush names `target`."""
    with _named(target):
        commit.flushed(tmp)


def _temp_name(folder: str, name: str) -> str:
    """A hidden temp name beside `name` in `folder`, random (a caller whose name is taken
    draws another)."""
    return os.path.join(folder, f".{name}.{secrets.token_hex(4)}.tmp")


def _unlink(path: str) -> None:
    """Remove a temp file that may not exist."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def write_all(fd: int, data: bytes, target: str) -> None:
    """All of `data` to `fd`; an error names `target`."""
    view = memoryview(data)
    with _named(target):
        while view:
            view = view[os.write(fd, view) :]


def fsync_naming(fd: int, target: str) -> None:
    """fsync `fd`; an error names `target`."""
    with _named(target):
        os.fsync(fd)


@contextlib.contextmanager
def _named(target: str) -> Iterator[None]:
    """An OSError raised in the block goes out naming `target` (`_naming`)."""
    try:
        yield
    except OSError as exc:
        raise _naming(exc, target) from exc


def _naming(exc: OSError, target: str) -> OSError:
    """A failed write() or fsync() names no file, a failed link() or rename() its source
    first: the same error, naming `target`."""
    return OSError(exc.errno, exc.strerror, str(target))


_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _CLOEXEC


def read_bytes(path: str | os.PathLike[str]) -> bytes:
    """A whole file's bytes with a descriptor: open, read, close (a file object adds fstat,
    isatty and lseek calls, each a hand-off of the GIL)."""
    fd = os.open(path, os.O_RDONLY | _CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, _CHUNK):
            chunks.append(chunk)
            if len(chunk) < _CHUNK:  # a regular file returned less: at its end
                break
        return b"".join(chunks)
    finally:
        os.close(fd)


_CHUNK = 1 << 16
