"""What a worker's tools may read: a few named folders or files of the workspace, never more.

Each worker gets an explicit list of readable roots (`reads` in its `[workers.<category>]`
table; the demo: kb/ for bug, data/orders.json for billing), and its tools reach them only
through `ToolContext.files`, a `Sandbox`. The workspace root itself, inbox/ (other
customers' tickets), runs/, out/, quarantine/ and dotfiles (.env) are never roots. A path a
model asks for is checked twice: as written (relative, no `..`, no hidden part) and as the
file it really is once symlinks are resolved (inside a root, by whole path components, so
`kb-secrets/` is not inside `kb/`).
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from workers.errors import PermanentToolError, ToolError

# Top-level folders of a workspace that hold tickets, runs or replies: never readable by tools.
NEVER_READABLE = frozenset({"inbox", "runs", "out", "quarantine", "private"})


def root_problem(root: str) -> str | None:
    """Why `root` cannot be a readable root (None if it can)."""
    path = PurePosixPath(root)
    if not root.strip() or root.strip() in (".", "./"):
        return "the workspace root itself cannot be readable; name a folder or file in it"
    if path.is_absolute() or "\\" in root:
        return "must be relative to the workspace"
    if any(part == ".." for part in path.parts):
        return "must not contain '..'"
    if any(part.startswith(".") for part in path.parts):
        return "must not be or contain a hidden file or folder"
    if path.parts[0] in NEVER_READABLE:
        return f"{path.parts[0]}/ is never readable by tools"
    return None


class Sandbox:
    """The files under `roots` (relative to `workspace`) that a worker's tools may open."""

    def __init__(self, workspace: Path, roots: list[str]) -> None:
        self.base = workspace.resolve()
        self.names = list(roots)
        self.roots: list[Path] = []
        for root in roots:
            if (problem := root_problem(root)) is not None:
                raise PermanentToolError(f"readable root {root!r}: {problem}")
            real = (self.base / root).resolve()
            if real == self.base or not real.is_relative_to(self.base):
                raise PermanentToolError(f"readable root {root!r} resolves outside the workspace")
            self.roots.append(real)

    def describe(self) -> str:
        """The roots, as a model should be told them."""
        return ", ".join(self.names) or "nothing"

    def file(self, asked: str) -> Path:
        """The real path of a readable file named `asked`.

        An attempt to get out (absolute, `..`, hidden, outside the roots, a symlink out) is a
        `PermanentToolError`: the agent stops and its ticket goes to a human. A missing file
        inside the roots is a `ToolError` the model can correct.
        """
        if not asked or "\0" in asked:
            raise ToolError("give a file path, e.g. kb/known-issues.md")
        path = PurePosixPath(asked)
        if path.is_absolute() or "\\" in asked:
            raise PermanentToolError(f"permission denied: {asked} (paths are relative)")
        if any(part == ".." or part.startswith(".") for part in path.parts):
            raise PermanentToolError(f"permission denied: {asked} ('..' or a hidden file)")
        real = (self.base / path).resolve()
        if not any(real == root or real.is_relative_to(root) for root in self.roots):
            raise PermanentToolError(
                f"permission denied: {asked} is outside what this worker may read "
                f"({self.describe()})"
            )
        if not real.is_file():
            raise ToolError(f"no such file: {asked} (readable: {self.describe()})")
        return real

    def read(self, asked: str) -> str:
        """The text of a readable file (UTF-8); a file that cannot be read is a `ToolError`."""
        path = self.file(asked)
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ToolError(f"cannot read {asked}: {exc}") from exc

    def files(self) -> list[str]:
        """Every readable file, as paths relative to the workspace, sorted (dotfiles, and
        files a symlink takes out of the roots, left out)."""
        found: set[str] = set()
        for root in self.roots:
            candidates = [root] if root.is_file() else (p for p in root.rglob("*") if p.is_file())
            for path in candidates:
                relative = path.relative_to(self.base)
                if any(part.startswith(".") for part in relative.parts):
                    continue
                real = path.resolve()
                if any(real == r or real.is_relative_to(r) for r in self.roots):
                    found.add(relative.as_posix())
        return sorted(found)
