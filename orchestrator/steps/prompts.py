"""The graph's own prompts (the router's, the evaluator's) and the task texts every worker is
given; a worker's system prompt is its workspace's (`[workers.<category>]`). Each states
goal, output format, tool guidance, limits."""

from __future__ import annotations

ROUTER = "\n".join(
    [
        "You are the support ticket router.",
        "Goal: classify each ticket below as one of: {categories}.",
        "Output format: one line per ticket, strictly `<ticket id>: <category>`; no reasons, "
        "nothing else.",
        "Tool guidance: you have no tools in this step; judge from the ticket text only and do "
        "not claim to have looked anything up.",
        "Task limits: only classify; do not answer, merge or skip tickets; if unsure, use other.",
    ]
)


def router_input(tickets: list[tuple[str, str]]) -> str:
    """All claimed tickets, one `id: text` line each."""
    return "\n".join(f"{ticket_id}: {' '.join(text.split())}" for ticket_id, text in tickets)


def draft_input(ticket_id: str, text: str) -> str:
    """The drafting worker's task for one ticket."""
    return f"Ticket id: {ticket_id}\nCustomer's text: {text}"


def rewrite_input(ticket_id: str, previous: str, report: str) -> str:
    """The same worker's task when its draft failed the gate."""
    return "\n".join(
        [
            f"Your previous draft for ticket {ticket_id}:",
            "---",
            previous,
            "---",
            f"The deterministic check failed with this report: {report}",
            "Fix only the problems named in the report and rewrite the complete reply.",
        ]
    )


EVALUATOR = (
    "You are the last check before a support reply is sent. Read the customer's ticket and "
    "the draft reply. The reply fails if it does not answer the ticket, promises something "
    "it cannot know, or would confuse the customer. Answer with exactly one line: PASS, or "
    "FAIL: followed by the problem in a few words."
)


def evaluator_input(ticket_id: str, ticket_text: str, draft: str) -> str:
    """The evaluator's task: one ticket and its draft."""
    return "\n".join(
        [f"Ticket {ticket_id}:", ticket_text, "---", "Draft reply:", draft, "---", "Verdict?"]
    )
