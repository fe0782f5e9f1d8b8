"""Pages of a long list, and links that keep a page's filters."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

TICKETS_PER_PAGE = 100
MAX_PER_PAGE = 1000


@dataclass(frozen=True)
class Page:
    """Which page of how many."""

    number: int
    count: int

    @property
    def previous(self) -> int | None:
        return self.number - 1 if self.number > 1 else None

    @property
    def next(self) -> int | None:
        return self.number + 1 if self.number < self.count else None


def page(asked: str | None, items: int, per: int) -> Page:
    count = max(1, math.ceil(items / per))
    try:
        number = int(asked or 1)
    except ValueError:
        number = 1
    return Page(min(max(number, 1), count), count)


def per_page(asked: str | None) -> int:
    try:
        return min(max(int(asked or TICKETS_PER_PAGE), 1), MAX_PER_PAGE)
    except ValueError:
        return TICKETS_PER_PAGE


def link(base: str, state: dict[str, str], changed: dict[str, Any]) -> str:
    merged = {**state, **{k: "" if v is None else str(v) for k, v in changed.items()}}
    query = urlencode({k: v for k, v in merged.items() if v not in ("", None)})
    return f"{base}?{query}" if query else base
