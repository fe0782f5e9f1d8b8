"""Count the file-system calls a process tree makes, with strace: what a run asks of the volume
its workspace sits on (on NFS each open, create, rename and sync is a round trip to the
server, and each sync a COMMIT).

`strace -f -ttt -y --seccomp-bpf -e trace=…` runs in front of the command: the seccomp
filter stops the tracee only at the calls traced, so the rest of the run goes at full speed.
Each line carries the thread's id, an epoch timestamp and, by `-y`, the path behind every
file descriptor; a call counts once, by its result (strace may split it into an
`<unfinished ...>` line and a `<... resumed>` one). A call is "on the workspace" when a path
it names (a string argument, made absolute against the descriptor before it; for a write or
a close, its descriptor's path alone) lies under the workspace, so the interpreter's
imports and /proc reads count apart. Writes count their bytes; a close counts as a flush
when its thread wrote the file and did not sync it since, since a Linux NFS client flushes
and COMMITs a file's data when it is closed. The trace goes to /dev/shm when there is one:
tmpfs has no writeback, so strace's own writes do not count in the run's `ru_oublock`.
"""

from __future__ import annotations

import re
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SYNCS = ("fsync", "fdatasync", "syncfs", "sync_file_range")
RENAMES = ("rename", "renameat", "renameat2")
OPENS = ("open", "openat", "openat2", "creat")
REMOVES = ("unlink", "unlinkat", "rmdir")
MKDIRS = ("mkdir", "mkdirat")
# Writes to files: on NFS their bytes go to the server in WRITE calls (buffered, not a round
# trip each). Sockets are written with send/sendto, so tracing these stops few calls.
WRITES = ("write", "pwrite64", "writev", "pwritev", "pwritev2")
# A Linux NFS client flushes a file's unwritten data and COMMITs it when the file is closed
# (close-to-open consistency): a file written and closed without fsync costs a COMMIT too.
CLOSES = ("close",)
FD_CALLS = (*WRITES, *CLOSES)  # calls judged by their descriptor alone
TRACED = (*SYNCS, *RENAMES, *OPENS, *REMOVES, *MKDIRS, *WRITES, *CLOSES)
TMPFS = Path("/dev/shm")
TOP_PATTERNS = 40  # the commonest call patterns kept in the raw data
# `12345 1733526000.123456 openat(AT_FDCWD, "/ws/x", O_RDONLY|O_CLOEXEC) = 3</ws/x>`
LINE = re.compile(r"^(?P<pid>\d+)\s+(?P<ts>\d+\.\d+)\s+(?P<call>\w+)\((?P<rest>.*)$")
RESUMED = re.compile(r"^(?P<pid>\d+)\s+\d+\.\d+\s+<\.\.\. \w+ resumed>.*\) = (?P<result>.*)$")
UNFINISHED = " <unfinished ...>"
WRITTEN_FD = re.compile(r"\d+<(/[^<>]*)>")  # a first argument `4</ws/runs/x>`
FLAGS = re.compile(r"\bO_[A-Z]+(?:\|O_[A-Z]+)*")
FOLDS = [
    (re.compile(r"^runs/[^/]+"), "runs/<run>"),
    (re.compile(r"T-\d+"), "T-#"),
    (re.compile(r"\.[A-Za-z0-9_]{6,}\.tmp$"), ".<tmp>.tmp"),
    (re.compile(r"tmp[a-z0-9_]{6,}"), "tmp<x>"),
]
# A descriptor's path (`3</ws/runs>`, `AT_FDCWD</ws>` by -y) or a string argument.
TOKEN = re.compile(r'<(?P<fd>/[^<>]*)>|"(?P<text>(?:[^"\\]|\\.)*)"')


def strace() -> str | None:
    """The strace on PATH, or None."""
    return shutil.which("strace")


def trace_dir(fallback: Path) -> Path:
    """Where trace files go: /dev/shm (tmpfs) if there is one, else `fallback`."""
    return TMPFS if TMPFS.is_dir() else fallback


