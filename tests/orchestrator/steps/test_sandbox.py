"""Data stays inside its boundary: each worker reads only its own roots, and no path is ever
built from an id that is not a plain name."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from celery import Celery

from orchestrator.broker.redis_server import RedisServer
from orchestrator.config import declarations
from orchestrator.config.workspace import CONFIG_FILE, Workspace
from orchestrator.errors import RunStateError
from orchestrator.run import ids
from orchestrator.run.store import RunStore
from tests.conftest import Cli, demo_scripts, state, worker_processes, write_scenarios
from workers.builtin_tools import read_file
from workers.cancel import CancelToken
from workers.errors import PermanentToolError, ToolError
from workers.sandbox import Sandbox, root_problem
from workers.tools import Tool, ToolContext

SECRET = "sk-live-hunter2"


@pytest.fixture
def tricky(demo: Path, tmp_path: Path) -> Path:
    """The demo workspace plus everything an agent should never read."""
    (demo / ".env").write_text(f"LLM_API_KEY={SECRET}\n")
    (demo / "kb" / ".hidden.md").write_text(SECRET)
    (demo / "kb-secrets").mkdir()
    (demo / "kb-secrets" / "x.md").write_text(SECRET)
    (demo / "runs" / "run-x").mkdir(parents=True)
    (demo / "runs" / "run-x" / "run.json").write_text(SECRET)
    (demo / "out" / "T-9.txt").write_text(SECRET)
    (tmp_path / "outside.txt").write_text(SECRET)
    os.symlink(demo / "inbox" / "T-1001.txt", demo / "kb" / "link-to-inbox.md")
    os.symlink(tmp_path / "outside.txt", demo / "kb" / "link-out.md")
    return demo


def _context(workspace: Path, reads: list[str]) -> ToolContext:
    return ToolContext(CancelToken(), files=Sandbox(workspace, reads))


def _read(workspace: Path, path: str) -> str:
    """The bug worker's read_file, over its readable roots (the demo: kb)."""
    return read_file.run(read_file.args(path=path), _context(workspace, ["kb"]))


def _lookup_order(workspace: Path) -> Tool:
    """The demo's own lookup_order tool, imported from the workspace as a worker does."""
    return declarations.preload(Workspace(workspace)).tools["demo_tools:lookup_order"]


def test_the_bug_worker_reads_its_knowledge_base(tricky: Path) -> None:
    assert "KI-88" in _read(tricky, "kb/known-issues.md")


@pytest.mark.parametrize(
    "escape",
    [
        "inbox/T-1001.txt",  # another customer's ticket
        ".env",  # a dotfile at the root
        "kb/.hidden.md",  # a dotfile inside a root
        "ticketgraph.toml",  # the workspace root itself is not readable
        "../outside.txt",  # up and out
        "kb/../inbox/T-1001.txt",  # up through a root
        "kb/../../outside.txt",
        "/etc/hostname",  # absolute
        "kb/link-to-inbox.md",  # a symlink inside a root pointing elsewhere in the workspace
        "kb/link-out.md",  # a symlink out of the workspace
        "kb-secrets/x.md",  # a sibling whose name starts with the root's
        "runs/run-x/run.json",
        "out/T-9.txt",
        "data/orders.json",  # billing's root, not bug's
    ],
)
def test_every_escape_is_refused(tricky: Path, escape: str) -> None:
    with pytest.raises(PermanentToolError, match="permission denied"):
        _read(tricky, escape)


def test_a_missing_file_inside_a_root_is_a_correctable_error(tricky: Path) -> None:
    with pytest.raises(ToolError, match="no such file") as caught:
        _read(tricky, "kb/nope.md")
    assert not isinstance(caught.value, PermanentToolError)


def test_billing_reads_only_its_orders_file(tricky: Path) -> None:
    lookup = _lookup_order(tricky)
    args = lookup.args(order_id="A-77301")
    row = json.loads(lookup.run(args, _context(tricky, ["data/orders.json"])))
    assert row["charged_times"] == 2
    with pytest.raises(PermanentToolError, match="outside what this worker may read"):
        lookup.run(args, _context(tricky, ["kb"]))


