"""Fixtures for harness tests: a real scripted provider over HTTP and a demo workspace."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from workers import chapter
from workers.provider import running_provider
from workers.settings import HarnessSettings
from workers.state import RunState


@pytest.fixture(scope="session")
def harness_url() -> Iterator[str]:
    """Base URL of a scripted provider serving the built-in `harness` set."""
    with running_provider("harness") as url:
        yield url


RunScenario = Callable[..., tuple[RunState, float]]


@pytest.fixture
def run_scenario(harness_url: str, tmp_path: Path) -> RunScenario:
    """Run a scenario through `ticketgraph harness`'s code path; returns (state, wall ms)."""

    def run(scenario: str, url: str | None = None, **options: Any) -> tuple[RunState, float]:
        options.setdefault("workspace", tmp_path / "ws")
        options.setdefault("trace", tmp_path / "trace.jsonl")
        opts = chapter.Options(scenario=scenario, **options)
        return chapter.run_experiment(opts, HarnessSettings(base_url=url or harness_url))

    return run