def traced(argv: list[str], out: Path) -> list[str]:
    """`argv` under strace, following forks and threads, writing its trace to `out`."""
    binary = strace()
    if binary is None:
        raise RuntimeError("strace is not on PATH")
    calls = ",".join(TRACED)
    return [binary, "-f", "-qq", "-ttt", "-y", "--seccomp-bpf", "-e", f"trace={calls}",
            "-o", str(out), "--", *argv]  # fmt: skip


@dataclass
class Calls:
    """The traced calls of a stretch of a trace: all of them, and those on the workspace (by
    name, those that failed, and by path pattern)."""

    all: Counter[str] = field(default_factory=Counter)
    workspace: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)  # on the workspace, result -1
    # Creates that succeeded: exclusive ones (O_CREAT|O_EXCL), and opens with O_CREAT alone
    # (a fence, a file of versions, run.jsonl) of a path the trace never saw opened before.
    creates: int = 0
    maybe_creates: int = 0
    bytes_written: int = 0  # by the write calls on the workspace that succeeded
    close_flushes: int = 0  # closes of a file its thread wrote and did not sync since
    patterns: Counter[str] = field(default_factory=Counter)  # `call flags path` on the workspace

    def add(self, other: Calls) -> None:
        """Sum another stretch into this one."""
        for mine, theirs in self._counters(other):
            mine.update(theirs)
        self.creates += other.creates
        self.maybe_creates += other.maybe_creates
        self.bytes_written += other.bytes_written
        self.close_flushes += other.close_flushes

    def _counters(self, other: Calls) -> list[tuple[Counter[str], Counter[str]]]:
        return [
            (self.all, other.all),
            (self.workspace, other.workspace),
            (self.failed, other.failed),
            (self.patterns, other.patterns),
        ]

    def on_workspace(self, names: tuple[str, ...]) -> int:
        """Calls of any of `names` on the workspace."""
        return sum(self.workspace[name] for name in names)

    def anywhere(self, names: tuple[str, ...]) -> int:
        """Calls of any of `names`, wherever they point."""
        return sum(self.all[name] for name in names)

    def to_json(self) -> dict[str, Any]:
        """The counts by call name, and the most frequent patterns on the workspace."""
        return {
            "all": dict(self.all),
            "workspace": dict(self.workspace),
            "workspace_failed": dict(self.failed),
            "creates_exclusive": self.creates,
            "opens_with_o_creat_alone": self.maybe_creates,
            "bytes_written": self.bytes_written,
            "close_flushes": self.close_flushes,
            "top_patterns": dict(self.patterns.most_common(TOP_PATTERNS)),
        }


@dataclass(frozen=True)
class _Call:
    """One call as its first line shows it."""

    name: str
    arguments: str
    paths: list[str]
    thread: str  # strace's PID column: the thread's id under -f


def named(arguments: str) -> list[str]:
    """The paths a call's arguments name: each string, made absolute against the descriptor
    before it (`openat(AT_FDCWD</cwd>, "rel")`); a descriptor's own path where no string
    follows it (`fsync(3</ws/x>)`)."""
    paths: list[str] = []
    directory = None  # a descriptor not yet used by a string after it
    for token in TOKEN.finditer(arguments):
        if token["fd"] is not None:
            if directory is not None:
                paths.append(directory)
            directory = token["fd"]
            continue
        text = token["text"]
        paths.append(text if text.startswith("/") or directory is None else f"{directory}/{text}")
        directory = None
    return [*paths, directory] if directory is not None else paths


def on_descriptor(arguments: str) -> list[str]:
    """The file a write or close acts on: its descriptor's path (what a write writes may
    name paths too: a line of the CLI's output on a pipe is not a write to the workspace)."""
    fd = WRITTEN_FD.match(arguments)
    return [fd[1]] if fd else []


