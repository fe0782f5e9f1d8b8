"""Decisions that cannot be stranded: an expired call, a tampered call and a model that
reuses a tool-call id each end in a state `pending` shows (or, expired, one it rightly does
not), with a way out that works.

Real processes: every command (`run`, `pending`, `approve`, `reject`, `resume`, `requeue`) a
subprocess on the demo workspace, embedded (its own Redis and workers), the scripted
provider answering the scripts written here; decision files written by hand stand for a
person or a program that writes the run folder directly.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from orchestrator.config.workspace import CONFIG_FILE
from orchestrator.run.approvals import args_hash
from tests.conftest import Cli, state, write_scenarios
from tests.orchestrator.run.test_approvals import (
    _pending_amounts,
    _refund,
    _refund_lines,
    _run_id,
    _trace,
    _with_refund,
)
from workers import versions
from workers.provider import running_provider


def _also_t1004(scripts: list[dict[str, Any]], first: dict[str, Any]) -> list[dict[str, Any]]:
    """`scripts` with T-1004's worker replying `first` before its own replies."""
    t1004 = next(s for s in scripts if s["name"] == "T-1004#1")
    t1004["replies"] = [first, *t1004["replies"]]
    return scripts


def _write_decision(run_dir: Path, ticket: str, call: str, **fields: Any) -> None:
    """A decision file written by hand (not through `approve`): approved, for the request's
    arguments, by dana, now, unless `fields` say otherwise."""
    asked = json.loads((run_dir / "approvals" / f"{ticket}.{call}.json").read_text())
    made = {
        "ticket": ticket,
        "call_id": call,
        "tool": asked["tool"],
        "args_hash": asked["args_hash"],
        "approved": True,
        "by": "dana",
        "at": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
        "reason": "",
    }
    (run_dir / "decisions").mkdir(exist_ok=True)
    (run_dir / "decisions" / f"{ticket}.{call}.json").write_text(json.dumps(made | fields))


def _pending_rows(cli: Cli, workspace: Path) -> dict[str, dict[str, Any]]:
    listed = cli("pending", "--json", cwd=workspace)
    assert listed.returncode == 0, listed.stderr
    return {r["ticket"]: r for r in json.loads(listed.stdout)}


def _statuses(workspace: Path) -> dict[str, tuple[str, str | None]]:
    tickets = state(workspace)["tickets"]
    return {t: (tickets[t]["status"], tickets[t]["stop"]) for t in ("T-1001", "T-1004")}