@pytest.mark.parametrize(
    "root",
    [".", "", "./", "inbox", "runs/x", "out", "quarantine", ".env", "../x", "/etc", "kb/../inbox"],
)
def test_unsafe_roots_are_configuration_errors(root: str) -> None:
    assert root_problem(root) is not None


def test_a_root_that_links_out_of_the_workspace_is_refused(tricky: Path, tmp_path: Path) -> None:
    os.symlink(tmp_path, tricky / "elsewhere")
    with pytest.raises(PermanentToolError, match="outside the workspace"):
        Sandbox(tricky, ["elsewhere"])


def test_an_unsafe_root_in_the_config_stops_the_run_before_it_starts(demo: Path, cli: Cli) -> None:
    config = demo / CONFIG_FILE
    config.write_text(config.read_text().replace('reads = ["kb"]', 'reads = ["inbox"]'))
    done = cli("run", cwd=demo)
    assert done.returncode == 78, done.stderr
    assert "inbox/ is never readable" in done.stderr


def test_an_agent_that_reaches_for_a_secret_gets_nothing_and_a_human_looks(
    tricky: Path, cli: Cli
) -> None:
    """Through the real graph: the bug worker asks for .env; the ticket needs a human, and the
    secret is nowhere in the run's files or replies."""
    scripts = demo_scripts()
    t1002 = next(s for s in scripts if s["name"] == "T-1002#1")
    t1002["replies"][0]["tool_calls"][0]["arguments"] = {"path": ".env"}
    write_scenarios(tricky / "scenarios" / "demo.yaml", scripts)
    done = cli("run", cwd=tricky)
    assert done.returncode == 1, done.stderr
    ticket = state(tricky)["tickets"]["T-1002"]
    assert ticket["status"] == "needs_human" and "permission denied" in ticket["error"]
    run_dir = tricky / "runs" / state(tricky)["run_id"]
    leaked = [p for p in [*run_dir.rglob("*"), *(tricky / "out").glob("T-10*")] if p.is_file()]
    assert leaked and not any(SECRET in p.read_text(errors="replace") for p in leaked)


def test_paths_are_never_built_from_an_id_that_is_not_a_plain_name(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "run-1")
    for bad in ("../../../p10-escape", "a/b", "..", ".hidden", ""):
        with pytest.raises(RunStateError):
            store.record_path(bad)
        with pytest.raises(RunStateError):
            ids.out_file(Workspace(tmp_path), bad)
    with pytest.raises(RunStateError):
        store.agent_path("T-1", "../draft")
    with pytest.raises(RunStateError):
        RunStore(tmp_path / "runs" / "..")


def test_a_forged_message_with_a_path_for_a_ticket_id_writes_nothing(
    demo: Path, cli: Cli, tmp_path: Path
) -> None:
    """A draft task sent straight to the broker with `../../../p10-escape` as its ticket id
    (as an edited state file or a hostile client would): the worker refuses to make a path
    of it, writes nothing outside, and stays up."""
    assert cli("run", "--stop-after", "route", cwd=demo).returncode == 2
    run_dir = demo / "runs" / state(demo)["run_id"]
    with RedisServer(tcp=True) as redis:
        env = {"TICKETGRAPH_BROKER_URL": redis.url, "LLM_BASE_URL": "http://127.0.0.1:9/v1"}
        with worker_processes(env, tmp_path, ["forged"], threads=1) as (worker,):
            sender = Celery(broker=redis.url)
            sender.send_task("orchestrator.draft", args=[str(run_dir), "a1", "../../../p10-escape"])
            sender.close()
            log = tmp_path / "forged.log"
            deadline = time.monotonic() + 30
            while "is not a ticket id" not in log.read_text():
                assert time.monotonic() < deadline, log.read_text()[-2000:]
                time.sleep(0.1)
            assert worker.poll() is None
    assert not [p for p in tmp_path.rglob("*p10-escape*")]
    assert not [p for p in demo.parent.parent.rglob("*p10-escape*")]
    assert json.loads((run_dir / "run.json").read_text())["status"] == "stopped_early"
