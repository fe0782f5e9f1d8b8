"""The waiting CLI and a run's end: it takes the verdict the end wrote, not a copy of its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import clean_env, state

# `ticketgraph run` as a real process, whose embedded workers (forked from it) take 2.5 s to
# materialise run-state.json at the run's end, as the end of a large run does: past the
# CLI's quiet second (submit.CHECK_EVERY_S), with run.json already saying `done`. The CLI
# says on stderr when it materialises an ended run itself.
CLI = """
import os, sys, time
from orchestrator.run.records import RunStatus
from orchestrator.run.store import RunStore

cli_pid, materialise = os.getpid(), RunStore.materialise

def slowly(store, tickets=None):
    if store.meta().status is RunStatus.DONE:
        if os.getpid() == cli_pid:
            print("THE CLI MATERIALISED THE ENDED RUN", file=sys.stderr, flush=True)
        else:
            time.sleep(2.5)
    return materialise(store, tickets)

RunStore.materialise = slowly
from orchestrator.cli.main import entry
entry()
"""


@pytest.mark.parametrize("budget", [(), ("--budget", "5")], ids=["no budget", "a run budget"])
def test_a_cli_waits_for_the_end_to_materialise_the_run_rather_than_doing_it_again(
    demo: Path, budget: tuple[str, ...]
) -> None:
    """run.json says `done` seconds before the end's own run-state.json is written: the
    quiet seconds between find the run ended, and the CLI waits for the end's `run_end`
    event instead of reading every record and writing the file itself (with the old wait,
    it did: the run's records read twice, alongside the worker writing the same file). With
    a run budget, the CLI's copy of the ledger into run.json at the end changes nothing the
    end had not agreed already, so it writes nothing (a run.json newer than run-state.json
    would have it materialise every record again all the same)."""
    ran = subprocess.run(
        [sys.executable, "-c", CLI, "run", *budget],
        cwd=demo,
        env={**clean_env(), "POOL_SIZE": "2"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 1, ran.stderr[-2000:]  # the reference run: T-1004 needs a human
    assert "THE CLI MATERIALISED" not in ran.stderr
    assert "exit 1, some need a human" in ran.stdout + ran.stderr
    record = state(demo)
    meta = (demo / "runs" / record["run_id"] / "run.json").read_text()
    assert record["status"] == "done" and f'"updated_at": "{record["updated_at"]}"' in meta
    assert (record["budget"] is not None) == bool(budget)