def _set_aside(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "run.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == "decision_set_aside"]


def test_an_expired_call_leaves_pending_cannot_be_approved_and_a_late_decision_never_runs(
    demo: Path, cli: Cli
) -> None:
    write_scenarios(demo / "scenarios" / "demo.yaml", _with_refund(39900))
    config = demo / CONFIG_FILE
    config.write_text(config.read_text().replace("expire_h = 72 ", "expire_h = 0.0025 "))  # 9 s
    assert cli("run", cwd=demo).returncode == 1
    run_id = _run_id(demo)
    run_dir = demo / "runs" / run_id
    assert _pending_amounts(cli, demo) == [("T-1001", 39900)]
    asked = json.loads((run_dir / "approvals" / "T-1001.call_r1.json").read_text())
    asked_at = datetime.fromisoformat(asked["asked_at"].replace("Z", "+00:00")).timestamp()
    time.sleep(max(0.0, asked_at + 9.5 - time.time()))

    # Past its expiry, before any resume: not listed, and no decision can be made.
    assert cli("pending", cwd=demo).stdout == "no tool call waits for a decision\n"
    refused = cli("approve", run_id, "T-1001", "--by", "dana", cwd=demo)
    assert refused.returncode == 64, refused.stdout + refused.stderr
    assert "expired" in refused.stderr and f"ticketgraph requeue {run_id} T-1001" in refused.stderr
    assert not (run_dir / "decisions" / "T-1001.call_r1.json").exists()
    # A decision written anyway (by hand, or on a machine whose clock is behind) is checked
    # again when it would be applied: made after the expiry, it never runs the refund.
    _write_decision(run_dir, "T-1001", "call_r1")
    assert cli("pending", cwd=demo).stdout == "no tool call waits for a decision\n"
    late = cli("resume", run_id, cwd=demo)
    assert late.returncode == 1, late.stdout + late.stderr
    assert "expired undecided: T-1001" in late.stdout
    ticket = state(demo)["tickets"]["T-1001"]
    assert (ticket["status"], ticket["stop"]) == ("needs_human", "approval_expired")
    assert "after the call expired" in ticket["error"]
    assert _refund_lines(demo) == []
    again = cli("approve", run_id, "T-1001", "--by", "dana", cwd=demo)
    assert again.returncode == 64 and "expired" in again.stderr
    assert cli("pending", cwd=demo).stdout == "no tool call waits for a decision\n"

    # The way out: requeue puts the ticket back; a new run asks for its refund again.
    requeued = cli("requeue", run_id, "T-1001", cwd=demo)
    assert requeued.returncode == 0, requeued.stderr
    assert (demo / "inbox" / "T-1001.txt").exists()
    assert cli("run", cwd=demo).returncode == 1
    rows = json.loads(cli("pending", "--json", cwd=demo).stdout)
    assert [(r["run_id"], r["ticket"]) for r in rows] == [(_run_id(demo), "T-1001")]
    assert _run_id(demo) != run_id


def test_each_tampered_decision_leaves_its_call_in_pending_and_deciding_again_works(
    demo: Path, cli: Cli
) -> None:
    scripts = _also_t1004(_with_refund(39900), _refund(12000, "call_x1"))
    write_scenarios(demo / "scenarios" / "demo.yaml", scripts)
    assert cli("run", cwd=demo).returncode == 1
    run_id = _run_id(demo)
    run_dir = demo / "runs" / run_id

    # 1. A decision file for other arguments (a wrong hash), and one that claims the policy
    # decided a call its rule sends to a person: neither counts, both calls stay listed.
    _write_decision(run_dir, "T-1001", "call_r1", args_hash=args_hash({"amount_cents": 1}))
    _write_decision(run_dir, "T-1004", "call_x1", by="policy", rule="amount_cents > 5000")
    rows = _pending_rows(cli, demo)
    assert "other arguments" in rows["T-1001"]["set_aside"]
    assert "policy" in rows["T-1004"]["set_aside"]
    first = cli("resume", run_id, cwd=demo)
    assert first.returncode == 1, first.stdout + first.stderr
    assert "2 tickets still wait for a decision" in first.stdout
    waiting = ("awaiting_approval", "awaiting_approval")
    assert _statuses(demo) == {"T-1001": waiting, "T-1004": waiting}
    assert _refund_lines(demo) == []

    # 2. Deciding again sets the bad file aside. Then the call's arguments are changed in
    # the agent's transcript after the approval, and T-1004's request file is deleted.
    assert cli("approve", run_id, "T-1001", "--by", "dana", cwd=demo).returncode == 0
    assert [e["call_id"] for e in _set_aside(run_dir)] == ["call_r1"]
    assert (run_dir / "decisions" / "void" / "T-1001.call_r1.1.json").exists()
    agent = run_dir / "agents" / "T-1001.draft.json"
    saved = versions.read_json(agent)
    calls = [c for m in saved["messages"] for c in m.get("tool_calls") or []]
    refund = next(c for c in calls if c["id"] == "call_r1")
    refund["function"]["arguments"] = refund["function"]["arguments"].replace("39900", "99000")
    agent.write_text(json.dumps(saved))
    (run_dir / "approvals" / "T-1004.call_x1.json").unlink()
    assert list(_pending_rows(cli, demo)) == []
    second = cli("resume", run_id, cwd=demo)
    assert second.returncode == 1, second.stdout + second.stderr
    assert _refund_lines(demo) == []  # the approval was for 399.00, not for 990.00
    assert _statuses(demo) == {"T-1001": waiting, "T-1004": waiting}
    assert sorted(_pending_amounts(cli, demo)) == [("T-1001", 99000), ("T-1004", 12000)]
    assert [e["call_id"] for e in _set_aside(run_dir)] == ["call_r1", "call_r1"]
    assert "other arguments" in _set_aside(run_dir)[-1]["why"]

    # 3. Decided again, on what they are now: the 990.00 refund runs once, T-1004's never.
    assert cli("approve", run_id, "T-1001", "--by", "dana", cwd=demo).returncode == 0
    reject = ("reject", run_id, "T-1004", "--reason", "not ours")
    assert cli(*reject, cwd=demo).returncode == 0
    third = cli("resume", run_id, cwd=demo)
    assert third.returncode == 1, third.stdout + third.stderr
    assert "taking up 2 decided tickets" in third.stdout
    assert [(r["ticket"], r["amount_cents"]) for r in _refund_lines(demo)] == [("T-1001", 99000)]
    assert all(s[0] != "awaiting_approval" for s in _statuses(demo).values())
    assert cli("pending", cwd=demo).stdout == "no tool call waits for a decision\n"


def test_a_reused_tool_call_id_is_answered_traced_and_its_write_waits_for_approval(
    demo: Path, tmp_path: Path, cli: Cli
) -> None:
    scripts = _with_refund(1000)  # call_r1 for 10.00: under the limit, the policy approves
    t1001 = next(s for s in scripts if s["name"] == "T-1001#1")
    t1001["replies"].insert(2, _refund(990000))  # call_r1 again, across turns, for 9,900.00
    two = {
        "tool_calls": [
            _refund(1000, "call_d1")["tool_calls"][0],
            _refund(990000, "call_d1")["tool_calls"][0],  # the same id in the same reply
        ],
        "usage": {"prompt_tokens": 900, "completion_tokens": 80},
    }
    scripts = _also_t1004(scripts, two)
    # T-1004's rewrite (another agent run, its own transcript) numbers its calls as the
    # draft did: the draft's approval of call_d1-2 must not approve the rewrite's.
    rewrite = next(s for s in scripts if s["name"] == "T-1004#2")
    rewrite["replies"] = [two, *rewrite["replies"]]
    with running_provider(write_scenarios(tmp_path / "scenarios.yaml", scripts)) as llm:
        env = {"LLM_BASE_URL": llm}
        done = cli("run", cwd=demo, env=env)
        assert done.returncode == 1, done.stdout + done.stderr
        run_id = _run_id(demo)
        small = [(r["call_id"], r["amount_cents"]) for r in _refund_lines(demo)]
        assert sorted(small) == [("call_d1", 1000), ("call_r1", 1000)]
        rows = _pending_rows(cli, demo)
        assert {t: (r["call_id"], r["args"]["amount_cents"]) for t, r in rows.items()} == {
            "T-1001": ("call_r1-2", 990000),
            "T-1004": ("call_d1-2", 990000),
        }
        reused = [e for e in _trace(demo) if e["event"] == "tool_call_id_reused"]
        assert sorted((e["ticket"], e["given"], e["call_id"]) for e in reused) == [
            ("T-1001", "call_r1", "call_r1-2"),
            ("T-1004", "call_d1", "call_d1-2"),
        ]

        for ticket in ("T-1001", "T-1004"):
            assert cli("approve", run_id, ticket, "--by", "dana", cwd=demo).returncode == 0
        resumed = cli("resume", run_id, cwd=demo, env=env)
        assert resumed.returncode == 1, resumed.stdout + resumed.stderr
        # The rewrite's own 9,900.00 call waits for a person of its own.
        assert _statuses(demo)["T-1004"] == ("awaiting_approval", "awaiting_approval")
        rows = _pending_rows(cli, demo)
        assert [(r["call_id"], r["step"], r["set_aside"]) for r in rows.values()] == [
            ("call_d1-2", "review", None)
        ]
        assert cli("approve", run_id, "T-1004", "--by", "dana", cwd=demo).returncode == 0
        again = cli("resume", run_id, cwd=demo, env=env)
        assert again.returncode == 1, again.stdout + again.stderr
        stats = httpx.get(llm.replace("/v1", "/stats")).json()
    refunds = [(r["ticket"], r["call_id"], r["amount_cents"]) for r in _refund_lines(demo)]
    assert sorted(refunds) == [
        ("T-1001", "call_r1", 1000),
        ("T-1001", "call_r1-2", 990000),
        ("T-1004", "call_d1", 1000),
        ("T-1004", "call_d1", 1000),  # the rewrite's, approved by the policy again
        ("T-1004", "call_d1-2", 990000),
        ("T-1004", "call_d1-2", 990000),  # the rewrite's, approved by dana again
    ]
    # Every call got exactly one answer and one result line in the trace; the provider
    # never saw a request a strict endpoint would refuse.
    assert stats["protocol_errors"] == {}
    results = [e for e in _trace(demo) if e["event"] == "tool_result"]
    agents = sorted((demo / "runs" / run_id / "agents").glob("T-100[14].*.json"))
    assert [a.name for a in agents] == [
        "T-1001.draft.json",
        "T-1004.draft.json",
        "T-1004.review-1.json",
    ]
    for path in agents:
        agent = versions.read_json(path)
        asked = [c["id"] for m in agent["messages"] for c in m.get("tool_calls") or []]
        answered = [m["tool_call_id"] for m in agent["messages"] if m["role"] == "tool"]
        assert len(asked) == len(set(asked)) and sorted(answered) == sorted(asked)
        traced = [e["call_id"] for e in results if e.get("agent_run_id") == agent["run_id"]]
        assert sorted(traced) == sorted(asked)
    assert _statuses(demo) == {
        "T-1001": ("pass", "gate_pass"),
        "T-1004": ("needs_human", "no_progress"),
    }
