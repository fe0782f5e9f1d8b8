"""README.md and the docs/ pages it links to stay true: README's sample output is what a real
run prints, and the many-machines, offline and approvals sections run as written."""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from orchestrator.broker.redis_server import RedisServer
from tests.conftest import REFERENCE_TICKETS, Cli, clean_env, drop, settled, state, ticket_rows
from tests.orchestrator.cli.test_flower import _free_port, _stop

README = Path(__file__).resolve().parents[2] / "README.md"
# README is the front page; the sections it links to are pages of docs/. A block is looked up
# in all of them, and its opening line must be in exactly one.
DOCUMENTS = [README, *sorted((README.parent / "docs").glob("*.md"))]
SAMPLE_COMMAND = "    $ ticketgraph run      # output of a real run"
MANY_MACHINES = "spread the work, start to finish with the demo"
TICKETGRAPH = [sys.executable, "-m", "orchestrator.cli"]


def indented_block(after: str) -> list[str]:
    """The indented code lines after the line starting with `after` (blank lines inside the
    block kept), without their indent, from the one document (README.md or a docs/ page)
    that has that line."""
    texts = {doc: doc.read_text(encoding="utf-8").splitlines() for doc in DOCUMENTS}
    holders = [doc for doc, text in texts.items() if any(x.startswith(after) for x in text)]
    assert len(holders) == 1, f"{after!r} opens a block in {holders}, not in one document"
    lines = texts[holders[0]]
    start = next(i for i, line in enumerate(lines) if line.startswith(after)) + 1
    while not lines[start].startswith("    "):  # the rest of the paragraph, a blank line
        start += 1
    block: list[str] = []
    for line in lines[start:]:
        if line and not line.startswith("    "):
            break
        block.append(line[4:])
    while block and not block[-1]:
        block.pop()
    return block


def normalised(lines: list[str]) -> list[str]:
    """Lines with what differs between runs (times, run ids) replaced."""
    out = []
    for line in lines:
        line = re.sub(r"run-\d{8}-\d{6}-[0-9a-f]{4}", "RUN_ID", line)
        line = re.sub(r"\b\d+ms\b", "Nms", line)
        out.append(re.sub(r"\s+$", "", line))
    return out


def test_the_readme_sample_output_is_what_the_demo_prints(demo: Path, cli: Cli) -> None:
    done = cli("run", cwd=demo)
    assert done.returncode == 1, done.stderr
    shown = normalised(indented_block(SAMPLE_COMMAND))
    printed = normalised(done.stdout.splitlines())
    # Column widths of the time column move with the digits: compare words, not spaces.
    assert [line.split() for line in printed] == [line.split() for line in shown]


def test_the_many_machines_section_runs_as_written(tmp_path: Path) -> None:
    """Each line of the README's many-machines block, with host names, ports and the shared
    folder replaced: exports set the environment, `&` lines start processes (stopped by PID
    after), and the run gives the demo's reference verdict on the two workers, which the
    Flower it started lists behind the README's login."""
    with RedisServer(tcp=True) as redis:
        redis.client().config_set("requirepass", "change-me")
        model_port, flower_port = _free_port(), _free_port()
        places = {
            "redis-host:6379": f"127.0.0.1:{redis.port}",
            "model-host:8400": f"127.0.0.1:{model_port}",
            "--port 8400": f"--port {model_port}",
            "--host 0.0.0.0": "--host 127.0.0.1",
            "--port 5555": f"--port {flower_port}",
            "/shared/tickets": str(tmp_path / "shared" / "tickets"),
        }
        lines = [line for line in indented_block(MANY_MACHINES) if line and line[0] != "#"]
        assert len(lines) == 8, lines
        env = clean_env("FLOWER_")
        with _background() as start:
            for line in lines:
                for written, here in places.items():
                    line = line.replace(written, here)
                if line.startswith("export "):
                    env.update(_assignments(shlex.split(line)[1:])[0])
                    continue
                words = shlex.split(line.removesuffix("&"))
                extra, words = _assignments(words)
                assert words[0] == "ticketgraph", line
                command, child_env = TICKETGRAPH + words[1:], {**env, **extra}
                if line.endswith("&"):
                    start(command, child_env, tmp_path / f"{len(lines)}-{words[1]}.log")
                    continue
                done = subprocess.run(
                    command, env=child_env, capture_output=True, text=True, timeout=180
                )
                last = done
                assert done.returncode in (0, 1), done.stdout + done.stderr
            assert last.returncode == 1, last.stdout + last.stderr  # the demo's verdict
            workspace = Path(places["/shared/tickets"])
            assert ticket_rows(state(workspace)) == REFERENCE_TICKETS
            workers = _flower_workers(flower_port, ("ops", "change-me-too"))
            assert {name.split("-")[0] for name in workers} == {"worker1", "worker2"}


