"""Writes happen effectively once: idempotency keys and the workspace's effect ledger, and
decisions nobody can forge (signed, verified by every worker).

Real processes: a private Redis, `ticketgraph worker` processes, the scripted provider over
HTTP, every command a subprocess, and a SIGKILL inside a write tool.
"""

from __future__ import annotations

import json
import os
import signal
import stat
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator.config.workspace import CONFIG_FILE
from tests.conftest import Cli, state, worker_processes, write_scenarios
from tests.orchestrator.run.test_approvals import (
    _background,
    _provider,
    _refund_lines,
    _run_id,
    _trace,
    _wait_for_tool_start,
    _with_refund,
)
from tests.orchestrator.web.conftest import web_server

SLEEPY_REFUND = '''"""request_refund: waits 3 s, then files the refund (a kill lands before it)."""

from workers import ToolContext, tool


@tool(read_only=False, idempotent={idempotent})
def request_refund(order_id: str, amount_cents: int, reason: str, ctx: ToolContext) -> str:
    """Ask finance to refund an order."""
    ctx.cancel.sleep(3)
    ctx.act("refund", order_id=order_id, amount_cents=amount_cents, reason=reason)
    return "refund requested"
'''


def _sleepy_refund(demo: Path, idempotent: bool) -> None:
    """T-1001's worker files its refund with the sleepy tool; the policy approves it."""
    (demo / "sleepy_refund.py").write_text(SLEEPY_REFUND.format(idempotent=idempotent))
    config = demo / CONFIG_FILE
    text = config.read_text().replace(
        '"demo_tools:request_refund"', '"sleepy_refund:request_refund"'
    )
    config.write_text(
        text.replace('request_refund = "amount_cents > 5000"', 'request_refund = "never"')
    )
    write_scenarios(demo / "scenarios" / "demo.yaml", _with_refund(2000))


