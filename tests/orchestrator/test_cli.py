"""The command line: --help everywhere, clear errors for bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.orchestrator.conftest import Cli

COMMANDS = ["init", "run", "resume", "worker", "harness", "provider"]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_explains_itself(cli: Cli, tmp_path: Path, command: str) -> None:
    done = cli(command, "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout and len(done.stdout.splitlines()) > 4


def test_top_level_help_lists_the_commands(cli: Cli, tmp_path: Path) -> None:
    done = cli("--help", cwd=tmp_path)
    assert done.returncode == 0
    for command in COMMANDS:
        assert command in done.stdout


def test_run_without_an_inbox_says_so(cli: Cli, tmp_path: Path) -> None:
    done = cli("run", cwd=tmp_path)
    assert done.returncode == 3
    assert "no inbox folder" in done.stderr


def test_run_with_a_bad_ticket_names_the_file(cli: Cli, demo: Path) -> None:
    (demo / "inbox" / "T-9.json").write_text("{nope")
    done = cli("run", cwd=demo)
    assert done.returncode == 3
    assert "T-9.json: not valid JSON" in done.stderr
    assert not (demo / "runs").exists(), "nothing is claimed when the inbox is bad"


def test_run_with_a_bad_config_names_the_problem(cli: Cli, demo: Path) -> None:
    (demo / "ticketgraph.toml").write_text("[graph]\npool_size = 0\n")
    done = cli("run", cwd=demo)
    assert done.returncode == 3
    assert "pool_size" in done.stderr


def test_resume_of_an_unknown_run(cli: Cli, demo: Path) -> None:
    done = cli("resume", "run-nope", cwd=demo)
    assert done.returncode == 3
    assert "no run 'run-nope'" in done.stderr


def test_worker_needs_a_broker_and_a_model(cli: Cli, tmp_path: Path) -> None:
    done = cli("worker", cwd=tmp_path)
    assert done.returncode == 2 and "TICKETGRAPH_BROKER_URL" in done.stderr
    done = cli("worker", cwd=tmp_path, env={"TICKETGRAPH_BROKER_URL": "redis://127.0.0.1:1/0"})
    assert done.returncode == 2 and "LLM_BASE_URL" in done.stderr


def test_an_empty_inbox_is_a_clean_run(cli: Cli, demo: Path) -> None:
    for ticket in (demo / "inbox").iterdir():
        ticket.unlink()
    done = cli("run", cwd=demo)
    assert done.returncode == 0, done.stderr
    assert "received 0 tickets" in done.stdout
