"""Filesystem faults are verdicts, not tracebacks: a run folder that turns read-only mid-run,
an out/ that cannot be written, a disk that fills up. Each ends the run `crashed` (exit 3)
with the path and the error, and `resume` finishes it once the fault is fixed."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import (
    REFERENCE_TICKETS,
    Cli,
    clean_env,
    demo_scripts,
    start_run,
    state,
    ticket_rows,
    write_scenarios,
)
from tests.scenarios.test_faults import _wait_for
from workers.provider import running_provider

ROOT = os.geteuid() == 0


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True)


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[str]:
    """Make `folder` read-only for every process, even root's; yield the error to expect.
    As root: a read-only bind mount of it over itself. Otherwise: no write permission."""
    if ROOT:
        _mount("--bind", str(folder), str(folder))
        try:
            _mount("-o", "remount,bind,ro", str(folder))
            yield "Read-only file system"
        finally:
            subprocess.run(["umount", str(folder)], check=True)
        return
    dirs = [folder, *(p for p in folder.rglob("*") if p.is_dir())]
    for d in dirs:
        d.chmod(0o555)
    try:
        yield "Permission denied"
    finally:
        for d in dirs:
            d.chmod(0o755)


@pytest.fixture
def llm(tmp_path: Path) -> Iterator[str]:
    """The demo's scripted provider, each call taking 0.8 s so a fault can land mid-run."""
    scripts = demo_scripts()
    for script in scripts:
        script["latency_ms"] = 800
    with running_provider(write_scenarios(tmp_path / "slow.yaml", scripts)) as url:
        yield url


def _served(llm: str) -> int:
    return int(httpx.get(llm.replace("/v1", "/stats")).json()["requests"])


def test_a_run_folder_that_turns_read_only_mid_run_crashes_the_run_and_resume_finishes_it(
    demo: Path, llm: str, cli: Cli, tmp_path: Path
) -> None:
    log = tmp_path / "run.log"
    run = start_run(demo, {"LLM_BASE_URL": llm}, log)
    _wait_for(lambda: _served(llm) >= 2, 60, "drafting to start")  # routed, drafts in flight
    run_id = state(demo)["run_id"]
    run_dir = demo / "runs" / run_id
    with read_only(run_dir) as expected:
        assert run.wait(90) == 3, log.read_text()[-3000:]
    text = log.read_text()
    assert expected in text and str(run_dir) in text, text[-3000:]
    assert "Traceback" not in text
    crashed = next(line for line in text.splitlines() if line.startswith(f"run {run_id}: crashed"))
    assert crashed.count("could not be recorded") == 1, crashed  # said once, not twice
    assert f"ticketgraph resume {run_id}" in text
    resumed = cli("resume", run_id, cwd=demo, env={"LLM_BASE_URL": llm})
    assert resumed.returncode == 1, resumed.stdout + resumed.stderr
    assert ticket_rows(state(demo)) == REFERENCE_TICKETS


def test_an_out_folder_that_turns_read_only_mid_run_is_the_path_the_crash_names(
    demo: Path, llm: str, cli: Cli, tmp_path: Path
) -> None:
    """Merge cannot publish into out/: the crash names out/'s file (not the draft it links
    from, which is writable), its last line says where the tickets are and how to get them
    back, and `resume` finishes the run once out/ is writable again."""
    log = tmp_path / "run.log"
    run = start_run(demo, {"LLM_BASE_URL": llm}, log)
    _wait_for(lambda: _served(llm) >= 2, 60, "drafting to start")  # merge has not run
    run_id = state(demo)["run_id"]
    with read_only(demo / "out") as expected:
        assert run.wait(90) == 3, log.read_text()[-3000:]
    text = log.read_text()
    last = text.strip().splitlines()[-1]
    assert f"{expected}: {demo / 'out'}/T-" in last and "/drafts/" not in last, last
    assert f"its tickets are in runs/{run_id}/claimed/" in last, last
    assert f"`ticketgraph requeue {run_id}` puts them back in inbox/" in last, last
    assert "Traceback" not in text
    resumed = cli("resume", run_id, cwd=demo, env={"LLM_BASE_URL": llm})
    assert resumed.returncode == 1, resumed.stdout + resumed.stderr
    assert ticket_rows(state(demo)) == REFERENCE_TICKETS