def _events(demo: Path, name: str, run_id: str | None = None) -> list[dict[str, Any]]:
    run = run_id or _run_id(demo)
    lines = (demo / "runs" / run / "run.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == name]


def _killed_in_the_refund(demo: Path, tmp_path: Path, cli: Cli, broker: str) -> dict[str, Any]:
    """Run the demo on two workers; SIGKILL the one inside the refund; the run's start."""
    with _provider(tmp_path, _with_refund(2000)) as llm:
        env = {
            "TICKETGRAPH_BROKER_URL": broker,
            "LLM_BASE_URL": llm,
            "TICKETGRAPH_VISIBILITY_TIMEOUT_S": "5",
            "TICKETGRAPH_RESTORE_INTERVAL_S": "1",
        }
        with worker_processes(env, tmp_path, ["w1", "w2"]):
            run = _background(cli, demo, env, "run")
            runs = demo / "runs"
            started = _wait_for_tool_start(_newest(runs), "request_refund")
            os.kill(started["pid"], signal.SIGKILL)  # inside the tool, before it writes
            done = run.result(timeout=180)
        assert done.returncode in (0, 1), done.stdout + done.stderr
    return started


def _newest(runs: Path) -> Path:
    import time

    for _ in range(3000):
        found = sorted(runs.glob("run-*")) if runs.is_dir() else []
        if found and (found[-1] / "run.jsonl").exists():
            return found[-1]
        time.sleep(0.02)
    raise AssertionError("no run started")


def test_an_idempotent_refund_cut_by_a_kill_runs_once_with_one_key_and_requeue_never_repeats_it(
    broker: str, demo: Path, tmp_path: Path, cli: Cli
) -> None:
    _sleepy_refund(demo, idempotent=True)
    first = _killed_in_the_refund(demo, tmp_path, cli, broker)
    key = first["key"]
    refunds = _refund_lines(demo)
    assert [(r["amount_cents"], r["key"]) for r in refunds] == [(2000, key)]  # exactly one
    assert _events(demo, "write_unsure") == []
    assert [e["key"] for e in _events(demo, "write_repeated")] == [key]
    assert [e["key"] for e in _events(demo, "tool_start") if e["tool"] == "request_refund"] == [
        key,
        key,
    ]  # the first run and the redelivered one saw the same key
    ticket = state(demo)["tickets"]["T-1001"]
    assert ticket["status"] == "pass" and not ticket.get("unsure_writes")
    refunded = _run_id(demo)
    with web_server(demo, "--no-auth") as url:  # the web view says it before a requeue
        page = httpx.get(f"{url}/runs/{refunded}/tickets/T-1001").text
    assert "request_refund (call call_r1" in page
    assert "on requeue, answered from the ledger" in page

    # Requeued (--force: its refund ran, so a requeue asks first, naming the ledger's answer):
    # the same call has the same key, and the ledger answers it (no second refund).
    asked = cli("requeue", refunded, "T-1001", cwd=demo)
    assert asked.returncode == 64 and "answered from the ledger" in asked.stderr
    moved = cli("requeue", refunded, "T-1001", "--force", cwd=demo)
    assert moved.returncode == 0, moved.stderr
    assert "T-1001 request_refund (call call_r1" in moved.stdout
    assert "answered from the ledger" in moved.stdout
    os.utime(demo / "inbox" / "T-1001.txt", (0, 0))
    again = cli("run", cwd=demo)
    assert again.returncode == 0, again.stdout + again.stderr
    assert _run_id(demo) != refunded
    assert _refund_lines(demo) == []
    assert [(e["key"], e["made_by"]) for e in _events(demo, "write_from_ledger")] == [
        (key, refunded)
    ]

    # A person asks for the writes again: a second refund, with a new key, and who asked.
    answered = _run_id(demo)
    forced = cli("requeue", answered, "T-1001", "--repeat-writes", cwd=demo)
    assert forced.returncode == 0, forced.stderr
    assert "runs again (--repeat-writes" in forced.stdout
    asked = _events(demo, "writes_repeat_asked", answered)
    assert [(e["ticket"], e["by"]) for e in asked] == [("T-1001", _me())]
    os.utime(demo / "inbox" / "T-1001.txt", (0, 0))
    assert cli("run", cwd=demo).returncode == 0
    second = _refund_lines(demo)
    assert [r["amount_cents"] for r in second] == [2000] and second[0]["key"] != key
    repeated = _events(demo, "writes_repeat")
    assert repeated and {(e["by"], e["repeats"]) for e in repeated} == {(_me(), 1)}


def _me() -> str:
    import getpass

    return getpass.getuser()


def test_a_write_not_safe_to_repeat_cut_by_a_kill_still_ends_write_unsure(
    broker: str, demo: Path, tmp_path: Path, cli: Cli
) -> None:
    _sleepy_refund(demo, idempotent=False)
    first = _killed_in_the_refund(demo, tmp_path, cli, broker)
    assert _refund_lines(demo) == []  # cut before it wrote, and never run again
    assert [e["key"] for e in _events(demo, "write_unsure")] == [first["key"]]
    ticket = state(demo)["tickets"]["T-1001"]
    assert (ticket["status"], ticket["stop"]) == ("needs_human", "write_unsure")


def _waiting_refund(demo: Path, cli: Cli) -> tuple[str, Path]:
    """A run whose T-1001 waits for a person's decision on a 399.00 refund."""
    write_scenarios(demo / "scenarios" / "demo.yaml", _with_refund(39900))
    assert cli("run", cwd=demo).returncode == 1
    run_id = _run_id(demo)
    return run_id, demo / "runs" / run_id / "decisions" / "T-1001.call_r1.json"


def _set_aside(demo: Path) -> list[str]:
    """Why each decision was refused (resume names it in the trace; nothing runs)."""
    refused = ("decision_refused", "decision_set_aside")
    return [e["why"] for e in _trace(demo) if e["event"] in refused]


def test_a_decision_written_or_edited_by_hand_is_refused_and_nothing_runs(
    demo: Path, cli: Cli
) -> None:
    run_id, path = _waiting_refund(demo, cli)
    asked = json.loads((path.parent.parent / "approvals" / path.name).read_text())
    forged = {
        "ticket": "T-1001",
        "call_id": "call_r1",
        "tool": "request_refund",
        "args_hash": asked["args_hash"],
        "approved": True,
        "by": "dana",
        "at": asked["asked_at"],
        "run_id": run_id,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(forged))
    listed = cli("pending", cwd=demo)
    assert "does not count (it is not signed" in listed.stdout
    assert cli("resume", run_id, cwd=demo).returncode == 1
    assert _refund_lines(demo) == []
    assert state(demo)["tickets"]["T-1001"]["status"] == "awaiting_approval"
    assert any("not signed" in why for why in _set_aside(demo))

    # A signed rejection, edited into an approval: its signature no longer verifies.
    assert cli("reject", run_id, "T-1001", "--reason", "no", cwd=demo).returncode == 0
    edited = json.loads(path.read_text())
    assert edited["signature"] and edited["key_id"]
    path.write_text(json.dumps(edited | {"approved": True}))
    assert "signature does not verify" in cli("pending", cwd=demo).stdout
    assert cli("resume", run_id, cwd=demo).returncode == 1
    assert _refund_lines(demo) == []
    assert any("signature does not verify" in why for why in _set_aside(demo))


def test_without_a_key_approve_exits_78_and_keys_init_sets_one_up_as_readme_says(
    demo: Path, cli: Cli, tmp_path: Path
) -> None:
    run_id, path = _waiting_refund(demo, cli)
    stranger = {"XDG_CONFIG_HOME": str(tmp_path / "someone-else")}
    refused = cli("approve", run_id, "T-1001", cwd=demo, env=stranger)
    assert refused.returncode == 78, refused.stderr
    assert "ticketgraph keys init" in refused.stderr
    assert not path.exists()

    made = cli("keys", "init", cwd=demo, env=stranger)
    assert made.returncode == 0, made.stderr
    private = tmp_path / "someone-else" / "ticketgraph" / "signing.key"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert len(list((demo / "keys").glob("*.pub"))) == 2  # init's, and this user's
    again = cli("keys", "init", cwd=demo, env=stranger)
    assert "trusted here already" in again.stdout

    assert cli("approve", run_id, "T-1001", cwd=demo, env=stranger).returncode == 0
    assert cli("resume", run_id, cwd=demo).returncode == 1  # T-1004 still needs a human
    assert state(demo)["tickets"]["T-1001"]["status"] == "pass"
    assert [r["amount_cents"] for r in _refund_lines(demo)] == [39900]


@pytest.mark.parametrize("template", ["demo", "minimal"])
def test_init_sets_up_the_users_key_outside_the_workspace(
    cli: Cli, tmp_path: Path, template: str
) -> None:
    home = {"XDG_CONFIG_HOME": str(tmp_path / "config")}
    made = cli("init", str(tmp_path / "ws"), "--template", template, cwd=tmp_path, env=home)
    assert made.returncode == 0, made.stderr
    private = tmp_path / "config" / "ticketgraph" / "signing.key"
    assert private.exists() and "PRIVATE KEY" in private.read_text()
    (public,) = (tmp_path / "ws" / "keys").glob("*.pub")
    assert public.read_text().startswith("ed25519 ")
    assert not list((tmp_path / "ws").rglob("*.key"))
    assert str(private) in made.stdout


def test_threads_that_ask_a_fresh_workspace_for_its_id_at_once_all_read_the_same_one(
    tmp_path: Path,
) -> None:
    """The first tickets of a fresh workspace ask for its id at once: every one gets the
    whole id (never the empty file another thread had created and not yet written), and a
    workspace made again at the same path has its new id read, not the one a process knew."""
    import threading

    from orchestrator.run import ledger
    from orchestrator.run.workspace import Workspace

    workspace = Workspace(tmp_path)
    start, seen = threading.Barrier(16), []

    def ask() -> None:
        start.wait()
        seen.append(ledger.workspace_id(workspace))

    threads = [threading.Thread(target=ask) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    made = (tmp_path / "ledger" / "id").read_text().strip()
    assert len(made) == 32 and seen == [made] * 16
    assert [p.name for p in (tmp_path / "ledger").iterdir()] == ["id"]  # no temp left
    assert ledger.workspace_id(workspace) == made
    (tmp_path / "ledger" / "id").unlink()  # the workspace made again: a new id file
    again = ledger.workspace_id(workspace)
    assert len(again) == 32 and again != made
