"""Cancellation that reaches into tools: one token, shared by a run, its tools and sub-agents."""

from __future__ import annotations

import threading

from workers.errors import Cancelled


class CancelToken:
    """A one-way switch with a reason; waits on it wake the moment it is set."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason: str | None = None

    def cancel(self, reason: str = "cancelled") -> None:
        """Set the token; every wait on it returns at once."""
        if not self._event.is_set():
            self.reason = reason
            self._event.set()

    @property
    def cancelled(self) -> bool:
        """True once `cancel` was called."""
        return self._event.is_set()

    def check(self) -> None:
        """Raise `Cancelled` if the token is set."""
        if self._event.is_set():
            raise Cancelled(self.reason or "cancelled")

    def sleep(self, seconds: float) -> None:
        """Sleep up to `seconds`, raising `Cancelled` the moment the token is set."""
        if self._event.wait(seconds):
            raise Cancelled(self.reason or "cancelled")

    def cancel_after(self, seconds: float, reason: str) -> threading.Timer:
        """Cancel from a timer thread after `seconds` (used by the CLI's --cancel-after)."""
        timer = threading.Timer(seconds, self.cancel, args=(reason,))
        timer.daemon = True
        timer.start()
        return timer
