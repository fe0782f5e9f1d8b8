"""This workspace's own tools. Each is a plain typed function made a tool with @tool: the
model sees its name, its docstring's first paragraph and a schema built from its type hints;
a parameter typed ToolContext gets the call's context (ticket id, readable files, cancel
token, progress). Raise ToolError for what the model should read and correct.

Name a tool in ticketgraph.toml by its import path: tools = ["my_tools:order_status"].
Every worker imports this module from the workspace's folder; a module that cannot be
imported stops `ticketgraph run`, `check` and `worker --workspace` with exit 78.
"""

from __future__ import annotations

import json
from typing import Annotated

from pydantic import Field

from workers import ToolContext, ToolError, tool


@tool
def order_status(
    order_id: Annotated[str, Field(description="the order id as the ticket gives it, e.g. O-1001")],
    ctx: ToolContext,
) -> str:
    """The status of one order: shipped (carrier, tracking number) or still processing."""
    orders = json.loads(ctx.readable().read("data/orders.json"))
    if order_id not in orders:
        raise ToolError(f"no order {order_id}; check the id as the ticket writes it")
    return json.dumps(orders[order_id])
