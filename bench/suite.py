"""What every section of `python -m bench` gets (options, a time budget, fresh folders) and
what it hands back (figures and raw data)."""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.figures import Figure


@dataclass(frozen=True)
class Options:
    """The command line's choices: sizes, repetitions, the time budget."""

    quick: bool = False
    n: int = 1000
    big_n: int = 10000
    small_n: int = 100
    runs: int | None = None
    budget_s: float = 570.0

    def runs_or(self, default: int, quick: int = 1) -> int:
        """--runs if given, else the section's default (smaller with --quick)."""
        if self.runs is not None:
            return max(1, self.runs)
        return quick if self.quick else default


@dataclass
class Context:
    """One invocation: options, a scratch folder, and the deadline every section shares."""

    options: Options
    scratch: Path
    started: float = field(default_factory=time.monotonic)
    _names: itertools.count = field(default_factory=itertools.count)  # type: ignore[type-arg]

    @property
    def deadline(self) -> float:
        """`time.monotonic()` by which the whole suite should be done."""
        return self.started + self.options.budget_s

    def remaining_s(self) -> float:
        """Seconds left in the budget."""
        return self.deadline - time.monotonic()

    def folder(self, name: str) -> Path:
        """A new, empty folder for one workspace or one set of logs (never reused)."""
        path = self.scratch / f"{next(self._names):03d}-{name}"
        path.mkdir(parents=True)
        return path

    def timeout_s(self, floor: float = 60.0) -> float:
        """A subprocess timeout: what is left of the budget, but never less than `floor`."""
        return max(floor, self.remaining_s())


@dataclass
class Section:
    """What one section measured: its figures (with targets) and every raw number."""

    letter: str
    title: str
    figures: list[Figure] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)
    load: dict[str, Any] = field(default_factory=dict)
    error: str = ""

    def add(self, *figures: Figure) -> None:
        """Append figures, keyed under this section's letter."""
        for figure in figures:
            figure.key = f"{self.letter}.{figure.key}"
            self.figures.append(figure)


SectionRunner = Callable[[Context, Section], None]


def median(values: Iterable[float | None]) -> float | None:
    """The median of the values that are not None, or None if there are none."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None
