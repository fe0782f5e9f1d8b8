"""A claim no crash can hide, and no claim a run cannot work: a disk that fills up while a
run claims inbox/, a run killed between two renames, a workspace without a model. Every
command is the real CLI in its own process."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest

from orchestrator.broker.redis_server import free_port
from orchestrator.config.workspace import init_demo
from orchestrator.exit_codes import ExitCode
from tests.conftest import (
    REFERENCE_TICKETS,
    Cli,
    clean_env,
    demo_scripts,
    drop,
    settled,
    state,
    ticket_rows,
    wait_for,
    write_scenarios,
)

# The CLI, run with os.open and os.rename watched: only what a test asks for is changed
# (argv[1], JSON), and the product's code runs as it is.
#   {"stop_at_claim": N}  the process stops itself (SIGSTOP) before its Nth rename into
#                         a run's claimed/ folder, for the test to kill it there
#   {"full": PATTERN}     creating a file whose path holds PATTERN fails with ENOSPC, as
#                         on a full disk (where the test may not mount a small one)
WATCHED_CLI = """
import errno, json, os, signal, sys
asked = json.loads(sys.argv[1])
renames, opens, claims = os.rename, os.open, []
def rename(src, dst, *args, **kwargs):
    if "/claimed/" in os.fspath(dst):
        claims.append(dst)
        if len(claims) == asked.get("stop_at_claim"):
            os.kill(os.getpid(), signal.SIGSTOP)
    return renames(src, dst, *args, **kwargs)
def open_(path, flags, *args, **kwargs):
    full = asked.get("full")
    if full and flags & os.O_CREAT and full in os.fspath(path):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(path))
    return opens(path, flags, *args, **kwargs)
os.rename, os.open = rename, open_
sys.argv = ["ticketgraph", *sys.argv[2:]]
from orchestrator.cli.main import entry
entry()
"""


def _watched(args: list[str], asked: dict[str, Any]) -> list[str]:
    return [sys.executable, "-c", WATCHED_CLI, json.dumps(asked), *args]


def _outputs(*done: subprocess.CompletedProcess[str]) -> str:
    return "".join(d.stdout + d.stderr for d in done)


def _names(folder: Path) -> list[str]:
    return sorted(os.listdir(folder)) if folder.is_dir() else []


def _run_ids(workspace: Path) -> list[str]:
    return [name for name in _names(workspace / "runs") if name.startswith("run-")]


class Disk:
    """The workspace's volume: a real tmpfs of a few MB where this process may mount one
    (root), filled and emptied with a filler file; else an injected ENOSPC at the same
    place (WATCHED_CLI). `cli` runs the CLI on it as it stands."""

    def __init__(self, root: Path, mounted: bool, cli: Cli) -> None:
        self.root, self.mounted, self._cli = root, mounted, cli
        self.filler = root / "filler"
        self.full: str | None = None  # injected: the paths where a new file does not fit

    def fill(self, leave_kb: int, pattern: str) -> None:
        """Leave `leave_kb` KB free (a real disk), or refuse new files at `pattern`."""
        if not self.mounted:
            self.full = pattern
            return
        self.filler.unlink(missing_ok=True)
        free = os.statvfs(self.root).f_bavail * os.statvfs(self.root).f_frsize
        with self.filler.open("wb") as handle:
            handle.write(b"\0" * max(free - leave_kb * 1024, 0))

    def free(self) -> None:
        """Space is back."""
        self.full = None
        self.filler.unlink(missing_ok=True)

    def cli(self, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
        if self.full is None:
            return self._cli(*args, cwd=cwd)
        return subprocess.run(
            _watched(list(args), {"full": self.full}),
            cwd=cwd,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )


@pytest.fixture
def disk(tmp_path: Path, cli: Cli) -> Iterator[Disk]:
    """A small volume for a workspace (Disk)."""
    root = tmp_path / "disk"
    root.mkdir()
    mounted = (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(root)], capture_output=True
        ).returncode
        == 0
    )
    try:
        yield Disk(root, mounted, cli)
    finally:
        if mounted:
            subprocess.run(["umount", str(root)], check=True)


def test_a_full_disk_while_claiming_leaves_a_run_every_command_knows_and_resume_finishes_it(
    disk: Disk,
) -> None:
    """A 60 KB ticket beside the demo's six on a volume with 64 KB left: the six renames
    need no space, run.json and the journal fit, the tickets' texts do not. The run is
    listed crashed with the path, the next `run` refuses (exit 3, inbox/ untouched) until
    `resume`, once space is back, finishes the claim and the run, with the demo's table.
    Before that, a volume with no space at all: nothing is claimed, no run is left."""
    demo = disk.root / "demo"
    init_demo(demo)
    scripts = demo_scripts()
    router = next(s for s in scripts if s["name"] == "router")
    router["replies"][0]["text"] += "\nT-1099: other"  # the big one gets the template
    write_scenarios(demo / "scenarios" / "demo.yaml", scripts)
    drop(demo / "inbox", "T-1099.txt", "Our export log, as asked: " + "0123456789abcde " * 3750)
    inbox = _names(demo / "inbox")

    disk.fill(0, "/runs/")
    nothing = disk.cli("run", cwd=demo)
    assert nothing.returncode == ExitCode.CRASHED, _outputs(nothing)
    assert "No space left on device" in nothing.stderr and "nothing was claimed" in nothing.stderr
    assert _names(demo / "inbox") == inbox and _run_ids(demo) == []

    disk.fill(64, "/tickets/.T-1099.txt.")  # injected: the temp file of its text
    crashed = disk.cli("run", cwd=demo)
    assert crashed.returncode == ExitCode.CRASHED, _outputs(crashed)
    (run_id,) = _run_ids(demo)
    assert _names(demo / "inbox") == []  # every file moved, none lost
    assert _names(demo / "runs" / run_id / "claimed") == inbox
    assert "No space left on device" in crashed.stderr and "/tickets/" in crashed.stderr
    assert f"ticketgraph resume {run_id}" in crashed.stderr
    assert f"ticketgraph requeue {run_id}" in crashed.stderr

    listed = disk.cli("runs", "--json", cwd=demo)
    shown = disk.cli("status", run_id, cwd=demo)
    refused = disk.cli("run", cwd=demo)
    row = json.loads(listed.stdout)[0]
    assert (row["run_id"], row["verdict"], row["exit_code"]) == (run_id, "crashed", 3)
    assert shown.returncode == 0 and "did not finish" in shown.stdout, _outputs(shown)
    assert refused.returncode == ExitCode.CRASHED, _outputs(refused)
    assert f"run {run_id} stopped while claiming inbox/ and holds 7 files" in refused.stderr
    assert f"`ticketgraph resume {run_id}`" in refused.stderr
    assert _run_ids(demo) == [run_id]

    disk.free()
    resumed = disk.cli("resume", run_id, cwd=demo)
    assert resumed.returncode == ExitCode.NEEDS_HUMAN, _outputs(resumed)
    assert "inbox/ received 7 tickets" in resumed.stdout
    rows = ticket_rows(state(demo))
    assert rows.pop("T-1099") == ("other", "template", 0, "gate_pass", "pass")
    assert rows == REFERENCE_TICKETS
    after = disk.cli("run", cwd=demo)
    assert after.returncode == 0 and "nothing to claim" in after.stdout, _outputs(after)
    assert "Traceback" not in _outputs(nothing, crashed, listed, shown, refused, resumed, after)


def _state_of(pid: int) -> str:
    """A process's state letter (T: stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@contextlib.contextmanager
