"""The tools each worker category gets: billing looks up orders, bug reads the workspace."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, Field

from workers.errors import ToolError
from workers.filetools import Workspace
from workers.tools import Tool, ToolContext

ORDERS_FILE = "data/orders.json"


class OrderArgs(BaseModel):
    """An order id."""

    order_id: str = Field(description="order id exactly as the ticket gives it, e.g. A-77301")


def lookup_order_tool(orders_path: Path) -> Tool:
    """`lookup_order`: amount, charge count, status and invoice title of one order."""

    def lookup(args: OrderArgs, _ctx: ToolContext) -> str:
        try:
            orders = json.loads(orders_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ToolError(f"the order records are unavailable: {exc}") from exc
        row = orders.get(args.order_id)
        if row is None:
            raise ToolError(f"no order {args.order_id}; check the id as written in the ticket")
        return json.dumps(row)

    return Tool(
        "lookup_order",
        "Look up billing facts of one order: amount, times charged, status, invoice title.",
        lookup,
        OrderArgs,
    )


def tools_for(category: str, workspace_root: Path) -> list[Tool]:
    """The catalog of the worker for `category` (empty for the router and templates)."""
    if category == "billing":
        return [lookup_order_tool(workspace_root / ORDERS_FILE)]
    if category == "bug":
        files = Workspace(workspace_root)
        return [t for t in files.tools() if t.name == "read_file"]
    return []
