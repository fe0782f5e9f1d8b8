"""Workers declared by the team that runs them: a category of its own (`shipping`) whose
worker uses a tool from a Python package on the workers' import path, a gate check of its
own, both named in ticketgraph.toml; run embedded and on two `ticketgraph worker`
processes. And what must be refused: a module that cannot be imported (before anything is
claimed), a worker whose tools differ from the run's (no draft made with them), old tables.
"""

from __future__ import annotations

import contextlib
import re
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator.broker.redis_server import RedisServer
from orchestrator.config import declarations
from orchestrator.config.workspace import CONFIG_FILE, Workspace
from orchestrator.exit_codes import ExitCode
from orchestrator.run.store import RunStore
from tests.conftest import (
    REFERENCE_TICKETS,
    Cli,
    demo_scripts,
    drop,
    state,
    ticket_rows,
    worker_processes,
    write_scenarios,
)
from workers import versions
from workers.provider import running_provider
from workers.settings import masked

TOOLS_PY = '''
"""Shipping tools of the team (a package on the workers' import path)."""

from typing import Annotated

from pydantic import Field

from workers import ToolContext, ToolError, tool

PARCELS = {"1Z999AA1": "in transit: at the Leipzig depot since this morning"}


@tool
def track_parcel(
    tracking_id: Annotated[str, Field(description="the carrier's tracking id, e.g. 1Z999AA1")],
    ctx: ToolContext,
) -> str:
    """Where a parcel is now, by its carrier tracking id."""
    if tracking_id not in PARCELS:
        raise ToolError(f"no parcel {tracking_id}")
    ctx.progress("asked the carrier")
    return PARCELS[tracking_id]
'''

CHECKS_PY = '''
"""The team's own gate rule: never promise a discount."""


def no_discounts(draft, ticket):
    return ["promises a discount"] if "discount" in draft.lower() else []
'''

SHIPPING = """
[workers.shipping]
description = "where a parcel is, delivery and carriers"
prompt = "You are the shipping desk. Find the parcel with track_parcel, then answer."
tools = ["shipco.tools:track_parcel"]
"""

FIRST = (
    "Ticket T-3001: parcel 1Z999AA1 is in transit at the Leipzig depot since this morning; "
    "as an apology we add a discount to your next order."
)
SECOND = (
    "Ticket T-3001: parcel 1Z999AA1 is in transit at the Leipzig depot since this morning "
    "and should reach you tomorrow; the tracking link updates as it moves."
)
SCHEMA = {
    "properties": {
        "tracking_id": {"description": "the carrier's tracking id, e.g. 1Z999AA1", "type": "string"}
    },
    "required": ["tracking_id"],
    "type": "object",
}


def _package(folder: Path, tools: str = TOOLS_PY) -> Path:
    """The `shipco` package in `folder` (to put on PYTHONPATH); returns `folder`."""
    package = folder / "shipco"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "tools.py").write_text(textwrap.dedent(tools))
    (package / "checks.py").write_text(textwrap.dedent(CHECKS_PY))
    return folder


def _shipping_scripts() -> list[dict[str, Any]]:
    scripts = demo_scripts()
    router = next(s for s in scripts if s["name"] == "router")
    router["replies"][0]["text"] += "\nT-3001: shipping"
    ours = [
        {
            "name": "T-3001#2",
            "when": {"user": "^Your previous draft for ticket T-3001"},
            "replies": [{"text": SECOND, "usage": {"prompt_tokens": 500, "completion_tokens": 40}}],
        },
        {
            "name": "T-3001#1",
            "when": {"user": "^Ticket id: T-3001\\b"},
            "replies": [
                {
                    "tool_calls": [
                        {
                            "id": "call_s1",
                            "name": "track_parcel",
                            "arguments": {"tracking_id": "1Z999AA1"},
                        }
                    ],
                    "usage": {"prompt_tokens": 300, "completion_tokens": 20},
                },
                {"text": FIRST, "usage": {"prompt_tokens": 400, "completion_tokens": 40}},
            ],
        },
    ]
    return ours + scripts


def _shipping(demo: Path) -> Path:
    """The demo workspace with the `shipping` category and the team's check; returns the
    scenario file (the demo's scripts plus T-3001's)."""
    config = demo / "ticketgraph.toml"
    text = config.read_text().replace(
        'categories = ["billing", "bug", "other"]',
        'categories = ["billing", "bug", "shipping", "other"]',
    )
    text = text.replace("checks = []", 'checks = ["shipco.checks:no_discounts"]')
    config.write_text(text.replace("[templates.other]", SHIPPING + "\n[templates.other]"))
    drop(demo / "inbox", "T-3001.txt", "Where is my parcel 1Z999AA1? It was due yesterday.")
    return write_scenarios(demo / "scenarios" / "demo.yaml", _shipping_scripts())


