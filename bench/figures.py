"""Figures and their targets: a value, the bound the issue set for it, the ratio, PASS or MISS.

A target is `value <= bound`, `value < bound` or `value >= bound`; its ratio is always
value / bound, so a ratio of 1.0 is exactly on target, and the direction says which side
passes. A figure with no target is a reference (printed for comparison, no verdict). A
figure whose run gave the wrong answer (wrong exit code, calls or tokens) never passes.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

COMPARE: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    "<": operator.lt,
    ">=": operator.ge,
}


class Verdict(StrEnum):
    """How a figure stands against its target."""

    PASS = "PASS"
    MISS = "MISS"
    REFERENCE = "-"
    NOT_MEASURED = "n/a"


@dataclass(frozen=True)
class Target:
    """`value <op> bound`, with the issue's own words for it."""

    op: str
    bound: float
    text: str

    def __post_init__(self) -> None:
        if self.op not in COMPARE:
            raise ValueError(f"unknown comparison {self.op!r}")

    def ratio(self, value: float) -> float:
        """value / bound (1.0 is exactly on target)."""
        return value / self.bound if self.bound else math.inf

    def met(self, value: float) -> bool:
        """Whether `value` meets the target."""
        return COMPARE[self.op](value, self.bound)

    def show(self) -> str:
        """`<= 1.2` for the table."""
        return f"{self.op} {_number(self.bound)}"


@dataclass
class Figure:
    """One measured number with its unit, its target (if any) and why it may not count."""

    key: str
    label: str
    value: float | None
    unit: str = ""
    target: Target | None = None
    note: str = ""
    valid: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        """value / target bound, or None without a target or a value."""
        if self.target is None or self.value is None:
            return None
        return self.target.ratio(self.value)

    @property
    def verdict(self) -> Verdict:
        """PASS or MISS against the target; reference or not measured otherwise."""
        if self.value is None:
            return Verdict.NOT_MEASURED
        if self.target is None:
            return Verdict.REFERENCE
        return Verdict.PASS if self.valid and self.target.met(self.value) else Verdict.MISS

    def to_json(self) -> dict[str, Any]:
        """Every field, with the ratio and verdict worked out."""
        body: dict[str, Any] = {
            "key": self.key,
            "label": self.label,
            "value": self.value,
            "unit": self.unit,
            "target": None,
            "ratio_to_target": None if self.ratio is None else round(self.ratio, 4),
            "verdict": self.verdict.value,
            "valid": self.valid,
            "note": self.note,
        }
        if self.target is not None:
            body["target"] = {"op": self.target.op, "bound": self.target.bound}
            body["target_text"] = self.target.text
        return body | self.extra


def ratio_of(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, or None when either is missing or the denominator is 0."""
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def rounded(value: float | None, digits: int = 3) -> float | None:
    """`value` rounded, keeping None."""
    return None if value is None else round(value, digits)


def _number(value: float | None) -> str:
    """A compact rendering: 3 significant figures, thousands grouped."""
    if value is None:
        return "—"
    if isinstance(value, int) or value == 0 or abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:#.3g}".rstrip(".")


WIDTHS = (14, 10, 6, 4)  # value, target, ratio, verdict; the label column fits the labels
HEADER = ("figure", "value", "target", "ratio", "")


def table_row(figure: Figure, label_width: int) -> str:
    """One line of the table: label, value and unit, target, ratio, verdict, note."""
    value = f"{_number(figure.value)} {figure.unit}".strip()
    target = figure.target.show() if figure.target else ""
    ratio = "" if figure.ratio is None else f"{figure.ratio:.2f}"
    line = _align((figure.label, value, target, ratio, figure.verdict.value), label_width)
    return f"{line}  {figure.note}".rstrip()


def table_header(label_width: int) -> str:
    """The column names, aligned with `table_row`."""
    return _align(HEADER, label_width)


def _align(cells: tuple[str, ...], label_width: int) -> str:
    """The label left-aligned, the other cells right-aligned, in their columns."""
    label, *rest = cells
    right = (c.rjust(w) for c, w in zip(rest, WIDTHS, strict=True))
    return "  ".join([label.ljust(label_width), *right])
