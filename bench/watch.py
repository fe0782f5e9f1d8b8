"""Run one command as a child process and measure it: wall time, peak memory, disk writes.

- Wall: from spawn to the child being reaped (`os.wait4`), so interpreter start, imports and
  shutdown count: what a cron job waits for.
- Peak RSS per process: a thread reads `VmHWM` (the kernel's high-water mark of resident
  memory) from /proc/<pid>/status of the child and of every descendant, every 0.2 s while it
  runs, keeping the last value per PID. A process that lives less than one interval can be
  missed; the high-water mark never goes down, so a late sample loses nothing earlier.
- Cross-checks from the kernel's accounting at reap time: `wait4`'s rusage of the child
  includes its reaped descendants (`ru_maxrss`: the largest of them; `ru_oublock`: their sum),
  and the `getrusage(RUSAGE_CHILDREN)` delta around the run gives the same `ru_oublock`.
  `ru_oublock` counts 512-byte units of file data written to the page cache (ext4 here).
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SAMPLE_INTERVAL_S = 0.2
BLOCK_BYTES = 512
GRACE_S = 10.0


@dataclass
class ProcessPeak:
    """The last-seen high-water mark of one process of the run."""

    pid: int
    role: str
    vmhwm_kib: int
    threads: int = 0  # the most threads it was seen with

    def to_json(self) -> dict[str, Any]:
        """PID, role, peak in MiB and the most threads seen."""
        peak = round(self.vmhwm_kib / 1024, 1)
        return {"pid": self.pid, "role": self.role, "peak_rss_mb": peak, "threads": self.threads}


@dataclass
class Watched:
    """A finished child process and what it cost."""

    argv: list[str]
    returncode: int
    wall_s: float
    maxrss_kib: int
    oublock: int
    children_oublock: int
    peaks: list[ProcessPeak]
    stdout: Path
    stderr: Path
    timed_out: bool = False
    # User + system CPU of the command and of every child it reaped (wait4's rusage): for an
    # embedded run, its Redis, worker processes and (in the CLI) the scripted provider.
    cpu_s: float = 0.0
    # The part of `cpu_s` spent in the kernel: on a filesystem where creating a file is
    # costly (ext4 without a journal, after many deletions) it is what grows.
    system_cpu_s: float = 0.0

    @property
    def largest_peak_mb(self) -> float | None:
        """The largest per-process peak RSS the sampler saw, in MiB."""
        return max((p.vmhwm_kib for p in self.peaks), default=0) / 1024 or None

    def tail(self, lines: int = 3) -> str:
        """The last lines of stderr (or stdout when stderr is empty), for a failure note."""
        for path in (self.stderr, self.stdout):
            text = path.read_text(encoding="utf-8", errors="replace").strip()
            if text:
                return " | ".join(text.splitlines()[-lines:])
        return "no output"

    def to_json(self) -> dict[str, Any]:
        """The figures of the process as JSON-ready data."""
        return {
            "returncode": self.returncode,
            "wall_s": round(self.wall_s, 3),
            "cpu_s": round(self.cpu_s, 3),
            "system_cpu_s": round(self.system_cpu_s, 3),
            "timed_out": self.timed_out,
            "ru_maxrss_mb": round(self.maxrss_kib / 1024, 1),
            "ru_oublock": self.oublock,
            "rusage_children_oublock_delta": self.children_oublock,
            "processes": [p.to_json() for p in self.peaks],
        }


@dataclass
class TreeSampler:
    """Samples VmHWM of a process and all its descendants on a background thread."""

    root: int
    interval_s: float = SAMPLE_INTERVAL_S
    peaks: dict[int, ProcessPeak] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)
        self._root_cmdline: list[str] = []  # read once exec has finished (empty before)

    def start(self) -> None:
        """Begin sampling."""
        self._thread.start()

    def stop(self) -> list[ProcessPeak]:
        """Stop sampling; the peaks seen, largest first."""
        self._stop.set()
        self._thread.join()
        return sorted(self.peaks.values(), key=lambda p: -p.vmhwm_kib)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def sample(self) -> None:
        """Read VmHWM of every process in the tree now."""
        for pid in descendants(self.root) | {self.root}:
            status = _status(pid)
            if status is None:
                continue
            hwm, threads = status
            known = self.peaks.get(pid)
            role = known.role if known and known.role else self._role(pid)
            most = max(threads, known.threads if known else 0)
            self.peaks[pid] = ProcessPeak(pid, role, hwm, most)

    def _role(self, pid: int) -> str:
        """What a process of the tree is, by its command line ("" until exec has finished)."""
        cmdline = _cmdline(pid)
        if not cmdline:
            return ""
        if pid == self.root:
            self._root_cmdline = cmdline
            return f"CLI ({_short(cmdline)})"
        self._root_cmdline = self._root_cmdline or _cmdline(self.root)
        if cmdline == self._root_cmdline:
            return "worker process, fork of the CLI"
        return _short(cmdline)


def run_watched(
    argv: list[str], cwd: Path, env: dict[str, str], logs: Path, timeout_s: float
) -> Watched:
    """Run `argv` to completion, sampling its process tree; output goes to files in `logs`."""
    logs.mkdir(parents=True, exist_ok=True)
    stdout, stderr = logs / "stdout.txt", logs / "stderr.txt"
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_oublock
    started = time.perf_counter()
    with stdout.open("wb") as out, stderr.open("wb") as err:
        child = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=err)
    sampler = TreeSampler(child.pid)
    sampler.start()
    stopper = _Stopper(child.pid, timeout_s)
    try:
        _, status, usage = os.wait4(child.pid, 0)
    finally:
        stopper.cancel()
    wall_s = time.perf_counter() - started
    peaks = sampler.stop()
    child.returncode = os.waitstatus_to_exitcode(status)  # wait4 reaped it, not Popen
    delta = resource.getrusage(resource.RUSAGE_CHILDREN).ru_oublock - before
    rusage = (usage.ru_maxrss, usage.ru_oublock, delta)
    return Watched(
        argv,
        child.returncode,
        wall_s,
        *rusage,
        peaks,
        stdout,
        stderr,
        timed_out=stopper.fired,
        cpu_s=usage.ru_utime + usage.ru_stime,
        system_cpu_s=usage.ru_stime,
    )


class _Stopper:
    """SIGTERM the child after the timeout (the CLI then stops its servers), SIGKILL later."""

    def __init__(self, pid: int, timeout_s: float) -> None:
        self.pid = pid
        self.fired = False
        self._timers = [
            threading.Timer(timeout_s, self._send, (signal.SIGTERM,)),
            threading.Timer(timeout_s + GRACE_S, self._send, (signal.SIGKILL,)),
        ]
        for timer in self._timers:
            timer.daemon = True
            timer.start()

    def _send(self, signum: int) -> None:
        self.fired = True
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signum)

    def cancel(self) -> None:
        """The child ended: no signal."""
        for timer in self._timers:
            timer.cancel()


def descendants(root: int) -> set[int]:
    """PIDs of every live descendant of `root`, from the parent PIDs in /proc/*/stat."""
    tree = _children_by_parent()
    found: set[int] = set()
    stack = [root]
    while stack:
        for child in tree.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def children(parent: int) -> list[int]:
    """PIDs of the live children of `parent`, oldest (lowest PID) first."""
    return sorted(_children_by_parent().get(parent, []))


def _children_by_parent() -> dict[int, list[int]]:
    """Every live process's PID under its parent's PID, from /proc/*/stat."""
    tree: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (ppid := _ppid(int(entry.name))) is not None:
            tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def written_bytes(pids: set[int]) -> dict[int, int]:
    """`write_bytes` of /proc/<pid>/io (the bytes `ru_oublock` counts in 512-byte units) of
    each live process of `pids`."""
    found = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/io", encoding="ascii") as io:
                found[pid] = next(int(x.split()[1]) for x in io if x.startswith("write_bytes:"))
        except (OSError, StopIteration, ValueError):
            continue
    return found


def _ppid(pid: int) -> int | None:
    """The parent PID from /proc/<pid>/stat (the field after state, after the `(comm)`)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _status(pid: int) -> tuple[int, int] | None:
    """(VmHWM in KiB, threads) of a live process, or None if it is gone (or a zombie, with
    no memory)."""
    hwm = threads = None
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    hwm = int(line.split()[1])
                elif line.startswith("Threads:"):
                    threads = int(line.split()[1])
    except (OSError, ValueError):
        return None
    return (hwm, threads or 0) if hwm is not None else None


def _cmdline(pid: int) -> list[str]:
    """The argv of a process, or [] if it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return [a.decode(errors="replace") for a in cmdline.read().split(b"\0") if a]
    except OSError:
        return []


def _short(argv: list[str]) -> str:
    """A readable name for a command line: `python -m module arg`, or the program's name."""
    # A process may rewrite its title into one string (redis-server does): split it again.
    words = " ".join(argv).split()
    if not words:
        return "?"
    program = Path(words[0]).name
    if program.startswith("python") and "-m" in words[1:2]:
        return " ".join(["python", *words[1:4]])
    return program
