"""`ticketgraph scenarios init` on a scenario file that exists (the demo's): it adds what the
inbox's new tickets need and keeps every script, comment and value the file had."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.conftest import Cli, demo_scripts, drop
from workers.provider.scenario import load_scenario


def test_scripting_new_tickets_keeps_what_the_file_says_and_adds_only_what_is_missing(
    demo: Path, cli: Cli
) -> None:
    scenarios = demo / "scenarios" / "demo.yaml"
    before = scenarios.read_text()
    drop(demo / "inbox", "T-2001.txt", "My invoice shows the wrong VAT number.")
    added = cli("scenarios", "init", cwd=demo)
    assert added.returncode == 0, added.stderr
    assert "the router's reply names T-2001; a script of its own for T-2001" in added.stdout
    after = scenarios.read_text()
    # Every comment line is still there; every script as it was, but the router's reply.
    assert [line for line in before.splitlines() if line.startswith("#")] == [
        line for line in after.splitlines() if line.startswith("#") and "T-2001" not in line
    ]
    old = {s["name"]: s for s in demo_scripts()}
    new = {s["name"]: s for s in yaml.safe_load(after)}
    assert list(new) == [*old, "T-2001"]
    router = new.pop("router")
    assert router["replies"][0]["text"].splitlines() == [
        *old.pop("router")["replies"][0]["text"].splitlines(),
        "T-2001: CATEGORY",
    ]
    assert router["replies"][0]["usage"] == {"prompt_tokens": 624, "completion_tokens": 96}
    assert {k: v for k, v in new.items() if k != "T-2001"} == old
    # The templated demo tickets (T-1003, T-1006) need no script; a second pass adds nothing.
    again = cli("scenarios", "init", cwd=demo)
    assert "already answers every ticket in inbox/: nothing added" in again.stdout
    assert scenarios.read_text() == after
    assert load_scenario(scenarios).scripts[-1].name == "T-2001"


def test_scripting_an_empty_inbox_is_a_usage_error(cli: Cli, tmp_path: Path) -> None:
    assert cli("init", "mine", "--template", "minimal", cwd=tmp_path).returncode == 0
    done = cli("scenarios", "init", cwd=tmp_path / "mine")
    assert done.returncode == 64 and "holds no ticket to script" in done.stderr
    assert not (tmp_path / "mine" / "scenarios").exists()
