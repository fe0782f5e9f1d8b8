"""Routing in batches that fit the model: the router's calls hold as many tickets as its
max_tokens and window allow, run side by side within the pool, resume call by call, and
the tickets a reply leaves out are asked about again in smaller batches, down to one."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from orchestrator.config import layers
from orchestrator.config.workspace import Workspace
from orchestrator.steps import batches, prompts
from tests.conftest import (
    REFERENCE_TICKETS,
    Cli,
    demo_scripts,
    drop,
    events,
    state,
    ticket_rows,
    variant,
    write_scenarios,
)
from workers import tokens, versions
from workers.provider import running_provider

DEMO_INBOX = Path(__file__).resolve().parents[3] / "orchestrator" / "demo" / "inbox"
# The reference run's router labels, and the categories they become.
LABELS = {
    "T-1001": "billing",
    "T-1002": "bug",
    "T-1003": "other",
    "T-1004": "billing",
    "T-1005": "bug",
    "T-1006": "complaint",
}
CATEGORY = {label: label if label != "complaint" else "other" for label in LABELS.values()}
ROUTER_MAX_TOKENS = 512  # the demo's [harness.router] max_tokens


def clone_inbox(workspace: Path, n: int, first: int = 20001) -> dict[str, str]:
    """Replace the demo's inbox with `n` tickets whose texts cycle the demo's; ticket ->
    the category the router's rules give it."""
    for old in (workspace / "inbox").iterdir():
        old.unlink()
    demo = sorted(DEMO_INBOX.glob("*.txt"))
    expected = {}
    for k in range(n):
        source = demo[k % len(demo)]
        ticket = f"T-{first + k}"
        drop(workspace / "inbox", f"{ticket}.txt", source.read_text())
        expected[ticket] = CATEGORY[LABELS[source.stem]]
    return expected


def router(**reply: Any) -> dict[str, Any]:
    """A router that answers each ticket line of its request with its demo ticket's label,
    known by the start of the demo ticket's text (`reply` adds to its one reply)."""
    rules = []
    for path in sorted(DEMO_INBOX.glob("*.txt")):
        start = re.escape(" ".join(path.read_text().split())[:40])
        rules.append(
            {"match": f"^(?P<ticket>T-\\d+): {start}", "text": f"{{ticket}}: {LABELS[path.stem]}"}
        )
    return {
        "name": "router",
        "when": {"system": "ticket router"},
        "after_last": "repeat_last",
        "replies": [{"lines": rules, **reply}],
    }


def router_calls(run_dir: Path) -> dict[str, list[str]]:
    """Agent state name -> the tickets its routing request asked about, from agents/."""
    asked = {}
    for path in sorted((run_dir / "agents").glob("_router.*.json")):
        task = next(m for m in versions.read_json(path)["messages"] if m["role"] == "user")
        asked[path.stem.removeprefix("_router.")] = [
            line.split(":", 1)[0] for line in task["content"].splitlines()
        ]
    return asked


def demo_texts(n: int) -> dict[str, str]:
    """`n` tickets whose texts cycle the demo's, as the router is shown them."""
    demo = [p.read_text() for p in sorted(DEMO_INBOX.glob("*.txt"))]
    return {f"T-{20001 + k}": demo[k % len(demo)] for k in range(n)}


def test_a_batch_is_as_big_as_half_of_max_tokens_and_the_window_allow(demo: Path) -> None:
    """Counted with o200k_base: each batch's expected reply (`id: category` a ticket) fits
    half of max_tokens and its prompt the window less the reply, and one ticket more would
    not fit; a smaller window makes the prompt the bound, batch_tickets caps both."""
    config = layers.declared(Workspace(demo))
    texts = demo_texts(300)
    ids = list(texts)
    system = prompts.ROUTER.format(categories="billing (...)")
    longest = max(config.categories, key=tokens.count)

    def reply(batch: list[str]) -> int:
        return sum(tokens.count(f"{t}: {longest}\n") for t in batch)

    def prompt(batch: list[str]) -> int:
        return tokens.count(prompts.router_input([(t, texts[t]) for t in batch])) + len(batch)

    plan = batches.for_run(config, texts).plan(ids)
    assert [t for batch in plan for t in batch] == ids
    for batch, after in itertools.pairwise(plan):
        assert reply(batch) <= ROUTER_MAX_TOKENS // 2 < reply([*batch, after[0]])
    narrow = config.model_copy(update={"router_context_tokens": 1024})
    window = 1024 - ROUTER_MAX_TOKENS - tokens.count(system)
    plan = batches.for_run(narrow, texts).plan(ids)
    assert all(prompt(batch) <= window for batch in plan)
    assert max(len(batch) for batch in plan) < ROUTER_MAX_TOKENS // 2 // reply(ids[:1])
    capped = config.model_copy(update={"router_batch_tickets": 7})
    assert {len(batch) for batch in batches.for_run(capped, texts).plan(ids)} == {7, 300 % 7}


