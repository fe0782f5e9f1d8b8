"""The demo's billing tools, written with ticketgraph's public tool API as a team would write
its own: `lookup_order` reads the order records this worker may read (its `reads`);
`request_refund` asks finance for a refund, a write recorded in the run's actions with its
idempotency key: finance's queue deduplicates refunds by that key (as a payment API's
Idempotency-Key header does), so the tool is safe to repeat after a crash (`idempotent`),
and the workspace's ledger answers a requeued ticket's same refund without filing it again.

ticketgraph.toml names them by import path (`demo_tools:lookup_order`); every worker imports
this module from the workspace's folder.
"""

from __future__ import annotations

import json
from typing import Annotated

from pydantic import Field

from workers import ToolContext, ToolError, tool

ORDERS_FILE = "data/orders.json"


@tool
def lookup_order(
    order_id: Annotated[
        str, Field(description="order id exactly as the ticket gives it, e.g. A-77301")
    ],
    ctx: ToolContext,
) -> str:
    """Look up billing facts of one order: amount, times charged, status, invoice title."""
    try:
        orders = json.loads(ctx.readable().read(ORDERS_FILE))
    except ValueError as exc:
        raise ToolError(f"the order records are unavailable: {exc}") from exc
    row = orders.get(order_id)
    if row is None:
        raise ToolError(f"no order {order_id}; check the id as written in the ticket")
    return json.dumps(row)


@tool(read_only=False, idempotent=True)
def request_refund(
    order_id: Annotated[str, Field(description="order id exactly as the ticket gives it")],
    amount_cents: Annotated[int, Field(ge=1, description="amount to refund, in cents")],
    reason: Annotated[str, Field(description="one line finance will read")],
    ctx: ToolContext,
) -> str:
    """Ask finance to refund an order (it is queued for a person at finance to carry out)."""
    # ctx.act records ctx.idempotency_key with the refund: finance files one refund per key.
    ctx.act("refund", order_id=order_id, amount_cents=amount_cents, reason=reason)
    return (
        f"refund of {amount_cents / 100:.2f} for order {order_id} requested; "
        "finance carries it out within 2 business days"
    )
