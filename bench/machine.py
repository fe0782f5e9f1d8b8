"""The machine a figure was measured on, and how busy it was while it was measured.

The development machine is shared and noisy (other sessions, CPU steal), so every figure
carries the load average and the share of CPU time stolen by the hypervisor over the
section that measured it; a figure is only comparable with figures of the same invocation.
"""

from __future__ import annotations

import os
import platform
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any

PROC_STAT_STEAL = 8  # index of `steal` among the numbers of the `cpu` line of /proc/stat


def describe(scratch: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Cores, CPU model, memory, kernel and Python version of this machine, and the
    filesystem the runs write to (`scratch`, a folder on it)."""
    found = {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_model": _cpu_model(),
        "mem_total_gib": round(_meminfo_kib("MemTotal") / 1024**2, 1),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
    }
    return found | ({"filesystem": filesystem(scratch)} if scratch is not None else {})


def filesystem(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """The mount `folder` is on (/proc/self/mountinfo): its type and device, and for ext4
    whether it has a journal. Every ticket writes files by temp file and rename; on ext4
    without a journal each new file skips the inodes freed in the last 60 to 360 s, so the
    same run costs more CPU right after many files were deleted (BENCHMARKS.md)."""
    path = os.path.realpath(folder)
    best: tuple[str, str, str, str] = ("", "", "unknown", "unknown")
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as mounts:
            for line in mounts:
                fields, _, rest = line.partition(" - ")
                ids, point = fields.split()[2], _unescaped(fields.split()[4])
                inside = path == point or path.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best[0]):
                    kind, source = rest.split()[:2]
                    best = (point, ids, kind, source)
    except OSError:
        return {"type": "unknown"}
    point, ids, kind, source = best
    found: dict[str, Any] = {"mount": point, "type": kind, "device": source}
    if kind == "ext4":
        found["journal"] = _has_journal(ids)
    return found


def _unescaped(field: str) -> str:
    """A mountinfo path with its octal escapes (space, tab, newline, backslash) undone."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _has_journal(ids: str) -> bool | None:
    """Whether the block device `ids` (major:minor) has a jbd2 journal: jbd2 names each
    journal after the kernel's name of its device (vda-8, dm-0-8), which the mount's source
    (/dev/root, /dev/mapper/...) need not be. None if it cannot be told."""
    try:
        device = os.path.basename(os.path.realpath(f"/sys/dev/block/{ids}"))
        journals = os.listdir("/proc/fs/jbd2") if os.path.isdir("/proc/fs/jbd2") else []
    except OSError:
        return None
    return any(name.rpartition("-")[0] == device for name in journals)


def one_line(machine: dict[str, Any]) -> str:
    """`2 × AMD EPYC, 23.5 GiB, Linux 6.x, Python 3.11.7` and, when known, the runs'
    filesystem (`ext4 without a journal`)."""
    line = (
        f"{machine['nproc']} × {machine['cpu_model']}, {machine['mem_total_gib']} GiB, "
        f"Linux {machine['kernel']}, Python {machine['python']}"
    )
    fs = machine.get("filesystem")
    if fs and fs.get("type") not in (None, "unknown"):
        journal = {True: " with a journal", False: " without a journal"}.get(fs.get("journal"))
        line += f", runs on {fs['type']}{journal or ''}"
    return line


def _cpu_model() -> str:
    """The `model name` of the first CPU in /proc/cpuinfo."""
    with open("/proc/cpuinfo", encoding="utf-8") as info:
        for line in info:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _meminfo_kib(key: str) -> int:
    """One field of /proc/meminfo, in KiB."""
    with open("/proc/meminfo", encoding="utf-8") as info:
        for line in info:
            if line.startswith(f"{key}:"):
                return int(line.split()[1])
    return 0


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages from /proc/loadavg."""
    with open("/proc/loadavg", encoding="ascii") as load:
        return [float(x) for x in load.read().split()[:3]]


def cpu_ticks() -> tuple[int, int]:
    """(steal, total) jiffies of all CPUs since boot, from /proc/stat."""
    with open("/proc/stat", encoding="ascii") as stat:
        numbers = [int(x) for x in stat.readline().split()[1:]]
    # guest and guest_nice are already counted in user and nice.
    return numbers[PROC_STAT_STEAL], sum(numbers[: PROC_STAT_STEAL + 1])


@dataclass
class LoadWindow:
    """Load average at the start and end of a stretch of work, and the CPU stolen in it."""

    started: float = field(default_factory=time.monotonic)
    loadavg_start: list[float] = field(default_factory=loadavg)
    ticks_start: tuple[int, int] = field(default_factory=cpu_ticks)

    def close(self) -> dict[str, Any]:
        """The load of the window as JSON-ready data."""
        steal, total = cpu_ticks()
        elapsed = total - self.ticks_start[1]
        stolen = steal - self.ticks_start[0]
        return {
            "loadavg_start": self.loadavg_start,
            "loadavg_end": loadavg(),
            "steal_pct": round(100 * stolen / elapsed, 1) if elapsed else 0.0,
            "wall_s": round(time.monotonic() - self.started, 1),
        }
