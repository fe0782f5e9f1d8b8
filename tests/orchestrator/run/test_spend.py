"""A ticket's spend, summed from its record as JSON (the web view's live page, 10,000 times
a first view), is the same as its steps' spends added up, and a damaged one is refused."""

from __future__ import annotations

import json

import pytest

from orchestrator.run.records import StepUsage, TicketRecord, ticket_spend


def test_a_records_spend_from_its_json_is_every_steps_spend_added() -> None:
    steps = {
        "draft": StepUsage(calls=2, tokens=1500, cost_usd=0.0031, estimated=1),
        "review": StepUsage(calls=1, tokens=700, cost_usd=0.0012, waited=2),
        "vote": StepUsage(calls=3, tokens=90, cost_usd=0.0004),
    }
    record = TicketRecord(source="T-1.txt")
    for step, usage in steps.items():
        record.spend(step, usage)
    by_hand = StepUsage()
    for usage in steps.values():
        by_hand = by_hand + usage
    as_json = json.loads(record.model_dump_json())
    assert ticket_spend(as_json) == by_hand == record.total()
    assert by_hand.calls == 6 and by_hand.waited == 2  # the sum above did add every step
    assert ticket_spend({}) == StepUsage()


@pytest.mark.parametrize(
    "spend",
    [
        {"calls": "many"},
        ["calls"],
        {"cost_usd": None},
        {"tokens": [1]},
        {"calls": 2.5},
        {"calls": float("inf")},  # what from_json makes of Infinity, or of 1e400
    ],
)
def test_a_damaged_spend_is_refused_not_counted_as_nothing(spend: object) -> None:
    """As StepUsage refuses it (a ValueError, which the web view's readers take for a
    record caught mid-write or damaged), never a TypeError or OverflowError that would
    fail the page, nor a fraction of a call rounded away."""
    with pytest.raises(ValueError):
        ticket_spend({"draft": spend})


def test_a_spend_the_model_would_take_counts_as_the_model_reads_it() -> None:
    lax = {"calls": "3", "tokens": 7.0, "cost_usd": 1}
    assert ticket_spend({"review": lax}) == StepUsage.model_validate(lax)
    assert ticket_spend({"review": lax}).calls == 3
