"""The JSONL trace: one JSON object per line, each with `ts` and `run_id`.

Lines are appended with one `write` on an `O_APPEND` descriptor, so several threads or
processes can share one trace file without interleaving or losing lines. A process keeps the
descriptors of the last few trace files it wrote open (`_Appenders`): a ticket's task emits
about a dozen lines, and opening and closing the file for each cost three system calls, each
a hand-off of the GIL to another thread.
"""

from __future__ import annotations

import collections
import json
import os
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def now_iso() -> str:
    """UTC time in ISO 8601 with milliseconds."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Tracer:
    """Writes events to a JSONL file with fixed fields (run id, ticket, node) on every line."""

    def __init__(self, path: str | Path | None, run_id: str, **fields: Any) -> None:
        self.path = Path(path) if path else None
        self.fields: dict[str, Any] = {"run_id": run_id, **fields}

    def bind(self, **fields: Any) -> Tracer:
        """A tracer for the same file with more fixed fields."""
        return Tracer(self.path, **{**self.fields, **fields})

    def emit(self, event: str, **data: Any) -> None:
        """Append one event line."""
        if self.path is None:
            return
        line = json.dumps({"ts": now_iso(), **self.fields, "event": event, **data}, default=str)
        _APPENDERS.append(self.path, (line + "\n").encode("utf-8"))


class _Appenders:
    """Open `O_APPEND` descriptors of the trace files this process writes, the most recently
    used `size` of them; the oldest is closed when another file is opened.

    A line is written under the lock, so no descriptor is closed (and its number reused for
    another file) while a thread writes through it. A forked child keeps the descriptors (an
    appended line still lands whole) with a new lock. A trace file deleted while its run goes
    on is not made again: its run folder is gone too.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.fds: collections.OrderedDict[str, int] = collections.OrderedDict()
        self.lock = threading.Lock()

    def append(self, path: Path, data: bytes) -> None:
        """Append `data` to `path` in one write (the file and its folder made if missing)."""
        key = os.fspath(path)
        with self.lock:
            fd = self.fds.get(key)
            if fd is None:
                fd = self.fds[key] = _open_append(path)
                while len(self.fds) > self.size:
                    os.close(self.fds.popitem(last=False)[1])
            else:
                self.fds.move_to_end(key)
            os.write(fd, data)

    def close(self) -> None:
        """Close every descriptor (a test that removes its folders; never needed otherwise)."""
        with self.lock:
            while self.fds:
                os.close(self.fds.popitem()[1])

    def after_fork(self) -> None:
        self.lock = threading.Lock()


def _open_append(path: Path) -> int:
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
    try:
        return os.open(path, flags, 0o644)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, flags, 0o644)


_APPENDERS = _Appenders(size=16)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_APPENDERS.after_fork)


def read(path: str | Path) -> list[dict[str, Any]]:
    """All events of a trace file, parsed."""
    text = Path(path).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]
