"""The inbox: which files to claim, what each claimed file is, and why a bad one was refused.

Files are never moved here; the runner renames each claimed file into its run's folder and
calls `inspect` on it there. A file is looked at in this order, each step only if the one
before passed, so nothing is opened that could hang or leak and nothing big is read:

    lstat ─ symlink ───────────────────────────────► Rejection (never followed)
          ─ directory / FIFO / socket / device ────► Rejection (never opened)
          ─ name: format by extension, id by stem ─► Rejection
          ─ size over max_bytes ───────────────────► Rejection (never read)
    open (O_NOFOLLOW | O_NONBLOCK), read ─► NUL bytes, decode, blank ─► Rejection
                                        ─► parse by format (ticketfile) ─► Ticket | Rejection
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import os
import stat
from pathlib import Path
from typing import BinaryIO, Literal

from pydantic import BaseModel, ConfigDict, Field, field_serializer

from orchestrator.errors import InboxError, UsageError
from orchestrator.intake import ticketfile
from orchestrator.intake.ticketfile import Problem, RejectKind, shown
from workers import atomic
from workers.trace import now_iso

__all__ = [
    "InboxRules",
    "RejectKind",
    "Rejection",
    "Ticket",
    "claimable",
    "dedupe",
    "inspect",
    "reason_name",
    "route_text",
    "write_reason",
]

# O_NOFOLLOW: a file swapped for a link after lstat fails (ELOOP) instead of being followed;
# O_NONBLOCK: one swapped for a FIFO opens at once instead of waiting for a writer.
OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# Bytes in one file name on Linux and macOS filesystems, less room for the temp-file name
# that atomic.write_text builds around it (".<name>.<8 random>.tmp").
REASON_NAME_MAX = 255 - 16
ROUTE_MARKER = " […]"

_FILE_TYPES = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


class InboxRules(BaseModel):
    """What the inbox accepts and how much of a ticket routing sees (the [inbox] table)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_bytes: int = Field(default=64 * 1024, ge=1, description="a bigger file is never read")
    route_chars: int = Field(default=2000, ge=40, description="ticket text in the routing prompt")
    settle_s: float = Field(default=1.0, ge=0, description="files this fresh wait for a later run")
    id_header: str = Field(
        default="X-Ticket-Id", pattern=r"^[!-9;-~]+$", description=".eml header naming the id"
    )


class Ticket(BaseModel):
    """One ticket as the graph needs it, and the file it came from."""

    model_config = ConfigDict(frozen=True)

    id: str
    text: str
    name: str = Field(description="the file's name as it was in inbox/")
    format: Literal["txt", "md", "json", "eml"]
    encoding: str = Field(description='the text\'s encoding as Python names it, e.g. "cp1252"')
    subject: str | None = None
    sender: str | None = None


