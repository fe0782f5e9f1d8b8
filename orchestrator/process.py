"""A process's identity on this host: its PID and the time it started, so a PID the kernel
has given to another process since is not taken for it."""

from __future__ import annotations

import os
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
