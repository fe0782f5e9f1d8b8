"""The JSONL trace: one JSON object per line, each with `ts` and `run_id`.

Lines are appended with one `write` on an `O_APPEND` descriptor, so several threads or
processes can share one trace file without interleaving or losing lines (a batch of lines,
whole lines at a time).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def now_iso() -> str:
    """UTC time in ISO 8601 with milliseconds."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# Opened and closed for each line: on a shared volume (NFS) a line reaches the other
# machines' readers (the waiting CLI) when its descriptor is closed, and O_APPEND lands
# at the end of the file only as far as this client knows it: open revalidates that, and
# close sends the line at once. A descriptor kept open for a ticket's step (#51, reverted)
# saved 7.7 opens and closes a ticket but let a step's lines wait in the client's cache,
# where another machine's appends at the same offset would overwrite them.
_APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)


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
        if self.path is None:
            return
        line = json.dumps({"ts": now_iso(), **self.fields, "event": event, **data}, default=str)
        if self._held is not None:
            self._held.append(line + "\n")
        else:
            self._append(line + "\n")

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

    def _append(self, text: str) -> None:
        """`text` (whole lines) at the end of the file, in one write."""
        assert self.path is not None
        try:
            fd = os.open(self.path, _APPEND, 0o644)
        except FileNotFoundError:  # the first line of a run: its folder is made here
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            fd = os.open(self.path, _APPEND, 0o644)
        try:
            data = text.encode("utf-8")
            while data:  # a regular file takes it whole; a short write goes on after it
                data = data[os.write(fd, data) :]
        finally:
            os.close(fd)


_LINES_A_WRITE = 512  # lines of a batch in one write: another writer's line waits no longer


def read(path: str | Path) -> list[dict[str, Any]]:
    """All events of a trace file, parsed."""
    text = Path(path).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]