def test_an_unwritable_out_folder_is_found_before_anything_is_paid(
    demo: Path, llm: str, cli: Cli
) -> None:
    with read_only(demo / "out") as expected:
        done = cli("run", cwd=demo, env={"LLM_BASE_URL": llm})
    assert done.returncode == 3, done.stdout + done.stderr
    assert expected in done.stderr and str(demo / "out") in done.stderr
    assert "Traceback" not in done.stderr
    assert _served(llm) == 0
    record = state(demo)
    assert record["status"] == "crashed" and "out" in record["error"]
    resumed = cli("resume", record["run_id"], cwd=demo, env={"LLM_BASE_URL": llm})
    assert resumed.returncode == 1, resumed.stdout + resumed.stderr
    assert ticket_rows(state(demo)) == REFERENCE_TICKETS


# Runs a command in its own mount namespace (unprivileged, through a user namespace) where
# out/ is a 16 KB tmpfs with one 4 KB page left: merge's second reply does not fit. The
# mount dies with the command; the real out/ is untouched for the resume.
UNSHARE = ["unshare", "--user", "--map-root-user", "--mount", "--propagation", "private"]
FULL_OUT = (
    'mount -t tmpfs -o size=16k tmpfs "$0" && head -c 12288 /dev/zero > "$0/.filler" && exec "$@"'
)


def test_a_full_disk_crashes_the_run_with_the_path_and_resume_finishes_it(
    demo: Path, llm: str, cli: Cli
) -> None:
    out = demo / "out"
    done = subprocess.run(
        [*UNSHARE, "sh", "-c", FULL_OUT, str(out), sys.executable, "-m", "orchestrator.cli", "run"],
        cwd=demo,
        env={**clean_env(), "LLM_BASE_URL": llm},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 3, done.stdout + done.stderr
    assert "No space left on device" in done.stderr and str(out) in done.stderr
    assert "Traceback" not in done.stderr
    record = state(demo)
    assert record["status"] == "crashed" and "No space left on device" in record["error"]
    assert not list(out.iterdir())  # the full tmpfs is gone with the run's namespace
    resumed = cli("resume", record["run_id"], cwd=demo, env={"LLM_BASE_URL": llm})
    assert resumed.returncode == 1, resumed.stdout + resumed.stderr
    assert ticket_rows(state(demo)) == REFERENCE_TICKETS


def test_a_deleted_record_is_a_damaged_run_folder_named_not_a_smaller_run(
    demo: Path, cli: Cli
) -> None:
    """A run stopped after merge loses records/T-1006.json: resume and status fail (exit 3)
    naming the ticket and the file, instead of going on with five tickets; requeue still
    finds the ticket's claimed file."""
    stopped = cli("run", "--stop-after", "merge", cwd=demo)
    assert stopped.returncode == 2, stopped.stderr
    run_id = state(demo)["run_id"]
    record = demo / "runs" / run_id / "records" / "T-1006.json"
    record.unlink()
    for command in (["resume", run_id], ["status", run_id]):
        done = cli(*command, cwd=demo)
        assert done.returncode == 3, done.stdout + done.stderr
        assert f"the record of ticket T-1006 is missing: {record}" in done.stderr
        assert "Traceback" not in done.stderr
    assert state(demo)["status"] == "stopped_early"  # nothing went on without it
    requeued = cli("requeue", run_id, "T-1006", cwd=demo)
    assert requeued.returncode == 0, requeued.stderr
    assert (demo / "inbox" / "T-1006.txt").exists()


def test_a_deleted_routes_file_is_a_damaged_run_folder_named_not_tickets_skipped(
    demo: Path, cli: Cli
) -> None:
    """Route's decisions live in routes.json until drafting writes them in: a run stopped
    after route that loses the file fails resume and status (exit 3) naming a ticket and
    the file, instead of drafting none of its tickets; requeue, as the error says, still
    puts the ticket back."""
    stopped = cli("run", "--stop-after", "route", cwd=demo)
    assert stopped.returncode == 2, stopped.stderr
    run_id = state(demo)["run_id"]
    routes = demo / "runs" / run_id / "routes.json"
    routes.unlink()
    for command in (["resume", run_id], ["status", run_id]):
        done = cli(*command, cwd=demo)
        assert done.returncode == 3, done.stdout + done.stderr
        assert f"ticket T-1001 has no routing decision: {routes} is missing" in done.stderr
        assert f"ticketgraph requeue {run_id} T-1001" in done.stderr
        assert "Traceback" not in done.stderr
    assert state(demo)["status"] == "stopped_early"
    requeued = cli("requeue", run_id, "T-1001", cwd=demo)
    assert requeued.returncode == 0, requeued.stderr
    assert (demo / "inbox" / "T-1001.txt").exists()
