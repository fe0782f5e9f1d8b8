"""A workspace on disk: the unit a team owns. Its folders (inbox/, kb/, data/, out/, runs/,
quarantine/), its ticketgraph.toml (config/tables.py), and making one from the demo."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from orchestrator.config import tables
from orchestrator.config.tables import WorkspaceConfig
from orchestrator.errors import ConfigError, UsageError
from orchestrator.run import signing

CONFIG_FILE = "ticketgraph.toml"
DEMO_SCENARIOS = "scenarios/demo.yaml"


@dataclass(frozen=True)
class Workspace:
    """Paths of one workspace."""

    root: Path

    @property
    def inbox(self) -> Path:
        """Where tickets are dropped."""
        return self.root / "inbox"

    @property
    def out(self) -> Path:
        """Where drafts are published, one file per ticket."""
        return self.root / "out"

    @property
    def quarantine(self) -> Path:
        """Files claimed from inbox/ that are not tickets, each with a `.reason` file."""
        return self.root / "quarantine"

    @property
    def runs(self) -> Path:
        """One folder per run: state, trace, agent states, report."""
        return self.root / "runs"

    @property
    def scenarios(self) -> Path:
        """Scripted-provider scenarios used when no LLM_BASE_URL is set."""
        return self.root / DEMO_SCENARIOS

    def require(self) -> Workspace:
        """This workspace; `UsageError` if the folder is not one (it has no ticketgraph.toml,
        inbox/ or runs/), as every command that reads a workspace says."""
        markers = (self.root / CONFIG_FILE, self.inbox, self.runs)
        if not self.root.is_dir() or not any(m.exists() for m in markers):
            raise UsageError(
                f"no workspace at {self.root}: it has no {CONFIG_FILE}, inbox/ or runs/ "
                f"(`ticketgraph init {self.root}` makes one)"
            )
        return self

    def check_folders(self) -> None:
        """`ConfigError` if out/, runs/ or quarantine/ exists but is not a folder (checked
        before anything is claimed: a run could not record its work there)."""
        for folder, holds in (
            (self.out, "replies"),
            (self.runs, "runs"),
            (self.quarantine, "quarantined files"),
        ):
            if folder.exists() and not folder.is_dir():
                raise ConfigError(
                    f"{folder.absolute()} is not a folder (ticketgraph keeps its {holds} "
                    "there): move it out of the way"
                )

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
    signing.set_up(root)
    created += sorted(set((root / signing.KEYS).glob("*.pub")) - trusted)
    return created, kept
