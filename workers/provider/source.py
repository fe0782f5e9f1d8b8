"""What the scripted provider serves: a scenario or a cassette, loaded, with the tokenizer
built when its replies are counted.

Light on purpose (no uvicorn or Starlette): an embedded run loads what it will serve
before it forks its workers (orchestrator/broker/embedded.py), so they share the tokenizer
the provider builds instead of each building its own.
"""

from __future__ import annotations

from pathlib import Path

from workers import tokens
from workers.provider.cassette import Cassette, is_cassette, load_cassette
from workers.provider.scenario import Scenario, load_scenario

ScenarioSource = str | Path | Scenario | Cassette


def loaded(source: ScenarioSource) -> Scenario | Cassette:
    """`source` loaded (a path or a built-in scenario's name; a loaded one as it is), with
    the tokenizer built if any of its replies will be counted (or, made line by line, may
    be cut at max_tokens), so the first request's X-Service-Ms is not its load time. The
    demo's replies fix their usage and are shorter in bytes than any cap: never needed."""
    if isinstance(source, Scenario | Cassette):
        scenario: Scenario | Cassette = source
    else:
        scenario = load_cassette(source) if is_cassette(source) else load_scenario(source)
    scripts = scenario.scripts if isinstance(scenario, Scenario) else []
    replies = [reply for script in scripts for reply in script.replies]
    if any(reply.usage is None or reply.lines is not None for reply in replies):
        tokens.encoding()
    return scenario
