"""The tools each worker category gets: billing looks up orders, bug reads its folders.

Both read only through the category's sandbox (sandbox.py): its readable roots, never the
rest of the workspace.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, Field

from orchestrator.sandbox import Sandbox
from workers.errors import ToolError
from workers.filetools import PathArgs
from workers.tools import Tool, ToolContext

ORDERS_FILE = "data/orders.json"


class OrderArgs(BaseModel):
    """An order id."""

    order_id: str = Field(description="order id exactly as the ticket gives it, e.g. A-77301")


def lookup_order_tool(sandbox: Sandbox) -> Tool:
    """`lookup_order`: amount, charge count, status and invoice title of one order."""

    def lookup(args: OrderArgs, _ctx: ToolContext) -> str:
        orders_path = sandbox.file(ORDERS_FILE)
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


def read_file_tool(sandbox: Sandbox) -> Tool:
    """`read_file`: the text of one file under the worker's readable roots."""

    def read(args: PathArgs, _ctx: ToolContext) -> str:
        path = sandbox.file(args.path)
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ToolError(f"cannot read {args.path}: {exc}") from exc

    # The schema the model sees is the harness's read_file's, word for word (the reference
    # run's token counts depend on it); what it may open is the sandbox's business.
    return Tool("read_file", "Read one file of the workspace.", read, PathArgs)


def tools_for(category: str, workspace_root: Path, reads: dict[str, list[str]]) -> list[Tool]:
    """The catalog of the worker for `category` (empty for the router and templates)."""
    sandbox = Sandbox(workspace_root, reads.get(category, []))
    if category == "billing":
        return [lookup_order_tool(sandbox)]
    if category == "bug":
        return [read_file_tool(sandbox)]
    return []