def test_the_demo_is_one_call_planned_without_building_the_tokenizer() -> None:
    """Six tickets fit one call even counted in bytes (a token is a byte at least), so the
    worker that routes the demo never pays the tokenizer's half second of CPU."""
    code = (
        "from pathlib import Path\n"
        "from orchestrator.config import layers\n"
        "from orchestrator.steps import batches\n"
        "from orchestrator.config.workspace import Workspace\n"
        "from workers import tokens\n"
        f"inbox = Path({str(DEMO_INBOX)!r})\n"
        "texts = {p.stem: p.read_text() for p in sorted(inbox.glob('*.txt'))}\n"
        "config = layers.declared(Workspace(inbox.parent))\n"
        "print(len(batches.for_run(config, texts).plan(list(texts))), "
        "tokens._encoding.cache_info().currsize)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.split() == ["1", "0"], done.stderr


def test_a_reply_cap_as_big_as_the_window_is_a_configuration_error(demo: Path, cli: Cli) -> None:
    config = demo / "ticketgraph.toml"
    text = config.read_text()
    config.write_text(text.replace("[harness.router]", "[harness.router]\ncontext_tokens = 512", 1))
    done = cli("check", cwd=demo)
    assert done.returncode == 78 and "Traceback" not in done.stderr
    assert "max_tokens (512) must be less than context_tokens (512)" in done.stderr


def test_three_hundred_tickets_are_routed_in_replies_that_fit_max_tokens_side_by_side(
    demo: Path, cli: Cli, tmp_path: Path
) -> None:
    """One call for 300 tickets would need a reply of about 2,100 tokens; the scripted
    router cuts a reply at max_tokens, as a real model does. Route sends batches whose
    replies fit, at most POOL_SIZE at once, and every ticket is routed."""
    expected = clone_inbox(demo, 300)
    scenarios = write_scenarios(tmp_path / "router.yaml", [router() | {"latency_ms": 100}])
    with running_provider(scenarios) as url:
        env = {"LLM_BASE_URL": url, "POOL_SIZE": "4"}
        done = cli("run", "--stop-after", "route", cwd=demo, env=env)
        stats = httpx.get(url.replace("/v1", "/stats")).json()
    assert done.returncode == 2, done.stdout + done.stderr
    run_dir = demo / "runs" / state(demo)["run_id"]
    routes = json.loads((run_dir / "routes.json").read_text())
    assert {i: r["category"] for i, r in routes.items()} == expected
    calls = router_calls(run_dir)
    assert len(calls) > 1 and not [name for name in calls if "again" in name]
    assert sorted(t for batch in calls.values() for t in batch) == sorted(expected)
    assert stats["scripts"]["router"] == len(calls) == state(demo)["nodes"]["route"]["calls"]
    assert 2 <= stats["max_in_flight"] <= 4
    turns = [e for e in events(demo) if e["event"] == "turn" and e.get("node") == "route"]
    assert len(turns) == len(calls) and all(t["finish"] == "stop" for t in turns)
    assert max(t["completion_tokens"] for t in turns) <= ROUTER_MAX_TOKENS


def test_a_crash_in_one_batch_is_resumed_without_asking_the_others_again(
    demo: Path, cli: Cli, tmp_path: Path
) -> None:
    """The demo in batches of two: the first routing request fails, the run crashes after
    the other batches were answered; resume asks that batch alone again, and the run ends
    with the reference verdicts."""
    config = demo / "ticketgraph.toml"
    text = config.read_text()
    config.write_text(text.replace("[harness.router]", "[harness.router]\nbatch_tickets = 2", 1))
    fault = {"turn": 0, "status": 500, "times": 1}
    scripts = variant(demo_scripts(), "router", faults=[fault])
    with running_provider(write_scenarios(tmp_path / "demo.yaml", scripts)) as url:
        env = {"LLM_BASE_URL": url, "LLM_MAX_RETRIES": "0"}
        crashed = cli("run", cwd=demo, env=env)
        run_id = state(demo)["run_id"]
        resumed = cli("resume", run_id, cwd=demo, env=env)
        stats = httpx.get(url.replace("/v1", "/stats")).json()
    assert crashed.returncode == 3, crashed.stdout + crashed.stderr
    assert resumed.returncode == 1, resumed.stdout + resumed.stderr
    calls = router_calls(demo / "runs" / run_id)
    assert sorted(calls.values()) == [
        ["T-1001", "T-1002"],
        ["T-1003", "T-1004"],
        ["T-1005", "T-1006"],
    ]
    assert stats["scripts"]["router"] == len(calls) + 1  # the failed one, once more
    assert ticket_rows(state(demo)) == REFERENCE_TICKETS


def test_tickets_a_tired_router_leaves_out_are_routed_by_smaller_re_asks(
    demo: Path, cli: Cli
) -> None:
    """`batch_tickets` caps the batches at 20; the router names only the first 7 tickets of
    any request. The rest of each batch is asked about again in batches half the size
    before, until every one is named; a ticket no line of the router names is asked about
    down to a call of its own, then needs a person."""
    expected = clone_inbox(demo, 60)
    drop(demo / "inbox", "T-30000.txt", "Something nobody scripted.\n")
    config = demo / "ticketgraph.toml"
    text = config.read_text()
    config.write_text(text.replace("[harness.router]", "[harness.router]\nbatch_tickets = 20", 1))
    write_scenarios(demo / "scenarios" / "demo.yaml", [router(max_lines=7)])
    done = cli("run", "--stop-after", "route", cwd=demo)
    assert done.returncode == 2, done.stdout + done.stderr
    run_dir = demo / "runs" / state(demo)["run_id"]
    routes = json.loads((run_dir / "routes.json").read_text())
    assert {i: r["category"] for i, r in routes.items()} == expected
    unknown = state(demo)["tickets"]["T-30000"]
    assert (unknown["status"], unknown["stop"]) == ("needs_human", "unrouted")

    calls = router_calls(run_dir)
    rounds: dict[str, list[list[str]]] = {}
    for name, asked in calls.items():
        rounds.setdefault(name.split("-b")[0], []).append(asked)
    sizes = [max(len(batch) for batch in rounds[name]) for name in _in_order(rounds)]
    assert sizes[0] == 20 and len(rounds["route"]) == -(-61 // 20)  # 61 tickets, 20 a batch
    assert all(later <= earlier // 2 or later == 1 for earlier, later in itertools.pairwise(sizes))
    assert sizes[-1] == 1 and calls[_last(rounds)] == ["T-30000"]
    times = sum(batch.count("T-30000") for batch in calls.values())
    assert f"asked {times} times, the last time alone" in unknown["error"]
    # Each ask of a ticket names it (once: it is not asked again) or traces it missing.
    missing = [e for e in events(demo) if e["event"] == "route_missing"]
    assert len(missing) == sum(len(batch) for batch in calls.values()) - len(expected)
    assert state(demo)["nodes"]["route"]["calls"] == len(calls)


def _in_order(rounds: dict[str, Any]) -> list[str]:
    """Round names in the order they were asked: route, route-again, route-again2, …"""
    return sorted(rounds, key=lambda name: (name != "route", len(name), name))


def _last(rounds: dict[str, list[list[str]]]) -> str:
    last = _in_order(rounds)[-1]
    return last if len(rounds[last]) == 1 else f"{last}-b{len(rounds[last])}"


def test_a_reply_cut_off_at_max_tokens_counts_its_whole_lines_and_asks_about_the_rest(
    demo: Path, cli: Cli
) -> None:
    """A router that writes a sentence after each label, with [harness.router] max_tokens
    48: each reply is cut off (twice: the harness asks once more for a shorter one); its
    whole lines count, the line it stopped in does not, and the tickets it did not finish
    are asked about again until all six are routed as in the reference run."""
    config = demo / "ticketgraph.toml"
    config.write_text(config.read_text().replace("max_tokens = 512", "max_tokens = 48", 1))
    wordy = router()
    for rule in wordy["replies"][0]["lines"]:
        rule["text"] += ": as the ticket says, and the category's own description says so too"
    write_scenarios(demo / "scenarios" / "demo.yaml", [wordy])
    done = cli("run", "--stop-after", "route", cwd=demo)
    assert done.returncode == 2, done.stdout + done.stderr
    run_dir = demo / "runs" / state(demo)["run_id"]
    routes = json.loads((run_dir / "routes.json").read_text())
    assert {i: r["category"] for i, r in routes.items()} == {
        t: CATEGORY[label] for t, label in LABELS.items()
    }
    turns = [e for e in events(demo) if e["event"] == "turn" and e.get("node") == "route"]
    assert "length" in {t["finish"] for t in turns}
    assert [name for name in router_calls(run_dir) if "again" in name]
