"""A file of versions: a state that is saved again and again (a ticket's record, an agent's
state after each turn) appended to its file as one line a version, the newest line the
state.

Replacing the file at each save (a temp file, renamed over the old one) makes a new file
and deletes one every time: on ext4 without a journal every new inode is found by scanning
past those deleted in the last minute, and that scan was a quarter of a 1,000-ticket run's
CPU (18% of its samples, #51); on NFS a create and a rename are two synchronous round
trips. An append is neither: the file is made once (its first version written whole, so a
writer killed then leaves no file rather than an empty one), and every later save is one
write and one fsync.

A reader sees the old state or the new one, never half of either: a version counts once its
line is whole (it ends with a newline, and parses), and a writer killed mid-line leaves a
torn line that every reader skips (each version starts on a line of its own, so the next
one is not glued to it; a torn line is never JSON, and a whole line that is JSON but
does not validate is an error, not a reason to load the version before it). A file written
whole (pretty-printed JSON, as every state was before versions, or by `atomic.write_text`)
is read as its one version until a line is appended, and after a torn one. The file is
rewritten with its newest version alone once the older ones outweigh it (`COMPACT_AT`).
A save moves its folder's modification time, as a rename does: the web view and the
people's queue watch folders, not files, to know what changed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from workers import atomic

T = TypeVar("T")

# A file that has grown past this many bytes and past COMPACT_RATIO times its newest
# version is rewritten (atomically) with that version alone.
COMPACT_AT = 64 * 1024
COMPACT_RATIO = 8

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_APPEND = os.O_WRONLY | os.O_APPEND | _CLOEXEC


def append(path: str | os.PathLike[str], line: str | bytes, durable: bool = True) -> None:
    """Save `line` (one line of JSON: no newline in it) as the newest version of `path`,
    flushed to disk unless not `durable` (then, like `atomic.write_text(durable=False)`,
    it outlives a killed process but maybe not an OS crash)."""
    data = line.encode("utf-8") if isinstance(line, str) else line
    if b"\n" in data:
        raise ValueError("a version is one line: serialise it without newlines")
    version = b"\n" + data + b"\n"  # a newline first: a torn line before it ends there
    target = os.fspath(path)
    try:
        fd = os.open(target, _APPEND)
    except FileNotFoundError:
        # The first version is written whole (temp file, rename): a writer killed before it
        # is done leaves no file, never an empty one or one holding a torn line alone.
        atomic.write_text(target, version, durable=durable)
        return
    folder = os.path.dirname(target) or "."
    try:
        # The folder's time moves before the line and after it: a watcher that reads the
        # old line meanwhile sees the time move again, and a writer killed after its line
        # has moved it already.
        os.utime(folder)
        atomic.write_all(fd, version, target)
        if durable:
            atomic.fsync_naming(fd, target)
        size = os.lseek(fd, 0, os.SEEK_CUR)
    finally:
        os.close(fd)
    if size > COMPACT_AT and size > COMPACT_RATIO * len(version):
        # Durable whatever this save asked: it replaces older versions that were.
        atomic.write_text(target, version)
    else:
        os.utime(folder)


def newest(data: bytes, parse: Callable[[bytes], T]) -> T:
    """The newest version in a file's bytes, parsed by `parse` (which raises ValueError, as
    json.loads and pydantic do, for what it cannot take).

    Only a torn line is passed over for an older version: one that is not JSON at all. A
    whole line that `parse` refuses (damaged, or edited by hand) is the file's newest
    version all the same, and its error is raised: falling back to the version before it
    would quietly undo a save (an agent's paid turn, a verdict)."""
    error: ValueError | None = None
    for version in _newest_first(data):
        try:
            return parse(version)
        except ValueError as exc:
            if _whole_json(version):
                raise
            error = exc
    raise error or ValueError("empty file: no version in it")


def _whole_json(version: bytes) -> bool:
    try:
        json.loads(version)
    except ValueError:
        return False
    return True


def read(path: str | os.PathLike[str], parse: Callable[[bytes], T]) -> T:
    """`newest` of the file at `path` (FileNotFoundError if there is none)."""
    return newest(atomic.read_bytes(path), parse)


def read_json(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The newest version at `path` that is a JSON object, parsed."""
    return read(path, _object)


def _object(version: bytes) -> dict[str, Any]:
    parsed = json.loads(version)
    if not isinstance(parsed, dict):
        raise ValueError("not a JSON object")
    return parsed


def _newest_first(data: bytes) -> Iterator[bytes]:
    """Each whole line of `data` that starts a JSON object, newest first; then what was
    written whole before the first appended line (a state pretty-printed before versions:
    none of its lines is JSON on its own)."""
    end = data.rfind(b"\n") + 1  # what follows the last newline is a torn line, or nothing
    while end > 0:
        start = data.rfind(b"\n", 0, end - 1) + 1
        if data.startswith(b"{", start):
            yield data[start : end - 1]
        end = start
    appended = data.find(b"\n{")
    yield data if appended < 0 else data[:appended]
