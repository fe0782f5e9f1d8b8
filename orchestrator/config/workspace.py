"""A workspace on disk: the unit a team owns. Its folders (inbox/, kb/, data/, out/, runs/,
quarantine/), its ticketgraph.toml (config/tables.py), and making one from the demo."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from orchestrator.config import tables
from orchestrator.config.tables import WorkspaceConfig
from orchestrator.run import signing
from orchestrator.run import workspace as folders
from orchestrator.run.workspace import CONFIG_FILE, DEMO_SCENARIOS

__all__ = ["CONFIG_FILE", "DEMO_SCENARIOS", "TEMPLATES", "Workspace", "init", "init_demo"]


@dataclass(frozen=True)
class Workspace(folders.Workspace):
    """A workspace: its folders (run/workspace.py) and its ticketgraph.toml."""

    def config(self) -> WorkspaceConfig:
        """Its ticketgraph.toml (defaults when there is none); `ConfigError` naming the key
        when a value is unknown or out of range."""
        return tables.read(self.root / CONFIG_FILE)


TEMPLATES = {
    "demo": "the lesson's demo: six tickets, two workers, a template, scripted replies",
    "minimal": "a start of your own: two example workers, a template, a tools module, no scripts",
}


def init_demo(root: Path) -> tuple[list[Path], list[Path]]:
    """Copy the demo workspace into `root`; never overwrite. Returns (created, kept)."""
    return init(root, "demo")


def init(root: Path, template: str) -> tuple[list[Path], list[Path]]:
    """Copy the packaged workspace `template` (TEMPLATES) into `root`; never overwrite; set
    up the user's signing key (run/signing.py). Returns (created, kept)."""
    created: list[Path] = []
    kept: list[Path] = []
    source = resources.files("orchestrator").joinpath(template)
    with resources.as_file(source) as folder:
        files = (p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
        for src in sorted(files):
            dest = root / src.relative_to(folder)
            if dest.exists():
                kept.append(dest)
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            # copy2 keeps the packaged files' old mtimes: inbox/ claims only files that have
            # not changed for a moment (a file still being written is never claimed).
            shutil.copy2(src, dest)
            created.append(dest)
    for folder_name in ("inbox", "out"):
        (root / folder_name).mkdir(parents=True, exist_ok=True)
    # Secure by default: whoever made the workspace can sign decisions in it (run/signing.py).
    trusted = set((root / signing.KEYS).glob("*.pub"))
    signing.set_up(Workspace(root))
    created += sorted(set((root / signing.KEYS).glob("*.pub")) - trusted)
    return created, kept