class Rejection(BaseModel):
    """A file that cannot be a ticket: its name, why in one word, and why in one sentence."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(description="the file's name; may hold lone surrogates (non-UTF-8 bytes)")
    kind: RejectKind
    reason: str

    @field_serializer("name")
    def _name_as_text(self, name: str) -> str:
        """The name with bytes that are not UTF-8 written as `\\xff`, so it can be saved."""
        return os.fsencode(name).decode("utf-8", "backslashreplace")


def claimable(inbox: Path, now: float, limits: InboxRules) -> list[str]:
    """Names in `inbox` to try to claim, sorted: all but dotfiles and files changed just now.

    A dotfile is still being written (the maildir convention: write `.name`, then rename it);
    an entry whose mtime is within `settle_s` of `now` is left for the next run, not rejected.
    Only lstat is used: nothing is opened or followed, so FIFOs, sockets, devices, directories
    and symlinks are listed, to be claimed and then rejected by `inspect`.
    """
    try:
        with os.scandir(inbox) as listing:
            entries = list(listing)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise UsageError(
            f"no inbox folder at {inbox}: is {inbox.parent} a workspace? "
            f"(`ticketgraph init {inbox.parent}` makes one)"
        ) from exc
    except OSError as exc:
        raise InboxError(f"cannot list the inbox folder {inbox}: {exc.strerror}") from exc
    names = (e.name for e in entries if not e.name.startswith(".") and _settled(e, now, limits))
    return sorted(names)


def unsettled(inbox: Path, now: float, rules: InboxRules) -> tuple[int, float | None]:
    """How many entries of `inbox` wait out `settle_s` (changed too recently to be claimed),
    and the epoch time from which the last of them can be claimed (None: none waits)."""
    try:
        with os.scandir(inbox) as listing:
            entries = [e for e in listing if not e.name.startswith(".")]
    except OSError:
        return 0, None
    waiting = []
    for entry in entries:
        try:
            mtime = entry.stat(follow_symlinks=False).st_mtime
        except OSError:
            continue
        if abs(now - mtime) < rules.settle_s:
            waiting.append(mtime + rules.settle_s)
    return len(waiting), max(waiting, default=None)


def _settled(entry: os.DirEntry[str], now: float, limits: InboxRules) -> bool:
    """Whether an entry's own mtime (not its target's) is at least `settle_s` away from `now`."""
    try:
        mtime = entry.stat(follow_symlinks=False).st_mtime
    except FileNotFoundError:  # claimed by another run since the listing
        return False
    # Both directions: a file dated in the future (a skewed clock) is not held back forever.
    return abs(now - mtime) >= limits.settle_s


def inspect(path: Path, limits: InboxRules) -> Ticket | Rejection:
    """Decide what one claimed file is: a ticket, or a rejection naming the file and why."""
    found = _inspect(path, limits)
    if isinstance(found, Problem):
        return Rejection(name=path.name, kind=found.kind, reason=_reason(path.name, found))
    return found


def _inspect(path: Path, limits: InboxRules) -> Ticket | Problem:
    """The ladder of checks in the module docstring; the first failing step gives the problem."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        return _unreadable(exc)
    problem = _type_problem(info.st_mode)
    if problem is not None:
        return problem
    named = ticketfile.split_name(path.name)
    if isinstance(named, Problem):
        return named
    if info.st_size > limits.max_bytes:
        return _too_big(info.st_size, limits)
    raw = _read(path, limits)
    if isinstance(raw, Problem):
        return raw
    fmt, stem = named
    parsed = ticketfile.parse(raw, fmt, stem, limits.id_header)
    if isinstance(parsed, Problem):
        return parsed
    return Ticket(name=path.name, format=fmt, **dataclasses.asdict(parsed))


def _type_problem(mode: int) -> Problem | None:
    """A symlink or anything but a regular file, by its lstat mode; None for a regular file."""
    if stat.S_ISLNK(mode):
        return _symlink()
    if stat.S_ISREG(mode):
        return None
    what = next((name for test, name in _FILE_TYPES if test(mode)), "a special file")
    detail = f"is {what}, not a regular file; it was not opened (tickets must be regular files)"
    return Problem(RejectKind.NOT_REGULAR_FILE, detail)


def _symlink() -> Problem:
    """The problem of a symbolic link, seen by lstat or by O_NOFOLLOW's ELOOP."""
    detail = "is a symbolic link; tickets must be regular files (links are never followed)"
    return Problem(RejectKind.SYMLINK, detail)


def _too_big(size: int, limits: InboxRules) -> Problem:
    """The problem of a file over the size cap."""
    detail = f"is {size:,} bytes, over the {limits.max_bytes:,}-byte cap ([inbox] max_bytes)"
    return Problem(RejectKind.TOO_BIG, detail)


def _unreadable(exc: OSError) -> Problem:
    """The problem of a file the OS would not let us look at or read."""
    return Problem(RejectKind.UNREADABLE, f"could not be read ({exc.strerror or exc})")


def _read(path: Path, limits: InboxRules) -> bytes | Problem:
    """At most `max_bytes` of a regular file, opened so that a swapped-in link or FIFO fails."""
    try:
        fd = os.open(path, OPEN_FLAGS)
    except OSError as exc:
        return _symlink() if exc.errno == errno.ELOOP else _unreadable(exc)
    try:
        with os.fdopen(fd, "rb") as handle:
            return _read_open(handle, limits)
    except OSError as exc:
        return _unreadable(exc)