def count(trace: Path, roots: list[Path], since: float = 0.0, until: float = float("inf")) -> Calls:
    """The calls of `trace` that started between `since` and `until` (epoch seconds);
    "on the workspace" when a path they name is under one of `roots`. A call strace split
    (`<unfinished ...>`, then `<... resumed>` from the same PID) is judged by its result."""
    tally = _Tally({str(p) for root in roots for p in (root, root.resolve())})
    pending: dict[str, _Call] = {}
    with trace.open(encoding="utf-8", errors="replace") as lines:
        for line in lines:
            if (resumed := RESUMED.match(line)) is not None:
                if (call := pending.pop(resumed["pid"], None)) is not None:
                    tally.record(call, resumed["result"])
                continue
            match = LINE.match(line)
            if match is None or not since <= float(match["ts"]) <= until:
                continue  # a signal, an exit, or outside the stretch
            rest, name = match["rest"], match["call"]
            unfinished = rest.endswith(UNFINISHED)
            arguments = rest[: -len(UNFINISHED)] if unfinished else rest.rsplit(") = ", 1)[0]
            paths = on_descriptor(arguments) if name in FD_CALLS else named(arguments)
            call = _Call(name, arguments, paths, match["pid"])
            if unfinished:
                pending[match["pid"]] = call
            else:
                tally.record(call, rest.rsplit(") = ", 1)[-1])
    return tally.calls


@dataclass
class _Tally:
    """Counts calls into `calls`; knows which files each thread has written since it last
    synced them, to count the closes an NFS client turns into a flush and a COMMIT."""

    folders: set[str]
    calls: Calls = field(default_factory=Calls)
    dirty: set[tuple[str, str]] = field(default_factory=set)  # (thread, path)
    opened: set[str] = field(default_factory=set)  # every path opened so far

    def root_of(self, path: str) -> str | None:
        """The folder of `folders` that holds `path`, or None."""
        for folder in self.folders:
            if path == folder or path.startswith(f"{folder}/"):
                return folder
        return None

    def record(self, call: _Call, result: str) -> None:
        """Count one finished call."""
        calls = self.calls
        calls.all[call.name] += 1
        roots = [(path, root) for path in call.paths if (root := self.root_of(path))]
        if not roots:
            return
        path, root = roots[0]
        failed = result.lstrip().startswith("-1")
        calls.workspace[call.name] += 1
        calls.failed[call.name] += failed
        flushed = not failed and self._follow(call, path, result)
        flags = FLAGS.search(call.arguments)
        first = call.name in OPENS and path not in self.opened
        if call.name in OPENS:
            self.opened.add(path)
        if call.name in OPENS and flags and "O_CREAT" in flags[0]:
            if "O_EXCL" in flags[0]:
                calls.creates += not failed
            else:  # made here if its path was never opened before (the run folder is new):
                calls.maybe_creates += 1  # a fence, a file of versions' first save
                calls.creates += first and not failed
        shown = f"{call.name} {flags[0] if flags else ''} {pattern(path, root)}"
        outcome = " (failed)" if failed else " (flushes)" if flushed else ""
        calls.patterns[shown.replace("  ", " ") + outcome] += 1

    def _follow(self, call: _Call, path: str, result: str) -> bool:
        """Bytes written, and files written and not synced when their thread closes them;
        True for a close that flushes."""
        key = (call.thread, path)
        if call.name in WRITES:
            self.calls.bytes_written += int(result.split()[0])
            self.dirty.add(key)
        elif call.name in SYNCS:
            self.dirty.discard(key)
        elif call.name in CLOSES and key in self.dirty:
            self.dirty.discard(key)
            self.calls.close_flushes += 1
            return True
        return False


def pattern(path: str, root: str) -> str:
    """A path relative to the workspace with its ids folded: `runs/<run>/records/T-#.json`."""
    relative = path[len(root) :].lstrip("/") or "."
    for regex, replacement in FOLDS:
        relative = regex.sub(replacement, relative)
    return relative
