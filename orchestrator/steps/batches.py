"""The router's batches: a run's tickets, as many to a call as the model can take.

A routing call sends the system prompt and one `id: text` line a ticket, and expects one
`id: category` line a ticket back. Its prompt and its reply must fit the model's window
(`[harness.router] context_tokens`), and its reply the router's `max_tokens`; both are
counted with o200k_base (workers/tokens.py), the count the budget's meter uses too.

The expected reply is given only part of `max_tokens`: models write more than asked (a
0.5B model copied each category's description after its label, `T-1001: billing: charges`,
twice the tokens of the line asked for), and a reply cut off costs a second call and leaves
tickets to ask again. `[harness.router] batch_tickets` caps a batch further (a small model
loses track of a long list before its reply is full).

Tickets keep their inbox order and a batch holds at least one, however long it is. The plan
is a pure function of the run's fixed configuration and its claimed texts, so a resumed run
plans the same batches and finds each one's saved agent state.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from orchestrator.run.records import RunConfig
from orchestrator.steps import agent, prompts
from workers import tokens

# The expected reply may take this share of max_tokens; the rest is room for a model that
# writes twice the words asked (the 0.5B model above).
REPLY_SHARE = 0.5
# Without a max_tokens, the reply may take this share of the window.
UNCAPPED_REPLY_SHARE = 0.25


@dataclass(frozen=True)
class Cost:
    """What one ticket adds to a routing call: its prompt line and its expected reply line."""

    prompt: int
    reply: int


@dataclass(frozen=True)
class Room:
    """The room one routing call has for its tickets' lines, and its cap on their number."""

    prompt: int  # of ticket lines the prompt may hold
    reply: int  # of expected reply lines the reply may hold
    most: int | None  # tickets a call at most ([harness.router] batch_tickets)


@dataclass(frozen=True)
class Batching:
    """How one run's tickets go into routing calls: the room of a call, each one's cost."""

    room: Room
    costs: dict[str, Cost]

    def plan(self, ids: list[str], most: int | None = None) -> list[list[str]]:
        """`ids` in order, cut into batches that fit (and hold at most `most` tickets)."""
        caps = [n for n in (self.room.most, most) if n is not None]
        cap = min(caps) if caps else None
        batches: list[list[str]] = []
        batch: list[str] = []
        prompt = reply = 0
        for ticket_id in ids:
            cost = self.costs[ticket_id]
            if batch and not self._fits(len(batch), cap, prompt + cost.prompt, reply + cost.reply):
                batches.append(batch)
                batch, prompt, reply = [], 0, 0
            batch.append(ticket_id)
            prompt, reply = prompt + cost.prompt, reply + cost.reply
        return [*batches, batch] if batch else batches

    def _fits(self, held: int, cap: int | None, prompt: int, reply: int) -> bool:
        """Whether one more ticket fits a batch holding `held`, making these totals."""
        return (
            (cap is None or held < cap) and prompt <= self.room.prompt and reply <= self.room.reply
        )


def for_run(config: RunConfig, texts: Mapping[str, str]) -> Batching:
    """The batching of a run whose tickets show the router `texts` (id -> text)."""
    # A token is a byte at least: when every ticket fits one call counted in bytes, any
    # part of them does too, and the worker need not build the tokenizer (~0.5 s of CPU).
    rough = _batching(config, texts, _utf8_bytes)
    if len(rough.plan(list(texts))) <= 1:
        return rough
    return _batching(config, texts, tokens.count)


def _batching(config: RunConfig, texts: Mapping[str, str], count: Callable[[str], int]) -> Batching:
    """The room of one routing call (the router's system prompt, its reply capped at its
    max_tokens, None: uncapped) and each ticket's cost in it, counted by `count`."""
    role = agent.role_of(config, "router")
    system = agent.role_prompt(role, config) or prompts.ROUTER.format(
        categories=agent.categories_text(config)
    )
    max_tokens = role.params.max_tokens
    window = config.router_context_tokens
    reply_cap = max_tokens if max_tokens is not None else int(window * UNCAPPED_REPLY_SHARE)
    frame = [{"role": "system", "content": system}, {"role": "user", "content": ""}]
    room = Room(
        prompt=window - reply_cap - count(json.dumps(frame)),  # as tokens.of_request counts
        reply=int(reply_cap * REPLY_SHARE),
        most=config.router_batch_tickets,
    )
    longest = max(config.categories, key=count, default="other")
    costs = {
        ticket_id: Cost(
            prompt=count(prompts.router_input([(ticket_id, text)]) + "\n"),
            reply=count(f"{ticket_id}: {longest}\n"),
        )
        for ticket_id, text in texts.items()
    }
    return Batching(room, costs)


def _utf8_bytes(text: str) -> int:
    return len(text.encode("utf-8"))