def _stopped_at_claim(workspace: Path, n: int) -> Iterator[subprocess.Popen[bytes]]:
    """`ticketgraph run`, stopped by SIGSTOP just before its `n`th claim's rename."""
    proc = subprocess.Popen(
        _watched(["run"], {"stop_at_claim": n}),
        cwd=workspace,
        env=clean_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for("the run to stop mid-claim", lambda: _state_of(proc.pid) == "T", 60)
        yield proc
    finally:
        proc.kill()
        proc.wait(10)


def test_a_run_killed_between_two_claims_refuses_the_next_run_until_requeued(
    demo: Path, cli: Cli
) -> None:
    """SIGKILL between the second and third rename of a claim: two tickets in the run's
    claimed/, four still in inbox/. The run is listed; the next `run` refuses (exit 3)
    naming it, and leaves the four alone; `resume` with a model that refuses connections
    refuses (78) and changes nothing; `requeue` puts the two back, and the next run is the
    demo's run."""
    with _stopped_at_claim(demo, 3) as proc:
        (run_id,) = _run_ids(demo)
        held = _names(demo / "runs" / run_id / "claimed")
        busy = cli("run", cwd=demo)  # a claim that is still alive is not stranded
        os.kill(proc.pid, signal.SIGKILL)
    assert held == ["T-1001.txt", "T-1002.txt"]
    # It took the four left, in a run of its own (T-1004 needs a human, as in the demo).
    assert busy.returncode == ExitCode.NEEDS_HUMAN, _outputs(busy)
    # (two runs started in the same second sort by their random suffix: not by order)
    assert run_id in _run_ids(demo) and len(_run_ids(demo)) == 2
    assert _names(demo / "inbox") == []

    listed = cli("runs", "--json", cwd=demo)
    row = next(r for r in json.loads(listed.stdout) if r["run_id"] == run_id)
    assert (row["verdict"], row["exit_code"]) == ("crashed", 3)
    refused = cli("run", cwd=demo)
    assert refused.returncode == ExitCode.CRASHED, _outputs(refused)
    assert f"run {run_id} stopped while claiming inbox/ and holds 2 files" in refused.stderr
    assert f"`ticketgraph requeue {run_id}`" in refused.stderr
    down = {"LLM_BASE_URL": f"http://127.0.0.1:{free_port()}/v1"}
    no_model = cli("resume", run_id, cwd=demo, env=down)
    assert no_model.returncode == ExitCode.CONFIG, _outputs(no_model)
    assert "connection refused" in no_model.stderr
    assert _names(demo / "runs" / run_id / "claimed") == held  # nothing was touched

    requeued = cli("requeue", run_id, cwd=demo)
    assert requeued.returncode == 0, _outputs(requeued)
    assert _names(demo / "inbox") == held
    again = cli("run", cwd=demo)
    assert again.returncode == ExitCode.ALL_PASS, _outputs(again)
    assert "inbox/ received 2 tickets: T-1001, T-1002" in again.stdout
    assert "Traceback" not in _outputs(busy, listed, refused, no_model, requeued, again)


def _own_tickets(inbox: Path) -> None:
    """Five tickets of a team's own, in four formats."""
    drop(inbox, "S-1.txt", "My parcel has not moved for a week.")
    drop(inbox, "S-2.md", "# Refund\nI returned the shoes and want my money back.")
    drop(inbox, "S-3.json", json.dumps({"id": "S-3", "body": "Where is my invoice?"}))
    drop(inbox, "S-5.txt", "Cannot log in since the update.")
    mail = EmailMessage()
    mail["From"], mail["Subject"], mail["X-Ticket-Id"] = "c@example.com", "Late", "S-4"
    mail.set_content("The courier never came.")
    (inbox / "S-4.eml").write_bytes(bytes(mail))
    settled(inbox / "S-4.eml")


def test_a_workspace_without_a_model_refuses_before_claiming(cli: Cli, tmp_path: Path) -> None:
    """A team's first step after the demo: `init --template minimal`, its own tickets, no
    model. `run` and `check` say in one sentence which setting is missing and how to try
    offline (78), inbox/ is as it was, and nothing is under runs/; the same for an
    LLM_BASE_URL where nothing listens."""
    made = cli("init", "mine", "--template", "minimal", cwd=tmp_path)
    mine = tmp_path / "mine"
    _own_tickets(mine / "inbox")
    before = {p.name: p.read_bytes() for p in (mine / "inbox").iterdir()}
    ran = cli("run", cwd=mine)
    checked = cli("check", cwd=mine)
    url = f"http://127.0.0.1:{free_port()}/v1"
    down = cli("run", cwd=mine, env={"LLM_BASE_URL": url})
    assert ran.returncode == checked.returncode == ExitCode.CONFIG, _outputs(ran, checked)
    for done in (ran, checked):
        (sentence,) = done.stderr.splitlines()
        assert "LLM_BASE_URL" in sentence and "scenarios/demo.yaml" in sentence
        assert "offline" in sentence and "BrokerError" not in sentence
    assert ran.stderr.split(": ", 1)[1] == checked.stderr.split(": ", 1)[1]  # the same
    assert down.returncode == ExitCode.CONFIG, _outputs(down)
    assert url in down.stderr and "connection refused" in down.stderr
    assert {p.name: p.read_bytes() for p in (mine / "inbox").iterdir()} == before
    assert _run_ids(mine) == []
    assert "Traceback" not in _outputs(made, ran, checked, down)


def test_an_endpoint_on_a_host_name_is_not_probed_so_a_slow_name_server_cannot_hang_a_run(
    demo: Path, cli: Cli
) -> None:
    """Only an address this machine knows without a name server is tried before claiming:
    a host name that does not resolve is the run's to find (it crashes after claiming, as
    before, and its last line says where the tickets are and how to get them back)."""
    env = {"LLM_BASE_URL": "http://no-such-host.invalid/v1", "LLM_MAX_RETRIES": "0"}
    done = cli("run", cwd=demo, env=env)
    assert done.returncode == ExitCode.CRASHED, _outputs(done)
    run_id = state(demo)["run_id"]
    last = done.stderr.strip().splitlines()[-1]
    assert f"its tickets are in runs/{run_id}/claimed/" in last, last
    assert f"`ticketgraph requeue {run_id}` puts them back in inbox/" in last, last