def _assignments(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """Leading NAME=value words as a dict, and the words after them."""
    found: dict[str, str] = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        found[name] = value
    return found, words


@contextlib.contextmanager
def _background() -> Iterator:
    """Start processes that run until the block is left, then stop each by PID."""
    children: list[subprocess.Popen[bytes]] = []

    def start(command: list[str], env: dict[str, str], log: Path) -> None:
        with log.open("wb") as out:
            children.append(
                subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
            )

    try:
        yield start
    finally:
        for child in children:
            _stop(child)


def _flower_workers(port: int, login: tuple[str, str], expected: int = 2) -> list[str]:
    """The worker nodes Flower's API lists, once it answers (it may still be starting) and
    lists `expected` of them: a refresh collects the workers' replies for a second, and a
    busy worker may answer the next one only (what it lists at the deadline otherwise)."""
    deadline = time.monotonic() + 30
    url = f"http://127.0.0.1:{port}/api/workers"
    seen: list[str] = []
    while time.monotonic() < deadline:
        try:
            refused = httpx.get(url, timeout=10)
            answer = httpx.get(url, params={"refresh": 1}, auth=login, timeout=10)
            if answer.status_code == 200 and answer.json():
                assert refused.status_code == 401  # no login, no API
                seen = list(answer.json())
                if len(seen) >= expected:
                    return seen
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    assert seen, "Flower never listed the workers"
    return seen


OWN_TICKETS = "The step after the demo: your own tickets"
# A team's own five tickets in four formats, and what it fills in for each.
TEAM_TICKETS = {
    "C-1.txt": "Where is my order O-1001? It was supposed to arrive yesterday.",
    "C-2.md": '# Cannot log in\nI reset my password twice and still get "invalid credentials".',
    "C-3.json": json.dumps(
        {
            "id": "C-3",
            "subject": "Return",
            "body": "How do I return order O-1002?",
            "from": "a@x.io",
        }
    ),
    "C-4.eml": "From: bob@example.com\nSubject: Love the product\nX-Ticket-Id: C-4\n\nThanks!\n",
    "C-5.txt": "How do I change the e-mail address on my profile?",
}
FILLED = {
    "C-1": ("orders", "your order O-1001 shipped with DHL, tracking number JD014600006812."),
    "C-2": ("account", "clear the cookies of our site, then sign in with the newest password."),
    "C-3": ("orders", "order O-1002 has not shipped yet, so we can cancel it; reply to confirm."),
    "C-4": ("other", "thank you for the kind words, we passed them on to the team!"),
    "C-5": ("account", "open Settings, then Profile, and change the address there; we confirm it."),
    "C-6": ("orders", "we have asked the carrier about the parcel and will write here today."),
}


def _fill_in(scenarios: Path) -> None:
    """What a person does in their editor: each CATEGORY and REPLY of the skeleton filled in."""
    text = scenarios.read_text()
    for ticket, (category, reply) in FILLED.items():
        text = text.replace(f"{ticket}: CATEGORY", f"{ticket}: {category}")
        text = text.replace(f"Ticket {ticket}: REPLY", f"Ticket {ticket}: {reply}")
    scenarios.write_text(text)


def test_a_teams_own_tickets_run_offline_as_the_readme_says(cli: Cli, tmp_path: Path) -> None:
    """README's offline path, line by line, with the team's five tickets in four formats; then
    a sixth ticket the scripts do not know yet: it is unrouted, its reason names the line to
    add, no draft is claimed for it, and `scenarios init` run again adds it, keeping what the
    team wrote. No command prints a traceback."""
    outputs: list[str] = []
    here = tmp_path

    def tg(*args: str, cwd: Path, code: int = 0) -> subprocess.CompletedProcess[str]:
        done = cli(*args, cwd=cwd)
        outputs.append(done.stdout + done.stderr)
        assert done.returncode == code, done.stdout + done.stderr
        return done

    for line in indented_block(OWN_TICKETS):
        command = line.split("  #", 1)[0].strip()
        if command.startswith("ticketgraph "):
            tg(*shlex.split(command)[1:], cwd=here)
        elif command.startswith("cd "):
            here = here / command[3:]
        elif command.startswith("cp ~/tickets/* "):
            for name, text in TEAM_TICKETS.items():
                drop(here / command.split()[-1], name, text)
        elif command.startswith("$EDITOR "):
            _fill_in(here / command.split()[-1])
        else:
            raise AssertionError(f"a README line this test does not know: {line!r}")
    record = state(here)
    assert {i: (t["category"], t["status"]) for i, t in record["tickets"].items()} == {
        i: (category, "pass") for i, (category, _reply) in FILLED.items() if i != "C-6"
    }
    assert (here / "out" / "C-1.txt").read_text().startswith("Ticket C-1: your order O-1001")

    # A sixth ticket, run from the folder above: unrouted, with the line to add named.
    drop(here / "inbox", "C-6.txt", "My parcel has not moved for a week.")
    done = tg("run", "--workspace", here.name, cwd=tmp_path, code=1)
    assert "[fanout] pool size 4, 0 drafts" in done.stdout, done.stdout
    c6 = state(here)["tickets"]["C-6"]
    assert (c6["stop"], c6["status"]) == ("unrouted", "needs_human")
    assert "scenarios/demo.yaml has no line `C-6: <category>`" in c6["error"], c6["error"]
    assert "ticketgraph scenarios init" in c6["error"]
    run_id = state(here)["run_id"]
    assert f"Trace: {here.name}/runs/{run_id}/run-state.json" in done.stdout, done.stdout
    assert (tmp_path / here.name / "runs" / run_id / "run.jsonl").is_file()

    # Requeued (twice: the second says where it is), scripted, filled in, run: it passes.
    assert tg("requeue", run_id, "C-6", cwd=here).stdout == "inbox/C-6.txt\n"
    again = tg("requeue", run_id, "C-6", cwd=here).stdout
    assert "C-6.txt is back in inbox/ already" in again and "name taken" not in again
    added = tg("scenarios", "init", cwd=here).stdout
    assert "the router's reply names C-6; a script of its own for C-6" in added, added
    _fill_in(here / "scenarios" / "demo.yaml")
    settled(here / "inbox" / "C-6.txt")
    tg("run", cwd=here)
    assert state(here)["tickets"]["C-6"]["status"] == "pass"
    assert not [o for o in outputs if "Traceback" in o]


APPROVALS = "A ticket whose call waits stops `awaiting_approval`"


def test_the_approvals_section_runs_as_written_on_a_fresh_demo(cli: Cli, tmp_path: Path) -> None:
    """README's approvals block, command by command, on a fresh `init` (its six tickets still
    in inbox/): the examples' refunds wait, one is approved and runs once on resume, the other
    is rejected and never runs; the six demo tickets keep their reference verdicts."""
    made = cli("init", "demo", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    demo = tmp_path / "demo"
    expected = {"run": 1, "resume": 1}
    printed: dict[str, str] = {}
    for line in indented_block(APPROVALS):
        words = shlex.split(line.split("  #", 1)[0])
        if words[0] == "cp":
            assert subprocess.run(words, cwd=demo).returncode == 0
            settled(*(demo / "inbox" / Path(w).name for w in words[1:-1]))  # typed a moment later
            continue
        assert words[0] == "ticketgraph", line
        run_id = state(demo)["run_id"] if "RUN" in words else ""
        done = cli(*[run_id if w == "RUN" else w for w in words[1:]], cwd=demo)
        assert done.returncode == expected.get(words[1], 0), done.stdout + done.stderr
        assert "Traceback" not in done.stdout + done.stderr
        printed[words[1]] = done.stdout
    assert "T-1007" in printed["pending"] and "T-1008" in printed["pending"], printed["pending"]
    assert "awaiting_approval awaiting_approval" in printed["run"]  # its columns apart
    rows = ticket_rows(state(demo))
    assert {i: rows.pop(i)[3:] for i in ("T-1007", "T-1008")} == {
        "T-1007": ("gate_pass", "pass"),
        "T-1008": ("gate_pass", "pass"),
    }
    assert rows == REFERENCE_TICKETS
    actions = (demo / "runs" / state(demo)["run_id"] / "actions.jsonl").read_text().splitlines()
    assert [(a["order_id"], a["amount_cents"]) for a in map(json.loads, actions)] == [
        ("A-77533", 8900)
    ]
    assert "no refund has been made" in (demo / "out" / "T-1008.txt").read_text()
