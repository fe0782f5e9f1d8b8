"""A process's identity on this host: its PID and the time it started, so a PID the kernel
has given to another process since is not taken for it; and a free port for one to listen on."""

from __future__ import annotations

import os
import socket
from pathlib import Path


def started(pid: int) -> str:
    """The process's start time in clock ticks since boot ('' if it does not exist)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]  # field 22 counts from after the name


def alive(pid: int, since: str) -> bool:
    """True if `pid` is a live process that started at `since`."""
    return started(pid) == since != ""


def me() -> str:
    """This process, as `<pid> <start time>` (what `alive_at` reads back)."""
    return f"{os.getpid()} {started(os.getpid())}"


def alive_at(identity: str) -> bool:
    """True if the process `me()` described is still running."""
    pid, _, since = identity.strip().partition(" ")
    return pid.isdigit() and alive(int(pid), since)


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
