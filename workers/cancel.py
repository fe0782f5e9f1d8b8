"""Cancellation that reaches into tools: one token, shared by a run, its tools and sub-agents."""

from __future__ import annotations

import threading
from collections.abc import Callable

from workers.errors import Cancelled


class CancelToken:
    """A one-way switch with a reason; waits on it wake the moment it is set, and what was
    registered with `on_cancel` (a request's socket to cut, say) runs then."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: dict[int, Callable[[], None]] = {}
        self._next = 0
        self.reason: str | None = None

    def cancel(self, reason: str = "cancelled") -> None:
        """Set the token; every wait on it returns at once and every callback runs (in the
        caller's thread)."""
        with self._lock:
            if self._event.is_set():
                return
            self.reason = reason
            self._event.set()
            callbacks, self._callbacks = list(self._callbacks.values()), {}
        for callback in callbacks:
            callback()

    def on_cancel(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Run `callback` when the token is set (at once, if it is); returns what removes it."""
        with self._lock:
            if not self._event.is_set():
                key, self._next = self._next, self._next + 1
                self._callbacks[key] = callback
                return lambda: self._remove(key)
        callback()
        return lambda: None

    def _remove(self, key: int) -> None:
        with self._lock:
            self._callbacks.pop(key, None)

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
