"""What failing to listen means to a command that serves HTTP (flower, web): a bad
--address or a taken --port is the operator's to fix, so a configuration error naming them
(exit 78), not a crash."""

from __future__ import annotations

import contextlib
import errno
import socket
from collections.abc import Iterator

from orchestrator.errors import ConfigError

# Errors of binding the listening socket that the operator can fix with --address or --port.
_CANNOT_LISTEN = {errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES}


@contextlib.contextmanager
def listening_on(address: str, port: int) -> Iterator[None]:
    """Around binding a server's socket: the socket failing becomes a `ConfigError` that
    names the address and port; any other OSError goes on as it is."""
    try:
        yield
    except OSError as exc:
        if not _cannot_listen(exc):
            raise
        why = exc.strerror or str(exc)
        raise ConfigError(f"cannot listen on {address}:{port}: {why}") from None


def _cannot_listen(exc: OSError) -> bool:
    """Whether `exc` is the listening socket failing (a bad --address or a taken --port)."""
    if isinstance(exc, socket.gaierror):
        return True
    return exc.filename is None and exc.errno in _CANNOT_LISTEN
