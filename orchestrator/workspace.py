"""A workspace on disk: inbox/, kb/, data/, out/, runs/, and its ticketgraph.toml."""

from __future__ import annotations

import shutil
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, Field

CONFIG_FILE = "ticketgraph.toml"
DEMO_SCENARIOS = "scenarios/demo.yaml"


class GraphConfig(BaseModel):
    """How tickets are routed and fanned out."""

    categories: list[str] = ["billing", "bug", "other"]
    pool_size: int = Field(default=2, ge=1)


class GateConfig(BaseModel):
    """The deterministic gate and the review loop."""

    max_rounds: int = Field(default=3, ge=0)
    filler_phrases: list[str] = [
        "please wait a moment",
        "thank you for your patience",
        "we will resolve this soon",
    ]


class HarnessConfig(BaseModel):
    """Limits of each agent run inside the graph."""

    model: str = "demo"
    max_turns: int = Field(default=6, ge=1)
    budget_usd: float | None = Field(default=0.05, gt=0)


class WorkspaceConfig(BaseModel):
    """The whole `ticketgraph.toml`."""

    model_config = {"extra": "forbid"}

    graph: GraphConfig = GraphConfig()
    gate: GateConfig = GateConfig()
    harness: HarnessConfig = HarnessConfig()


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
    def runs(self) -> Path:
        """One folder per run: state, trace, agent states, report."""
        return self.root / "runs"

    @property
    def scenarios(self) -> Path:
        """Scripted-provider scenarios used when no LLM_BASE_URL is set."""
        return self.root / DEMO_SCENARIOS

    def config(self) -> WorkspaceConfig:
        """The workspace config; defaults when there is no ticketgraph.toml."""
        path = self.root / CONFIG_FILE
        if not path.exists():
            return WorkspaceConfig()
        return WorkspaceConfig.model_validate(tomllib.loads(path.read_text(encoding="utf-8")))


def init_demo(root: Path) -> tuple[list[Path], list[Path]]:
    """Copy the demo workspace into `root`; never overwrite. Returns (created, kept)."""
    created: list[Path] = []
    kept: list[Path] = []
    source = resources.files("orchestrator").joinpath("demo")
    with resources.as_file(source) as demo:
        for src in sorted(p for p in demo.rglob("*") if p.is_file()):
            dest = root / src.relative_to(demo)
            if dest.exists():
                kept.append(dest)
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest)
            created.append(dest)
    (root / "out").mkdir(parents=True, exist_ok=True)
    return created, kept