def _read_open(handle: BinaryIO, limits: InboxRules) -> bytes | Problem:
    """The bytes of an open file, if it is (still) a regular file within the cap."""
    # It may have been replaced since lstat: look again at what is actually open.
    problem = _type_problem(os.fstat(handle.fileno()).st_mode)
    if problem is not None:
        return problem
    raw = handle.read(limits.max_bytes + 1)
    if len(raw) > limits.max_bytes:  # it grew since lstat
        return _too_big(os.fstat(handle.fileno()).st_size, limits)
    return raw


def _reason(name: str, problem: Problem) -> str:
    """One sentence a person can act on: the file's name, then what is wrong with it."""
    return f"{shown(name)} {problem.detail}"


def dedupe(tickets: list[Ticket]) -> tuple[list[Ticket], list[Rejection]]:
    """Keep one ticket per id (the first by file name); reject each later one, naming the first.

    Ids that differ only in case count as the same: on a case-insensitive volume their files
    in the run's folder and in out/ would be one file.
    """
    kept: dict[str, Ticket] = {}
    rejected: list[Rejection] = []
    for ticket in sorted(tickets, key=lambda t: t.name):
        first = kept.setdefault(ticket.id.lower(), ticket)
        if first is not ticket:
            rejected.append(_duplicate(ticket, first))
    return list(kept.values()), rejected


def _duplicate(ticket: Ticket, first: Ticket) -> Rejection:
    """The rejection of a ticket whose id an earlier file in the claim already has."""
    detail = (
        f"has the ticket id {ticket.id}, which {shown(first.name)} already has in this claim "
        f"(the first file by name keeps it); give it another id"
    )
    problem = Problem(RejectKind.DUPLICATE_ID, detail)
    return Rejection(name=ticket.name, kind=problem.kind, reason=_reason(ticket.name, problem))


def write_reason(path: Path, rejection: Rejection, run_id: str) -> Path:
    """Write the reason file `path` (reason, kind, the file's name, run id, UTC time) for a
    file going to quarantine (`reason_name` names it)."""
    lines = [
        f"reason: {rejection.reason}",
        f"kind: {rejection.kind.value}",
        f"file: {shown(rejection.name)}",
        f"run: {run_id}",
        f"at: {now_iso()}",
    ]
    atomic.write_text(path, "\n".join(lines) + "\n")
    return path


def reason_name(name: str, taken: set[str]) -> str:
    """The name of `name`'s reason file: `<name>.reason`, unless that is a name in `taken`
    (the run's own files: a customer's `T-1.txt.reason` beside a bad `T-1.txt`) or too long;
    then the name (cut short to fit REASON_NAME_MAX bytes) and a hash of the whole name,
    `<name>~<hash>.reason`, so two long names that differ only at the end get two files."""
    suffix = ".reason"
    plain = name + suffix
    if len(os.fsencode(plain)) <= REASON_NAME_MAX and plain not in taken:
        return plain
    whole = os.fsencode(name)
    digest = hashlib.sha256(whole).hexdigest()[:12]
    n = 0
    while True:  # a second number only if a file of the run has this very name
        tail = f"~{digest}{f'-{n}' if n else ''}{suffix}"
        candidate = os.fsdecode(whole[: REASON_NAME_MAX - len(tail)]) + tail
        if candidate not in taken:
            return candidate
        n += 1


def route_text(text: str, route_chars: int) -> str:
    """A ticket's text cut to `route_chars` characters, on a word boundary if one is near.

    One long ticket then cannot crowd the others out of the single routing prompt.
    """
    if len(text) <= route_chars:
        return text
    cut = text[: max(route_chars - len(ROUTE_MARKER), 1)]
    boundary = max(cut.rfind(" "), cut.rfind("\n"), cut.rfind("\t"))
    if boundary > len(cut) // 2:  # a word boundary not too far back; else cut mid-word
        cut = cut[:boundary]
    return cut.rstrip() + ROUTE_MARKER