def _assert_shipping_run(demo: Path, stats: dict[str, Any]) -> None:
    record = state(demo)
    rows = ticket_rows(record)
    assert {i: rows[i] for i in REFERENCE_TICKETS} == REFERENCE_TICKETS
    assert rows["T-3001"] == ("shipping", "worker:shipping", 1, "gate_pass", "pass")
    assert record["tickets"]["T-3001"]["gate_reports"] == ["no_discounts:promises a discount"]
    assert stats["tools"]["T-3001#1"] == {"track_parcel": SCHEMA}  # the declared schema
    agent = versions.read_json(demo / "runs" / record["run_id"] / "agents" / "T-3001.draft.json")
    results = [m["content"] for m in agent["messages"] if m["role"] == "tool"]
    assert results == ["in transit: at the Leipzig depot since this morning"]
    assert (demo / "out" / "T-3001.txt").read_text().strip() == SECOND


def test_a_category_of_ones_own_runs_embedded(demo: Path, cli: Cli, tmp_path: Path) -> None:
    lib = _package(tmp_path / "lib")
    scenario = _shipping(demo)
    with running_provider(scenario) as url:
        done = cli("run", cwd=demo, env={"PYTHONPATH": str(lib), "LLM_BASE_URL": url})
        stats = httpx.get(url.replace("/v1", "/stats")).json()
    assert done.returncode == 1, done.stdout + done.stderr
    assert "T-3001=shipping" in done.stdout
    _assert_shipping_run(demo, stats)


@contextlib.contextmanager
def _cluster(
    tmp: Path, scenario: Path, worker_lib: Path, names: list[str], workspace: Path | None = None
) -> Iterator[tuple[dict[str, str], str]]:
    """Redis, the provider, and `ticketgraph worker` processes with `worker_lib` on their
    import path (loading `workspace`'s declarations as they start, if given)."""
    args = ["--workspace", str(workspace)] if workspace is not None else []
    with RedisServer(tcp=True) as redis, running_provider(scenario) as url:
        env = {"TICKETGRAPH_BROKER_URL": redis.url, "LLM_BASE_URL": url}
        with worker_processes({**env, "PYTHONPATH": str(worker_lib)}, tmp, names, args=args):
            yield env, url.replace("/v1", "/stats")


def test_a_category_of_ones_own_runs_on_two_worker_processes(
    demo: Path, cli: Cli, tmp_path: Path
) -> None:
    lib = _package(tmp_path / "lib")
    scenario = _shipping(demo)
    with _cluster(tmp_path, scenario, lib, ["w1", "w2"], workspace=demo) as (env, stats):
        done = cli("run", cwd=demo, env={**env, "PYTHONPATH": str(lib)})
        _assert_shipping_run(demo, httpx.get(stats).json())
    assert done.returncode == 1, done.stdout + done.stderr


def test_a_worker_whose_tools_differ_from_the_runs_drafts_nothing(
    demo: Path, cli: Cli, tmp_path: Path
) -> None:
    """The run is started with one version of shipco.tools; the only worker has another
    (another machine, another deploy): every ticket it is given ends `declarations_differ`
    with the reason, and no draft request is ever made."""
    lib = _package(tmp_path / "lib")
    other = _package(tmp_path / "other", TOOLS_PY.replace("since this morning", "since noon"))
    scenario = _shipping(demo)
    with _cluster(tmp_path, scenario, other, ["w1"]) as (env, stats):
        done = cli("run", cwd=demo, env={**env, "PYTHONPATH": str(lib)})
        served = httpx.get(stats).json()["scripts"]
    assert done.returncode == 1, done.stdout + done.stderr
    tickets = state(demo)["tickets"]
    refused = {i: t for i, t in tickets.items() if t["handler"] != "template"}
    assert refused and all(t["stop"] == "declarations_differ" for t in refused.values())
    assert (
        "tools and checks differ from those the run was started with" in tickets["T-3001"]["error"]
    )
    assert set(served) == {"router"}  # the router's call, and no draft or rewrite


