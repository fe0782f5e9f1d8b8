"""Who may write a run's files: a fence every save of the harness goes through.

The harness alone has nothing to fence against, so the base class lets every write through.
A caller that runs the same task more than once at a time (at-least-once delivery: a worker
stalled past its visibility timeout wakes beside the copy that replaced it) passes a fence
whose `held` raises `Superseded` once another copy has taken over; the loop then stops at
its next save or model call, and never writes a state the other copy would have to trust.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator

from workers import atomic, versions


class Fence:
    """The default fence: every write goes through (one process owns the files)."""

    def check(self) -> None:
        """Raise `Superseded` if this copy no longer holds its files (never, here)."""

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """The body runs only while this copy holds its files, and nobody takes them over
        until it ends; `Superseded` instead of running it otherwise."""
        yield

    def release(self) -> None:
        """Let go of what the fence keeps open for its holder (nothing, here)."""

    def write(
        self, path: str | os.PathLike[str], text: atomic.Content, durable: bool = True
    ) -> None:
        """`atomic.write_text`, while held."""
        with self.held():
            atomic.write_text(path, text, durable=durable)

    def append(self, path: str | os.PathLike[str], line: str, durable: bool = True) -> None:
        """`versions.append` (a new version of a file of versions), while held."""
        with self.held():
            versions.append(path, line, durable=durable)

    def write_many(self, items: Iterable[tuple[str | os.PathLike[str], str | bytes]]) -> None:
        """`atomic.write_many`, while held."""
        with self.held():
            atomic.write_many(items)

    def link_many(
        self, items: Iterable[tuple[str | os.PathLike[str], str | os.PathLike[str]]]
    ) -> None:
        """`atomic.link_many`, while held."""
        with self.held():
            atomic.link_many(items)


UNFENCED = Fence()
