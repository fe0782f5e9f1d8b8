"""The agent-harness chapter's tool catalog over one folder: list, read, delete (needs
approval), append a note (a write), and a slow archive scan that reports progress and honours
cancellation.
"""

from __future__ import annotations

import stat
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, Field

from workers.errors import PermanentToolError, ToolError
from workers.tools import NoArgs, Tool, ToolContext

DEMO_FILES = {
    "errors.log": (
        "2026-09-06T10:00:01Z ERROR worker 7 timed out after 30000 ms\n"
        "2026-09-06T10:00:02Z ERROR retry 1 of job 4411 failed: upstream timeout\n"
        "2026-09-06T10:00:05Z WARN queue depth 1200 above threshold 1000\n"
        "2026-09-06T10:01:12Z ERROR worker 3 lost connection to broker; reconnecting\n"
    ),
    "access.log": "GET /health 200 2ms\nGET /api/jobs 200 41ms\n",
    "notes.txt": "Remember to rotate your logs.\n",
    "private/keys.txt": "this file is off limits to the agent\n",
}
DENIED_PREFIXES = ("private/",)
ARCHIVE_FILES = 1200
ARCHIVE_SECONDS = 3.0
ARCHIVE_PROGRESS_EVERY = 200


class PathArgs(BaseModel):
    """A path relative to the workspace."""

    path: str = Field(description="file name relative to the workspace, e.g. errors.log")


class NoteArgs(BaseModel):
    """The text of a note."""

    text: str = Field(description="one line to append to notes.txt")


def make_demo_workspace(root: Path) -> Path:
    """Create the chapter's files under `root` (errors.log is the largest); return `root`."""
    for name, text in DEMO_FILES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


class ChapterFolder:
    """The folder the file tools may see; paths outside it or under private/ are refused."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.deleted: list[str] = []

    def resolve(self, rel: str) -> Path:
        """The absolute path of `rel`, refusing anything the agent may not touch."""
        path = (self.root / rel).resolve()
        if not path.is_relative_to(self.root):
            raise PermanentToolError(f"permission denied: {rel} is outside the workspace")
        if path.relative_to(self.root).as_posix().startswith(DENIED_PREFIXES):
            raise PermanentToolError(f"permission denied: {rel}")
        return path

    def existing(self, rel: str) -> Path:
        """Like `resolve`, but the file must exist."""
        path = self.resolve(rel)
        if not path.is_file():
            raise ToolError(f"no such file: {rel}. Call list_files to see what exists.")
        return path

    def list_files(self, _args: NoArgs, _ctx: ToolContext) -> str:
        """An `ls -l`-like listing of the visible files: mode, size, modified time, name."""
        rows = []
        for path in sorted(self.root.iterdir()):
            if path.is_file():
                info = path.stat()
                when = datetime.fromtimestamp(info.st_mtime, UTC).strftime("%Y-%m-%d %H:%M")
                rows.append(f"{stat.filemode(info.st_mode)} {info.st_size:>6} {when} {path.name}")
        return "\n".join(rows) or "(no files)"

    def read_file(self, args: PathArgs, _ctx: ToolContext) -> str:
        """The text of one file."""
        return self.existing(args.path).read_text(encoding="utf-8")

    def delete_file(self, args: PathArgs, _ctx: ToolContext) -> str:
        """Delete one file."""
        self.existing(args.path).unlink()
        self.deleted.append(args.path)
        return f"deleted {args.path}"

    def append_note(self, args: NoteArgs, _ctx: ToolContext) -> str:
        """Append one line to notes.txt."""
        with self.resolve("notes.txt").open("a", encoding="utf-8") as handle:
            handle.write(args.text + "\n")
        return "appended 1 line to notes.txt"

    def scan_archive(self, _args: NoArgs, ctx: ToolContext) -> str:
        """Scan the (simulated) archive slowly, reporting progress; a cancel stops it at once."""
        step = ARCHIVE_SECONDS / (ARCHIVE_FILES / ARCHIVE_PROGRESS_EVERY)
        for done in range(ARCHIVE_PROGRESS_EVERY, ARCHIVE_FILES + 1, ARCHIVE_PROGRESS_EVERY):
            ctx.cancel.sleep(step)
            ctx.progress(f"scanned {done} of {ARCHIVE_FILES} files")
        return f"scanned {ARCHIVE_FILES} files; none mention a timeout"

    def tools(self) -> list[Tool]:
        """The catalog over this workspace."""
        return [
            Tool(
                "list_files", "List the files in the workspace with their sizes.", self.list_files
            ),
            Tool("read_file", "Read one file of the workspace.", self.read_file, PathArgs),
            Tool(
                "delete_file",
                "Delete one file of the workspace (a human must approve).",
                self.delete_file,
                PathArgs,
                read_only=False,
                needs_approval=True,
            ),
            Tool(
                "append_note",
                "Append a line to notes.txt.",
                self.append_note,
                NoteArgs,
                read_only=False,
            ),
            Tool("scan_archive", "Scan the log archive (slow).", self.scan_archive),
        ]
