"""The harness asks a meter before every model call and settles with it after (the run's
budget ledger in the graph): a refused call is never sent, a failed one is released, a
paid one is settled with what it cost. A real HTTP provider; the meter records."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from workers import loop
from workers.meter import OverBudget, WorstCase, worst_case
from workers.model.client import ModelClient, RequestParams
from workers.pricing import Price
from workers.provider import running_provider
from workers.settings import HarnessSettings
from workers.state import AgentStatus, Message, new_run
from workers.tools import Catalog
from workers.trace import Tracer
from workers.usage import Usage

SCRIPTS = [
    {"name": "ok", "when": {"model": "^ok$"}, "replies": [{"text": "done"}]},
    {
        "name": "down",
        "when": {"model": "^down$"},
        "replies": [{"text": "never"}],
        "faults": [{"status": 400}],
    },
]


class Recorder:
    """A meter that holds everything (or nothing) and writes down what it was told."""

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.asked: list[WorstCase] = []
        self.settled: list[float] = []
        self.released = 0

    def hold(self, worst: WorstCase) -> Recorder:
        self.asked.append(worst)
        if self.refuse:
            raise OverBudget("run budget: $0.0000 left")
        return self

    def settle(self, usd: float, usage: Usage) -> None:
        self.settled.append(usd)

    def release(self) -> None:
        self.released += 1


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    scenario = tmp_path / "meter.yaml"
    scenario.write_text(yaml.safe_dump(SCRIPTS))
    with running_provider(scenario) as served:
        yield served


def _run(url: str, model: str, meter: Recorder, trace: Path) -> loop.RunState:
    client = ModelClient(HarnessSettings(base_url=url, max_retries=0))
    harness = loop.Harness(
        client=client,
        catalog=Catalog([]),
        price=Price(input_per_million=2.0, output_per_million=12.0),
        params=RequestParams(max_tokens=100),
        tracer=Tracer(trace, "run-1"),
        meter=meter,
    )
    return loop.run(new_run("You answer.", "Say done.", model), harness)


def _requests(url: str) -> int:
    return int(httpx.get(url.replace("/v1", "/stats")).json()["requests"])


def test_a_paid_call_is_held_at_its_worst_case_and_settled_at_its_cost(
    url: str, tmp_path: Path
) -> None:
    meter = Recorder()
    state = _run(url, "ok", meter, tmp_path / "t.jsonl")
    assert state.status is AgentStatus.COMPLETED
    assert [round(s, 12) for s in meter.settled] == [round(state.cost_usd, 12)]
    assert meter.asked[0].usd >= state.cost_usd and meter.asked[0].reply_tokens == 100
    events = [json.loads(line)["event"] for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert events.index("reserved") < events.index("settled") < events.index("turn")


def test_a_refused_call_is_never_sent_and_the_run_stops_on_the_run_budget(
    url: str, tmp_path: Path
) -> None:
    meter = Recorder(refuse=True)
    state = _run(url, "ok", meter, tmp_path / "t.jsonl")
    assert state.status is AgentStatus.BUDGET_EXCEEDED
    assert state.interruption is not None and state.interruption.type == "run_budget"
    assert _requests(url) == 0 and state.cost_usd == 0


def test_a_call_without_a_reply_is_released(url: str, tmp_path: Path) -> None:
    meter = Recorder()
    state = _run(url, "down", meter, tmp_path / "t.jsonl")
    assert state.status is AgentStatus.FAILED
    assert (meter.released, meter.settled) == (1, [])


def test_the_worst_case_counts_the_prompt_and_the_longest_reply() -> None:
    messages = [Message(role="user", content="hello " * 100)]
    price = Price(input_per_million=1_000_000, output_per_million=0)  # $1 per prompt token
    worst = worst_case(messages, [], 50, price)
    assert worst.prompt_tokens > 100 and worst.usd == worst.prompt_tokens
    assert worst_case(messages, [], None, price).reply_tokens == 4096  # unbounded: a bound
