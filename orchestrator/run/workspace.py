"""A workspace's folders: inbox/, out/, runs/, quarantine/ and its scenarios, named in one
place. Low on the floors so every room (run/ and coordination/ too) takes a `Workspace`, never
a bare path; reading its ticketgraph.toml is config's (config/workspace.py adds `config()`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Self

from orchestrator.errors import ConfigError, UsageError

CONFIG_FILE = "ticketgraph.toml"
DEMO_SCENARIOS = "scenarios/demo.yaml"


@dataclass(frozen=True)
class Workspace:
    """Paths of one workspace (`root` is the folder itself)."""

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

    def require(self) -> Self:
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
