"""The house as a new maintainer reads it: README's layout and docs/state.md match the code,
and the small things a new user saw are fixed (each through the real CLI)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import (
    REFERENCE_NODES,
    REFERENCE_TICKETS,
    REPO,
    Cli,
    clean_env,
    drop,
    state,
    ticket_rows,
)

ORCHESTRATOR = REPO / "orchestrator"


def _layout() -> str:
    readme = (REPO / "README.md").read_text()
    return readme.split("## Layout", 1)[1].split("```", 2)[1]


def test_readme_layout_names_every_room_of_orchestrator_and_nothing_else() -> None:
    rooms = {p.parent.name for p in ORCHESTRATOR.glob("*/__init__.py")}
    named = set(re.findall(r"^  (\w+)/", _layout(), flags=re.M))
    assert named == rooms
    modules = {p.name for p in ORCHESTRATOR.glob("*.py") if p.name != "__init__.py"}
    assert all(m in _layout() for m in modules), modules
    assert len(_layout().splitlines()) <= 25  # one screen


def test_docs_state_lists_every_redis_key_the_code_makes() -> None:
    keys_doc = (ORCHESTRATOR / "coordination" / "keys.py").read_text().split('"""')[1]
    parts = set(re.findall(r"tg:run:\S*?:(\w+)(?::<t>)?\s", keys_doc))
    state_doc = (REPO / "docs" / "state.md").read_text()
    assert parts and all(f":{part}" in state_doc for part in parts), parts
    assert "7-day TTL but the owner keys" in state_doc


def test_resume_prints_only_the_steps_it_ran(demo: Path, cli: Cli) -> None:
    stopped = cli("run", "--stop-after", "merge", cwd=demo)
    assert stopped.returncode == 2 and "[merge]" in stopped.stdout
    resumed = cli("resume", state(demo)["run_id"], cwd=demo)
    assert resumed.returncode == 1, resumed.stderr
    assert "[review]" in resumed.stdout
    for line in ("[route]", "[fanout]", "[merge]"):
        assert line not in resumed.stdout, resumed.stdout


def test_one_of_a_thing_is_not_a_plural(demo: Path, cli: Cli) -> None:
    """One ticket (T-1005: one rewrite round) and one file that is not a ticket."""
    inbox = demo / "inbox"
    for n in (1, 2, 3, 4, 6):
        (inbox / f"T-100{n}.txt").unlink()
    drop(inbox, "T-2000.txt", "")  # empty: quarantined
    done = cli("run", cwd=demo)
    assert done.returncode == 1, done.stderr  # a quarantined file: someone looks
    said = done.stdout
    assert "received 1 ticket: T-1005; 1 file quarantined" in said, said
    assert "1 draft" in said and "wrote 1 file to out/" in said
    assert "gate rewrites: 1 round in total" in said
    assert "out/: 1 reply; need a human: 0 tickets" in said
    assert "quarantine/: 1 file that is not a ticket" in said
    assert "; 1 ticket: 1 pass;" in said
    for wrong in ("1 tickets", "1 drafts", "1 files", "1 rounds", "1 replies"):
        assert wrong not in said


def test_runs_and_status_outside_a_workspace_are_the_same_usage_error(
    cli: Cli, tmp_path: Path
) -> None:
    for command in (["runs"], ["status"]):
        done = cli(*command, cwd=tmp_path)
        assert done.returncode == 64, done.stdout + done.stderr
        assert "no workspace at ." in done.stderr


def test_the_resume_hint_keeps_the_workspace(demo: Path, cli: Cli, tmp_path: Path) -> None:
    done = cli("run", "--stop-after", "merge", "--workspace", str(demo), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    run_id = state(demo)["run_id"]
    hint = f"ticketgraph resume {run_id} --workspace {demo}"
    assert hint in done.stdout, done.stdout
    here = cli("run", "--stop-after", "merge", cwd=demo)
    assert "--workspace" not in here.stdout  # from inside the workspace, none is needed


def test_an_unknown_harness_scenario_is_a_usage_error_listing_them(
    cli: Cli, tmp_path: Path
) -> None:
    done = cli("harness", "nosuch", cwd=tmp_path)
    assert done.returncode == 64, done.stderr
    assert "no scenario 'nosuch'" in done.stderr and "research_runaway" in done.stderr


def test_a_misspelt_flag_or_command_is_told_the_closest(cli: Cli, tmp_path: Path) -> None:
    flag = cli("run", "--stop-afer", "merge", cwd=tmp_path)
    assert flag.returncode == 64 and "Did you mean '--stop-after'?" in flag.stderr
    command = cli("rnu", cwd=tmp_path)
    assert command.returncode == 64 and "Did you mean 'run'?" in command.stderr


def test_help_is_wrapped_to_the_terminal(cli: Cli, tmp_path: Path) -> None:
    for command in ("run", "resume", "worker", "flower", "provider", "harness"):
        done = cli(command, "--help", cwd=tmp_path, env={"COLUMNS": "80"})
        assert done.returncode == 0
        assert max(map(len, done.stdout.splitlines())) <= 80, command


def test_a_reader_that_leaves_early_cuts_no_run_short_and_sees_no_error(demo: Path) -> None:
    """`ticketgraph run | head` and `status --json | head`: stdout's reader gone before the
    first line. The run still ends with its verdict's exit code, status exits 0, and neither
    says `Broken pipe`; a run without a budget counts its model calls in `budget` too."""
    read, write = os.pipe()
    os.close(read)  # the reader left before anything was written
    try:
        command = [sys.executable, "-m", "orchestrator.cli"]
        ran = subprocess.run(
            [*command, "run"], cwd=demo, stdout=write, stderr=subprocess.PIPE, env=clean_env()
        )
        shown = subprocess.run(
            [*command, "status", "--json"], cwd=demo, stdout=write, stderr=subprocess.PIPE
        )
    finally:
        os.close(write)
    assert (ran.returncode, ran.stderr) == (1, b""), ran.stderr
    assert (shown.returncode, shown.stderr) == (0, b""), shown.stderr
    record = state(demo)
    assert ticket_rows(record) == REFERENCE_TICKETS
    document = json.loads(
        subprocess.run([*command, "status", "--json"], cwd=demo, capture_output=True).stdout
    )
    calls = sum(calls for calls, _tokens, _rounds in REFERENCE_NODES.values())
    assert document["budget"]["limit_usd"] is None
    assert document["budget"]["calls"] == calls, document["budget"]


def test_the_harness_never_changes_the_demo_files_in_the_callers_folder(
    cli: Cli, tmp_path: Path
) -> None:
    """docs/harness.md's lines in one folder: approving `destructive` deletes access.log from
    the run's own copy of the demo files, so `harness plan` prints the page's figures after it
    as before, and the caller's folder holds only the state file it asked for."""
    page = (REPO / "docs" / "harness.md").read_text()
    shown = page.split("$ ticketgraph harness plan\n", 1)[1].splitlines()[0].split()
    for args in (
        ["plan"],
        ["destructive", "--state", "run.json"],
        ["destructive", "--resume", "run.json", "--approve"],
        ["plan"],
    ):
        done = cli("harness", *args, cwd=tmp_path)
        assert done.returncode in (0, 2), done.stderr
        if args == ["plan"]:
            words = done.stdout.splitlines()[0].split()
            assert [w for w in words if not w.startswith("ms=")] == [
                w for w in shown if not w.startswith("ms=")
            ]
    assert "completed" in done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]
