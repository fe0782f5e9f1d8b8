"""The tools each worker category gets: billing looks up orders and may request a refund,
bug reads its folders.

Reads go only through the category's sandbox (sandbox.py): its readable roots, never the
rest of the workspace. The one write, `request_refund`, appends to the run's actions.jsonl
(finance's queue); the harness records that a write started before running it, so a worker
killed mid-write never runs it a second time.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import BaseModel, Field

from orchestrator.steps.sandbox import Sandbox
from workers.errors import ToolError
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

    def read(args: FileArgs, _ctx: ToolContext) -> str:
        path = sandbox.file(args.path)
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ToolError(f"cannot read {args.path}: {exc}") from exc

    # The schema the model sees is the harness chapter's read_file's, word for word; what
    # it may open is the sandbox's business.
    return Tool("read_file", "Read one file of the workspace.", read, FileArgs)


class FileArgs(BaseModel):
    """A path relative to the workspace."""

    path: str = Field(description="file name relative to the workspace, e.g. errors.log")


class RefundArgs(BaseModel):
    """A refund for finance to carry out."""

    order_id: str = Field(description="order id exactly as the ticket gives it")
    amount_cents: int = Field(ge=1, description="amount to refund, in cents")
    reason: str = Field(description="one line finance will read")


def request_refund_tool(actions: Path, ticket_id: str) -> Tool:
    """`request_refund`: append one refund request to the run's actions (a write)."""

    def request(args: RefundArgs, ctx: ToolContext) -> str:
        line = {"action": "refund", "ticket": ticket_id, "call_id": ctx.call_id}
        line |= args.model_dump()
        with actions.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(line) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        return (
            f"refund of {args.amount_cents / 100:.2f} for order {args.order_id} requested; "
            "finance carries it out within 2 business days"
        )

    return Tool(
        "request_refund",
        "Ask finance to refund an order (it is queued for a person at finance to carry out).",
        request,
        RefundArgs,
        read_only=False,
    )


def tools_for(
    category: str,
    workspace_root: Path,
    reads: dict[str, list[str]],
    actions: tuple[Path, str] | None = None,
) -> list[Tool]:
    """The catalog of the worker for `category` (empty for the router and templates);
    `actions`: the run's actions file and the ticket, for the write tools."""
    sandbox = Sandbox(workspace_root, reads.get(category, []))
    if category == "billing":
        writes = [request_refund_tool(*actions)] if actions is not None else []
        return [lookup_order_tool(sandbox), *writes]
    if category == "bug":
        return [read_file_tool(sandbox)]
    return []
