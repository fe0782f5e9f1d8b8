"""The JSONL trace: one JSON object per line, each with `ts` and `run_id`.

Lines are appended with one `write` on an `O_APPEND` descriptor, so several threads or
processes can share one trace file without interleaving or losing lines (a batch of lines,
whole lines at a time). A line is written when it is emitted: a killed process loses none.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def now_iso() -> str:
    """UTC time in ISO 8601 with milliseconds."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


_APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
_kept = threading.local()  # `.fds`: trace file -> its descriptor, inside a `kept_open` block


@contextlib.contextmanager
def kept_open() -> Iterator[None]:
    """Inside the block, a trace file this thread appends to is opened at its first line and
    closed when the block ends, instead of being opened and closed for every line: a
    ticket's step traces about five lines, and their opens were a fifth of the file opens
    a ticket made.

    Each line is still written as it is emitted. What waits for the block's end is the
    close, and on a shared volume (NFS) the close is what hands a line to readers on other
    machines (close-to-open consistency): there they see a step's lines when it ends.
    Lines a reader waits for in the middle of a step go out with `Tracer.emit_live`.
    """
    if getattr(_kept, "fds", None) is not None:  # inside another block: that one closes
        yield
        return
    _kept.fds = {}
    try:
        yield
    finally:
        fds, _kept.fds = _kept.fds, None
        for fd in fds.values():
            os.close(fd)


class Tracer:
    """Writes events to a JSONL file with fixed fields (run id, ticket, node) on every line."""

    def __init__(self, path: str | Path | None, run_id: str, **fields: Any) -> None:
        # A plain string: a tracer is made for each ticket's task, and every line opens it.
        self.path = os.fspath(path) if path else None
        self.fields: dict[str, Any] = {"run_id": run_id, **fields}
        self._held: list[str] | None = None  # lines a `batched` block appends at its end

    def bind(self, **fields: Any) -> Tracer:
        """A tracer for the same file with more fixed fields."""
        return Tracer(self.path, **{**self.fields, **fields})

    def emit(self, event: str, **data: Any) -> None:
        """Append one event line."""
        self._emit(event, data, live=False)

    def emit_live(self, event: str, **data: Any) -> None:
        """Append one event line that readers on other machines wait for while the step
        runs: its file is closed after it even inside a `kept_open` block (and opened again
        by the next line)."""
        self._emit(event, data, live=True)

    def _emit(self, event: str, data: dict[str, Any], live: bool) -> None:
        if self.path is None:
            return
        line = json.dumps({"ts": now_iso(), **self.fields, "event": event, **data}, default=str)
        if self._held is not None:
            self._held.append(line + "\n")
        else:
            self._append(line + "\n", live)

    @contextlib.contextmanager
    def batched(self) -> Iterator[Tracer]:
        """A tracer like this one whose lines are appended together when the block ends
        (raised or not), each with the time it was emitted: a whole-run step that traces a
        line per ticket opens the file once, not once a ticket (1,000 opens in a row were
        a third of merge's time at N = 1,000)."""
        held = Tracer(self.path, **self.fields)
        held._held = []
        try:
            yield held
        finally:
            lines, held._held = held._held, None  # a line emitted after the block goes out
            if self._held is not None:  # inside another batch: its lines join that one
                self._held.extend(lines)
            else:
                for start in range(0, len(lines), _LINES_A_WRITE):
                    self._append("".join(lines[start : start + _LINES_A_WRITE]))

    def _append(self, text: str, live: bool = False) -> None:
        """`text` (whole lines) at the end of the file, in one write; the file is left open
        inside a `kept_open` block unless the text is `live`."""
        assert self.path is not None
        kept: dict[str, int] | None = getattr(_kept, "fds", None)
        fd = kept.pop(self.path, None) if kept is not None else None
        if fd is None:
            fd = _open(self.path)
        try:
            data = text.encode("utf-8")
            while data:  # a regular file takes it whole; a short write goes on after it
                data = data[os.write(fd, data) :]
        except BaseException:
            os.close(fd)
            raise
        if kept is None or live:
            os.close(fd)
        else:
            kept[self.path] = fd


def _open(path: str) -> int:
    try:
        return os.open(path, _APPEND, 0o644)
    except FileNotFoundError:  # the first line of a run: its folder is made here
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        return os.open(path, _APPEND, 0o644)


_LINES_A_WRITE = 512  # lines of a batch in one write: another writer's line waits no longer


def read(path: str | Path) -> list[dict[str, Any]]:
    """All events of a trace file, parsed."""
    text = Path(path).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]