def test_a_process_compares_a_runs_declarations_once(
    demo: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every ticket's task asks whether this process runs the run's declarations; once they
    matched, the answer is known (what a process imported never changes). A fingerprint
    that did not match is asked again, and still refused."""
    assert cli("run", cwd=demo).returncode == 1
    config = RunStore(demo / "runs" / state(demo)["run_id"]).meta().config
    assert declarations.mismatch(Workspace(demo), config) is None

    def not_again(*_: object) -> None:
        raise AssertionError("declarations loaded again for a run that matched")

    monkeypatch.setattr(declarations, "load", not_again)
    assert declarations.mismatch(Workspace(demo), config) is None
    monkeypatch.undo()
    other = config.model_copy(update={"fingerprint": "0" * 64})
    for _ in range(2):
        assert "differ from those the run was started with" in str(
            declarations.mismatch(Workspace(demo), other)
        )


def test_a_tools_module_that_cannot_be_imported_stops_the_run_before_it_claims(
    demo: Path, cli: Cli, tmp_path: Path
) -> None:
    lib = _package(tmp_path / "lib", TOOLS_PY + "\nraise RuntimeError('half deployed')\n")
    _shipping(demo)
    done = cli("run", cwd=demo, env={"PYTHONPATH": str(lib)})
    assert done.returncode == 78, done.stderr
    assert done.stderr.count("\n") == 1
    assert "[workers.shipping] tools: module 'shipco.tools' failed to import" in done.stderr
    assert "half deployed" in done.stderr
    assert len(list((demo / "inbox").iterdir())) == 7 and not (demo / "runs").exists()
    missing = cli("run", cwd=demo)  # no PYTHONPATH: the package is nowhere
    assert missing.returncode == 78 and "no module 'shipco.tools'" in missing.stderr


def test_a_worker_loads_what_its_workspaces_declare_as_it_starts(
    demo: Path, cli: Cli, tmp_path: Path
) -> None:
    """`ticketgraph worker --workspace DIR` imports the declared modules before it serves
    anything, and stops (exit 78, naming the module) when one cannot be imported."""
    _shipping(demo)
    with RedisServer(tcp=True) as redis:
        env = {"TICKETGRAPH_BROKER_URL": redis.url, "LLM_BASE_URL": "http://127.0.0.1:9/v1"}
        done = cli("worker", "--workspace", str(demo), cwd=tmp_path, env=env, timeout=60)
    assert done.returncode == 78, done.stdout + done.stderr
    assert "no module 'shipco.tools'" in done.stderr


@pytest.mark.parametrize(
    ("table", "pointer"),
    [
        ("[harness.billing]\nmax_turns = 2\n", "[harness.billing] is now [workers.billing]"),
        ('[tools.reads]\nbug = ["kb"]\n', "[tools] is gone"),
    ],
)
def test_the_tables_of_earlier_versions_say_where_they_went(
    demo: Path, cli: Cli, table: str, pointer: str
) -> None:
    config = demo / "ticketgraph.toml"
    config.write_text(config.read_text() + "\n" + table)
    done = cli("run", cwd=demo)
    assert done.returncode == 78 and pointer in done.stderr, done.stderr


def test_every_category_needs_a_worker_or_a_template(demo: Path, cli: Cli) -> None:
    config = demo / "ticketgraph.toml"
    config.write_text(
        config.read_text().replace('"bug", "other"]', '"bug", "shipping", "other"]', 1)
    )
    done = cli("run", cwd=demo)
    assert done.returncode == 78
    assert (
        "category 'shipping' has neither a [workers.shipping] nor a [templates.shipping]"
        in done.stderr
    )


def test_init_minimal_then_check_passes_with_a_model_and_shows_each_category(
    cli: Cli, tmp_path: Path
) -> None:
    """A fresh minimal workspace has no model yet: `check` says so (78, as `run` would);
    with LLM_BASE_URL set to a server that answers, it passes and shows each category."""
    made = cli("init", "mine", "--template", "minimal", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    mine = tmp_path / "mine"
    assert not (mine / "scenarios").exists() and (mine / "my_tools.py").exists()
    no_model = cli("check", "--workspace", str(mine), cwd=tmp_path)
    assert no_model.returncode == ExitCode.CONFIG, no_model.stdout + no_model.stderr
    assert "set LLM_BASE_URL" in no_model.stderr and "offline" in no_model.stderr
    with running_provider("harness") as url:
        env = {"LLM_BASE_URL": url}
        checked = cli("check", "--workspace", str(mine), cwd=tmp_path, env=env)
    assert checked.returncode == 0, checked.stderr
    assert "orders: worker" in checked.stdout and "tools: order_status" in checked.stdout
    assert "account: worker" in checked.stdout and "search_files, read_file" in checked.stdout
    assert "other: template" in checked.stdout
    assert f"model endpoint: {url}" in checked.stdout
    nothing = [p for p in mine.rglob("*") if p.is_file() and p.parent.name in ("runs", "out")]
    assert nothing == []  # checked, not run


def test_check_shows_the_model_endpoint_without_its_password(demo: Path, cli: Cli) -> None:
    url = "https://team:s3cret@llm.example/openai/deployments/d?api-version=2024-06-01"
    checked = cli("check", cwd=demo, env={"LLM_BASE_URL": url})
    assert checked.returncode == 0, checked.stderr
    assert "https://team:**@llm.example/openai/deployments/d?api-version=2024-06-01" in (
        checked.stdout
    )
    assert "s3cret" not in checked.stdout + checked.stderr


@pytest.mark.parametrize("command", ["run", "check"])
def test_a_base_url_the_client_cannot_parse_is_refused_without_its_password(
    demo: Path, cli: Cli, command: str
) -> None:
    """A raw '?' in the password: httpx reads the rest as a port ("Invalid port: 's3'") and
    the run crashed with that, after claiming the inbox. It is a bad setting (78) before any
    ticket is claimed, and nothing of the password is printed."""
    url = "https://team:s3q?cr3t@llm.example/v1"
    inbox = sorted(p.name for p in (demo / "inbox").iterdir())
    done = cli(command, cwd=demo, env={"LLM_BASE_URL": url})
    assert done.returncode == ExitCode.CONFIG, done.stdout + done.stderr
    assert "LLM_BASE_URL='https://team:**@llm.example/v1'" in done.stderr
    assert "percent-encoded" in done.stderr
    assert "s3q" not in done.stdout + done.stderr and "cr3t" not in done.stdout + done.stderr
    assert sorted(p.name for p in (demo / "inbox").iterdir()) == inbox  # nothing claimed


def test_masked_hides_a_password_that_holds_an_at_sign() -> None:
    assert masked("https://team:p@ss@h/v1?api-version=1") == "https://team:**@h/v1?api-version=1"
    assert masked("HTTPS://team:s3cret@h/v1") == "HTTPS://team:**@h/v1"
    assert masked("https://h/v1?x=a@b:c") == "https://h/v1?x=a@b:c"
    assert masked("https://team:s3?cr#t@h/v1") == "https://team:**@h/v1"


def test_check_names_the_first_problem(demo: Path, cli: Cli) -> None:
    (demo / "prompts" / "bug.md").write_text("")
    done = cli("check", cwd=demo)
    assert done.returncode == 78
    assert "[workers.bug] prompt_file 'prompts/bug.md' is empty" in done.stderr


def test_a_ticket_of_ones_own_in_the_demo_is_told_no_script_matched(demo: Path, cli: Cli) -> None:
    """A new user's first ticket, in the demo (the scripted provider knows only its six):
    it needs a human, and the reason says why, instead of passing with a canned reply."""
    drop(demo / "inbox", "T-9001.txt", "My invoice shows the wrong VAT number")
    done = cli("run", cwd=demo)
    assert done.returncode == 1
    ticket = state(demo)["tickets"]["T-9001"]
    assert (ticket["status"], ticket["stop"]) == ("needs_human", "unrouted")
    assert "scenarios/demo.yaml has no line `T-9001: <category>`" in ticket["error"]
    assert "ticketgraph scenarios init" in ticket["error"]
    assert "LLM_BASE_URL" in ticket["error"] and "T-9001 (unrouted)" in done.stdout


def test_tickets_waiting_to_settle_are_counted_and_dated(demo: Path, cli: Cli) -> None:
    for path in (demo / "inbox").iterdir():
        path.unlink()
    # 30 s to settle, however long the CLI takes to start on a loaded machine (with the
    # demo's 1 s it once took longer, and the file had settled).
    config = demo / CONFIG_FILE
    text = config.read_text()
    assert "settle_s = 1.0 " in text
    config.write_text(text.replace("settle_s = 1.0 ", "settle_s = 30 "))
    (demo / "inbox" / "T-5001.txt").write_text("just copied in")  # changed now
    done = cli("run", cwd=demo)
    assert done.returncode == 0
    assert re.search(
        r"nothing to claim yet: 1 file changed less than 30 s ago .*claimable from \d\d:\d\d:\d\d",
        done.stdout,
    ), done.stdout
