"""Whole runs over real inboxes: every kind of bad file beside the demo tickets, and tickets
as .json and .eml files."""

from __future__ import annotations

import json
import os
from email.message import EmailMessage
from pathlib import Path

from orchestrator.intake.ticketfile import shown
from tests.conftest import (
    REFERENCE_TICKETS,
    Cli,
    demo_scripts,
    drop,
    events,
    settled,
    state,
    ticket_rows,
    write_scenarios,
)

# file name -> kind, for every file that must end in quarantine/
BAD = {
    "E-1.txt": "empty",
    "W-1.txt": "whitespace",
    "B-1.txt": "binary",
    "L-1.txt": "too_big",
    "D-1.txt": "not_regular_file",
    "F-1.txt": "not_regular_file",
    "S-1.txt": "symlink",
    "S-2.txt": "symlink",
    "my ticket.txt": "bad_name",
    "-T-1.txt": "bad_name",
    "a..b.txt": "bad_name",
    "T\x01-1.txt": "bad_name",
    "Ü-1.txt": "bad_name",
    "X-9.json": "duplicate_id",
    "J-9.json": "bad_json",
    "N-1.TXT": "unsupported_format",
    "N-2.pdf": "unsupported_format",
    "N-3": "unsupported_format",
}


def _bad_inbox(inbox: Path, outside: Path) -> None:
    """Every kind of file that is not a ticket, beside the six demo tickets."""
    drop(inbox, "E-1.txt", "")
    drop(inbox, "W-1.txt", "  \n\t \n")
    (inbox / "B-1.txt").write_bytes(b"PK\x03\x04\x00\x00binary\x00")
    drop(inbox, "L-1.txt", "long ticket " * 6000)  # 72 KB, over the 64 KB cap
    (inbox / "D-1.txt").mkdir()
    os.mkfifo(inbox / "F-1.txt")  # would hang a run that opened it
    secret = outside / "passwd"
    secret.write_text("root:x:0:0:root:/root:/bin/bash\n")
    (inbox / "S-1.txt").symlink_to(secret)
    (inbox / "S-2.txt").symlink_to(outside / "gone")  # dangling
    for name in ("my ticket.txt", "-T-1.txt", "a..b.txt", "T\x01-1.txt", "Ü-1.txt"):
        drop(inbox, name, "a ticket with a bad name")
    drop(inbox, "X-9.json", json.dumps({"id": "T-1003", "body": "the same id as T-1003.txt"}))
    drop(inbox, "J-9.json", "{nope")
    for name in ("N-1.TXT", "N-2.pdf", "N-3"):
        drop(inbox, name, "a ticket in a format we do not take")
    (inbox / "C-1.txt").write_bytes("Não consigo acessar a fatura. Preço: 10€".encode("cp1252"))
    settled(*(p for p in inbox.iterdir()))


def test_bad_files_are_quarantined_and_the_batch_goes_on(
    demo: Path, cli: Cli, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    _bad_inbox(demo / "inbox", outside)
    scripts = demo_scripts()  # the scripted router names C-1 too
    router = next(s for s in scripts if s["name"] == "router")
    router["replies"][0]["text"] += "\nC-1: other"
    write_scenarios(demo / "scenarios" / "demo.yaml", scripts)
    done = cli("run", cwd=demo)
    assert done.returncode == 1, done.stderr
    record = state(demo)
    rows = ticket_rows(record)
    assert {i: rows[i] for i in REFERENCE_TICKETS} == REFERENCE_TICKETS
    assert rows["C-1"][-1] == "pass"  # decoded and answered (the router named it: template)
    assert record["tickets"]["C-1"]["encoding"] == "cp1252"
    kinds = {r["name"]: r["kind"] for r in record["rejected"]}
    assert kinds == {shown(name): kind for name, kind in BAD.items()}
    quarantine = demo / "quarantine" / record["run_id"]
    for name in BAD:
        assert os.path.lexists(quarantine / name), name
        reason = (quarantine / f"{name}.reason").read_text()
        assert BAD[name] in reason, (name, reason)
    assert (quarantine / "S-1.txt").is_symlink()  # moved as a link, never followed
    assert "root:x" not in (demo / "run.jsonl").read_text()
    assert sum(e["event"] == "rejected" for e in events(demo)) == len(BAD)
    report = (demo / "runs" / record["run_id"] / "report.txt").read_text()
    assert f"quarantine/: {len(BAD)} files" in report
    assert list((demo / "inbox").iterdir()) == []


def test_json_and_email_tickets_go_through_a_whole_run(demo: Path, cli: Cli) -> None:
    inbox = demo / "inbox"
    text_1001 = (inbox / "T-1001.txt").read_text()
    text_1002 = (inbox / "T-1002.txt").read_text()
    (inbox / "T-1001.txt").unlink()
    (inbox / "T-1002.txt").unlink()
    drop(
        inbox,
        "T-1001.json",
        json.dumps({"id": "T-1001", "subject": "Charged twice", "body": text_1001, "from": "a@b"}),
    )
    mail = EmailMessage()
    mail["From"] = "Customer <c@example.com>"
    mail["Subject"] = "CSV export spins"
    mail["X-Ticket-Id"] = "T-1002"
    mail.set_content(text_1002)
    (inbox / "mail-0001.eml").write_bytes(bytes(mail))
    settled(inbox / "mail-0001.eml")
    done = cli("run", cwd=demo)
    assert done.returncode == 1, done.stderr
    record = state(demo)
    assert ticket_rows(record) == REFERENCE_TICKETS
    assert record["tickets"]["T-1001"]["format"] == "json"
    assert record["tickets"]["T-1002"]["format"] == "eml"
    ticket_text = (demo / "runs" / record["run_id"] / "tickets" / "T-1002.txt").read_text()
    assert "CSV export spins" in ticket_text and "Export CSV" in ticket_text


def test_each_quarantined_file_gets_a_reason_of_its_own_whatever_its_name(
    demo: Path, cli: Cli
) -> None:
    """A bad `T-7001.txt` beside a customer's bad `T-7001.txt.reason`, and two bad files
    with 246-byte names that differ only at the end: every file is kept as it was, and each
    has its own reason file (none overwritten, none shared)."""
    for path in (demo / "inbox").iterdir():
        path.unlink()
    files = {
        "T-7001.txt": "",
        "T-7001.txt.reason": "the customer's own notes",
        "T-" + "x" * 239 + "a.txt": "a ticket whose name is far too long",
        "T-" + "x" * 239 + "b.txt": "another one, named the same up to its end",
    }
    for name, text in files.items():
        drop(demo / "inbox", name, text)
    done = cli("run", cwd=demo)
    assert done.returncode == 1, done.stdout + done.stderr
    quarantine = demo / "quarantine" / state(demo)["run_id"]
    assert {name: (quarantine / name).read_text() for name in files} == files
    reasons = {}
    for path in quarantine.iterdir():
        if path.name not in files:
            lines = path.read_text().splitlines()
            reasons[next(line for line in lines if line.startswith("file: "))[6:]] = path.name
    assert sorted(reasons) == sorted(files) and len(set(reasons.values())) == len(files)
    assert len(os.listdir(quarantine)) == 2 * len(files)
