"""A tool call's arguments in words: amounts as money (`amount_cents: 8900` is 89.00), the
rest as `name value`."""

from __future__ import annotations

import json
from typing import Any

CENTS = "_cents"


def words(args: dict[str, Any]) -> str:
    """`order_id A-77533, amount 89.00, reason "duplicate charge"`."""
    return ", ".join(_one(name, value) for name, value in args.items())


def _one(name: str, value: Any) -> str:
    if name.endswith(CENTS) and isinstance(value, int) and not isinstance(value, bool):
        return f"{name.removesuffix(CENTS)} {amount(value)}"
    if isinstance(value, str):
        return f'{name} "{value}"' if " " in value else f"{name} {value}"
    return f"{name} {json.dumps(value, ensure_ascii=False)}"


def amount(cents: int) -> str:
    """Cents as money with thousands separated: 128000 is 1,280.00."""
    sign = "-" if cents < 0 else ""
    whole, part = divmod(abs(cents), 100)
    return f"{sign}{whole:,}.{part:02d}"
