"""The inbox: which files may be claimed, what each claimed file is, why a bad one is refused."""

from __future__ import annotations

import builtins
import io
import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from orchestrator.errors import UsageError
from orchestrator.intake import inbox, ticketfile
from orchestrator.intake.inbox import InboxRules, Rejection, Ticket

LIMITS = InboxRules()
PORTUGUESE = "Olá, a fatura de março está errada: cobraram €49,90 duas vezes. Não consigo baixar."
JAPANESE = "請求書のダウンロードができません。先月の請求額が二重に引き落とされています。"


@pytest.fixture
def box(tmp_path: Path) -> Path:
    """An empty inbox folder."""
    folder = tmp_path / "inbox"
    folder.mkdir()
    return folder


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A folder with a short path, for unix sockets (their paths are capped near 100 bytes)."""
    folder = Path(tempfile.mkdtemp(prefix="tg-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder)


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every path opened through os.open or open() while the test runs."""
    seen: list[str] = []
    real_os_open, real_open = os.open, io.open

    def spy_os_open(path: Any, *args: Any, **kwargs: Any) -> int:
        seen.append(os.fspath(path))
        return real_os_open(path, *args, **kwargs)

    def spy_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(file, int):
            seen.append(os.fspath(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(os, "open", spy_os_open)
    monkeypatch.setattr(io, "open", spy_open)
    monkeypatch.setattr(builtins, "open", spy_open)
    return seen


def write(folder: Path, name: str, data: bytes | str) -> Path:
    """A file in `folder`, its text written as UTF-8."""
    path = folder / name
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def rejected(path: Path, limits: InboxRules = LIMITS) -> Rejection:
    """`inspect`'s answer, which must be a rejection."""
    result = inbox.inspect(path, limits)
    assert isinstance(result, Rejection), result
    return result


def accepted(path: Path, limits: InboxRules = LIMITS) -> Ticket:
    """`inspect`'s answer, which must be a ticket."""
    result = inbox.inspect(path, limits)
    assert isinstance(result, Ticket), result
    return result


def email_bytes(body: str | None = None, html: str | None = None, **headers: str) -> bytes:
    """An email as a mail client would save it."""
    message = EmailMessage()
    for name, value in {"From": "Ana <ana@example.com>", "Subject": "Invoice", **headers}.items():
        message[name.replace("_", "-")] = value
    if body is not None:
        message.set_content(body)
    if html is not None and body is not None:
        message.add_alternative(html, subtype="html")
    elif html is not None:
        message.set_content(html, subtype="html")
    return message.as_bytes()


# --- claimable -------------------------------------------------------------------------


def test_claimable_skips_dotfiles_and_fresh_files_but_lists_every_other_entry(
    short_dir: Path,
) -> None:
    now = time.time()
    write(short_dir, "T-1.txt", "settled")
    write(short_dir, ".T-2.txt", "still being written")
    write(short_dir, "T-3.txt", "just renamed in")
    write(short_dir, "T-4.txt", "dated next year by a skewed clock")
    (short_dir / "x.txt").mkdir()
    os.mkfifo(short_dir / "fifo.txt")
    os.symlink("/nowhere", short_dir / "link.txt")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(short_dir / "sock.txt"))
        for path in short_dir.iterdir():
            os.utime(path, (now - 10, now - 10), follow_symlinks=False)
        os.utime(short_dir / "T-3.txt", (now - 0.5, now - 0.5))
        os.utime(short_dir / "T-4.txt", (now + 3600 * 24 * 365, now + 3600 * 24 * 365))
        names = inbox.claimable(short_dir, now, LIMITS)
    assert names == ["T-1.txt", "T-4.txt", "fifo.txt", "link.txt", "sock.txt", "x.txt"]
    assert "T-3.txt" in inbox.claimable(short_dir, now + 1, LIMITS)


def test_claimable_without_an_inbox_folder_is_a_usage_error(tmp_path: Path) -> None:
    """No inbox/ here means the command was run outside a workspace (exit 64)."""
    with pytest.raises(UsageError, match=r"no inbox folder at .*missing.*ticketgraph init"):
        inbox.claimable(tmp_path / "missing", time.time(), LIMITS)


# --- what is not a file: never opened -------------------------------------------------


def _fifo(folder: Path) -> Path:
    os.mkfifo(folder / "T-1.txt")
    return folder / "T-1.txt"


def _socket(folder: Path) -> Path:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(folder / "T-2.txt"))
    return folder / "T-2.txt"


def _directory(folder: Path) -> Path:
    (folder / "x.txt").mkdir()
    return folder / "x.txt"


@pytest.mark.timeout(10)  # a FIFO that was opened would hang here
@pytest.mark.parametrize(
    ("make", "what"),
    [
        (_directory, "a directory"),
        (_fifo, "a FIFO (named pipe)"),
        (_socket, "a socket"),
        (lambda _folder: Path("/dev/null"), "a character device"),
    ],
    ids=["directory", "fifo", "socket", "device"],
)
def test_not_a_regular_file_is_rejected_without_being_opened(
    short_dir: Path, opened: list[str], make: Callable[[Path], Path], what: str
) -> None:
    path = make(short_dir)
    found = rejected(path)
    assert found.kind == "not_regular_file"
    assert found.reason == (
        f"{path.name} is {what}, not a regular file; it was not opened "
        "(tickets must be regular files)"
    )
    assert str(path) not in opened


@pytest.mark.timeout(10)  # following the link to the FIFO would hang here
@pytest.mark.parametrize("target", ["fifo", "secret", "dangling"])
def test_a_symlink_is_refused_and_never_followed(
    box: Path, tmp_path: Path, opened: list[str], target: str
) -> None:
    outside = tmp_path / target  # stands in for /etc/passwd
    if target == "fifo":
        os.mkfifo(outside)
    elif target == "secret":
        outside.write_text("root:x:0:0:root:/root:/bin/bash\n")
    os.symlink(outside, box / "link.txt")
    opened.clear()
    found = rejected(box / "link.txt")
    assert found.kind == "symlink"
    assert found.reason == (
        "link.txt is a symbolic link; tickets must be regular files (links are never followed)"
    )
    assert not [p for p in opened if p in (str(outside), str(box / "link.txt"))]


def test_a_file_that_vanished_after_the_claim_is_unreadable(box: Path) -> None:
    found = rejected(box / "T-1.txt")
    assert (found.kind, found.reason) == (
        "unreadable",
        "T-1.txt could not be read (No such file or directory)",
    )


# --- names and formats: decided before anything is read --------------------------------


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("my ticket.txt", "it contains a space"),
        ("-rf.txt", "it starts with '-'"),
        ("a..b.txt", "it contains '..'"),
        ("T\x01.txt", "it contains the control character \\x01"),
        ("T\n1.md", "it contains the control character \\n"),
        ("tické.txt", "it contains the non-ASCII character 'é'"),
        ("T" * 65 + ".json", "it is 65 characters long, over 64"),
    ],
    ids=["space", "leading-dash", "dot-dot", "control", "newline", "unicode", "too-long"],
)
def test_a_name_that_is_not_a_ticket_id_is_rejected_unread(
    box: Path, opened: list[str], name: str, why: str
) -> None:
    path = write(box, name, "a fine ticket")
    opened.clear()
    found = rejected(path)
    assert found.kind == "bad_name"
    assert f"is not a valid ticket file name: {why}; name it <id>." in found.reason
    assert "\n" not in found.reason and "\x01" not in found.reason
    assert str(path) not in opened


def test_a_name_with_bytes_that_are_not_utf8_is_rejected_and_can_be_saved(box: Path) -> None:
    write(box, os.fsdecode(b"T-\xff.txt"), "a ticket")
    [path] = box.iterdir()
    found = rejected(path)
    assert found.name == "T-\udcff.txt"  # the name os.rename needs
    assert found.reason.startswith(
        '"T-\\udcff.txt" is not a valid ticket file name: it contains a byte that is not UTF-8 '
        "(0xff); name it <id>.txt"
    )
    assert json.loads(found.model_dump_json())["name"] == "T-\\xff.txt"


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        (
            "T-1.TXT",
            "T-1.TXT ends in .TXT, but extensions are matched in lower case only: "
            "rename it to end in .txt",
        ),
        (
            "T-1.pdf",
            "T-1.pdf has the extension .pdf; tickets must end in .txt, .md, .json or .eml "
            "(lower case)",
        ),
        ("T-1", "T-1 has no extension; tickets must end in .txt, .md, .json or .eml (lower case)"),
    ],
    ids=["upper-case", "pdf", "none"],
)
def test_an_unsupported_extension_is_rejected_with_the_accepted_ones(
    box: Path, name: str, reason: str
) -> None:
    found = rejected(write(box, name, "a ticket"))
    assert (found.kind, found.reason) == ("unsupported_format", reason)


def test_a_file_over_the_cap_is_rejected_without_being_read(box: Path, opened: list[str]) -> None:
    path = box / "big.txt"
    with path.open("wb") as handle:
        handle.truncate(5 * 1024 * 1024)  # sparse: 5 MB that cost no disk
    opened.clear()
    found = rejected(path)
    assert (found.kind, found.reason) == (
        "too_big",
        "big.txt is 5,242,880 bytes, over the 65,536-byte cap ([inbox] max_bytes)",
    )
    assert str(path) not in opened


# --- contents --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "data", "kind", "reason"),
    [
        ("T-9.txt", b"", "empty", "T-9.txt is empty (0 bytes)"),
        ("T-8.md", b" \n\t \r\n", "whitespace", "T-8.md holds only whitespace (6 bytes)"),
        (
            "T-7.txt",
            b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR",
            "binary",
            "T-7.txt contains NUL bytes: it is binary, not a text ticket",
        ),
        (
            "T-6.txt",
            bytes(range(0x80, 0x100)) * 4,
            "undecodable",
            "T-6.txt is not UTF-8, UTF-16 or UTF-32 and fits no other encoding; save it as UTF-8",
        ),
        (
            "T-5.json",
            b'{"id": "T-5",\n  body: "x"}',
            "bad_json",
            "T-5.json is not valid JSON: Expecting property name enclosed in double quotes "
            "at line 2, column 3",
        ),
        (
            "T-4.json",
            b'{"id": "T-4", "text": "the old format"}',
            "bad_json",
            'T-4.json must hold a JSON object with a "body" string and optional "id", '
            '"subject", "from" strings; "body" is missing',
        ),
        (
            "T-3.json",
            b'["body"]',
            "bad_json",
            'T-3.json must hold a JSON object with a "body" string and optional "id", '
            '"subject", "from" strings, not a list',
        ),
        (
            "T-2.json",
            b'{"body": "hi", "from": 42}',
            "bad_json",
            'T-2.json must hold a JSON object with a "body" string and optional "id", '
            '"subject", "from" strings; "from" is a number, not a string',
        ),
        ("T-1.json", b'{"body": "  "}', "empty", 'T-1.json has an empty "body"'),
        (
            "T-0.json",
            b'{"id": "../etc/passwd", "body": "hi"}',
            "bad_id",
            'T-0.json gives the ticket id ../etc/passwd in "id", which is not valid: it contains '
            "'/' (1-64 ASCII letters, digits, '-', '_' or '.', starting with a letter or digit, "
            "no '..')",
        ),
        ("M-1.eml", b"  \r\n\r\n", "whitespace", "M-1.eml holds only whitespace (6 bytes)"),
    ],
    ids=[
        "empty",
        "whitespace",
        "binary",
        "undecodable",
        "bad-json-syntax",
        "bad-json-no-body",
        "bad-json-not-object",
        "bad-json-wrong-type",
        "json-empty-body",
        "json-bad-id",
        "eml-whitespace",
    ],
)
def test_a_file_whose_contents_are_not_a_ticket_is_rejected_with_a_reason(
    box: Path, name: str, data: bytes, kind: str, reason: str
) -> None:
    found = rejected(write(box, name, data))
    assert (found.kind, found.reason) == (kind, reason)


def test_txt_and_md_tickets_take_their_id_from_the_name(box: Path) -> None:
    txt = accepted(write(box, "T-1001.txt", "\ufeff  My invoice is wrong.\r\nPlease fix.\r\n"))
    assert txt == Ticket(
        id="T-1001",
        text="My invoice is wrong.\nPlease fix.",
        name="T-1001.txt",
        format="txt",
        encoding="utf_8",
    )
    md = accepted(write(box, "T-1002.md", "# Export\n\nThe *CSV* button spins.\n"))
    assert (md.id, md.format, md.text) == ("T-1002", "md", "# Export\n\nThe *CSV* button spins.")


@pytest.mark.parametrize(
    ("text", "codec", "encoding"),
    [
        (PORTUGUESE, "cp1252", "cp1252"),
        (JAPANESE, "shift_jis", "shift_jis"),
        (PORTUGUESE, "utf-16", "utf_16"),
        (JAPANESE, "utf-32", "utf_32"),
        (JAPANESE, "utf-8-sig", "utf_8"),
    ],
    ids=["cp1252", "shift-jis", "utf-16", "utf-32", "utf-8-bom"],
)
def test_text_in_another_encoding_is_decoded_and_its_encoding_recorded(
    box: Path, text: str, codec: str, encoding: str
) -> None:
    ticket = accepted(write(box, "T-2002.txt", text.encode(codec)))
    assert (ticket.text, ticket.encoding) == (text, encoding)


def test_a_json_ticket_names_its_id_subject_and_sender(box: Path) -> None:
    data = {"id": "T-77", "subject": " Double  charge ", "body": "Charged twice.\n", "from": "ana"}
    ticket = accepted(write(box, "anything.json", json.dumps(data)))
    assert ticket == Ticket(
        id="T-77",
        text="Subject: Double charge\n\nCharged twice.",
        name="anything.json",
        format="json",
        encoding="utf_8",
        subject="Double charge",
        sender="ana",
    )
    plain = accepted(write(box, "T-78.json", json.dumps({"body": "No id here."})))
    odd = accepted(write(box, "T-79.json", '{"body": "half \\ud800 a pair", "from": " a\\n b "}'))
    assert (odd.text, odd.sender) == ("half ? a pair", "a b")
    assert (plain.id, plain.text, plain.subject, plain.sender) == (
        "T-78",
        "No id here.",
        None,
        None,
    )


def test_duplicate_ids_keep_the_first_file_by_name(box: Path) -> None:
    found = [
        accepted(write(box, "T-5.txt", "from the text file")),
        accepted(write(box, "T-5.json", json.dumps({"id": "T-5", "body": "from the JSON"}))),
        accepted(write(box, "t-5.md", "same id in another case")),
        accepted(write(box, "T-6.txt", "another ticket")),
    ]
    kept, dropped = inbox.dedupe(found)
    assert [t.name for t in kept] == ["T-5.json", "T-6.txt"]
    assert [(r.name, r.kind) for r in dropped] == [
        ("T-5.txt", "duplicate_id"),
        ("t-5.md", "duplicate_id"),
    ]
    assert dropped[0].reason == (
        "T-5.txt has the ticket id T-5, which T-5.json already has in this claim "
        "(the first file by name keeps it); give it another id"
    )


# --- email -----------------------------------------------------------------------------


def test_an_eml_ticket_takes_subject_sender_and_the_plain_body(box: Path) -> None:
    raw = email_bytes("Olá,\nthe invoice is wrong.\n", "<p>HTML <b>copy</b></p>", Subject="Olá")
    ticket = accepted(write(box, "M-1.eml", raw))
    assert ticket == Ticket(
        id="M-1",
        text="Subject: Olá\n\nOlá,\nthe invoice is wrong.",
        name="M-1.eml",
        format="eml",
        encoding="utf_8",
        subject="Olá",
        sender="Ana <ana@example.com>",
    )


def test_an_eml_with_only_html_gives_the_text_without_tags_scripts_or_styles(box: Path) -> None:
    html = (
        "<html><head><title>Mail</title><style>p { color: red }</style></head><body>"
        "<script>alert('x')</script><p>The  CSV&nbsp;export\n spins &amp; stops.</p>"
        "<div>Chrome,<br>office network</div></body></html>"
    )
    ticket = accepted(write(box, "M-2.eml", email_bytes(html=html)))
    assert (
        ticket.text == "Subject: Invoice\n\nThe CSV export spins & stops.\nChrome,\noffice network"
    )


def test_an_eml_takes_its_id_from_the_configured_header(box: Path) -> None:
    raw = email_bytes("Body.", X_Ticket_Id="T-4242")
    assert accepted(write(box, "mail-1.eml", raw)).id == "T-4242"
    custom = InboxRules(id_header="X-Case")
    assert (
        accepted(write(box, "mail-2.eml", email_bytes("Body.", X_Case="C-7")), custom).id == "C-7"
    )
    bad = rejected(write(box, "mail-3.eml", email_bytes("Body.", X_Ticket_Id="T 1")))
    assert (bad.kind, bad.reason.split(", which")[0]) == (
        "bad_id",
        'mail-3.eml gives the ticket id "T 1" in its X-Ticket-Id header',
    )


def test_a_japanese_eml_in_iso_2022_jp_is_decoded(box: Path) -> None:
    raw = (
        b"From: =?iso-2022-jp?b?GyRCRURDZhsoQg==?= <tanaka@example.jp>\r\n"
        b"Subject: =?iso-2022-jp?b?GyRCQEE1YT1xGyhC?=\r\n"
        b"MIME-Version: 1.0\r\nContent-Type: text/plain; charset=iso-2022-jp\r\n"
        b"Content-Transfer-Encoding: 7bit\r\n\r\n" + JAPANESE.encode("iso2022_jp") + b"\r\n"
    )
    ticket = accepted(write(box, "T-2002.eml", raw))
    assert (ticket.subject, ticket.sender) == ("請求書", "田中 <tanaka@example.jp>")
    assert (ticket.text, ticket.encoding) == (f"Subject: 請求書\n\n{JAPANESE}", "iso2022_jp")


def test_an_eml_keeps_a_sender_the_stdlib_cannot_parse(box: Path) -> None:
    raw = b"From: '@\r\nSubject: Hi\r\n\r\nThe body.\r\n"  # IndexError in email's parser
    assert accepted(write(box, "M-3.eml", raw)).sender == "'@"


def test_an_eml_without_a_text_body_is_empty(box: Path) -> None:
    message = EmailMessage()
    message["Subject"] = "Scan"
    message.add_attachment(b"%PDF-1.7", maintype="application", subtype="pdf", filename="a.pdf")
    found = rejected(write(box, "M-4.eml", message.as_bytes()))
    assert (found.kind, found.reason) == ("empty", "M-4.eml has no text/plain or text/html body")


def test_an_eml_the_parser_chokes_on_is_rejected_not_raised(
    box: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def choke(self: Any, raw: bytes) -> None:
        raise IndexError("string index out of range")

    monkeypatch.setattr(ticketfile.BytesParser, "parsebytes", choke)
    found = rejected(write(box, "M-5.eml", email_bytes("Body.")))
    assert (found.kind, found.reason) == (
        "bad_eml",
        "M-5.eml could not be parsed as an email (IndexError: string index out of range)",
    )


# --- reasons, routing text, limits ------------------------------------------------------


def test_write_reason_puts_the_reason_beside_the_quarantined_file(tmp_path: Path) -> None:
    rejection = Rejection(name="T-9.txt", kind="empty", reason="T-9.txt is empty (0 bytes)")
    folder = tmp_path / "quarantine"
    path = inbox.write_reason(folder / inbox.reason_name("T-9.txt", set()), rejection, "run-1")
    assert path == folder / "T-9.txt.reason"
    lines = path.read_text().splitlines()
    assert lines[:4] == [
        "reason: T-9.txt is empty (0 bytes)",
        "kind: empty",
        "file: T-9.txt",
        "run: run-1",
    ]
    assert lines[4].startswith("at: 20") and lines[4].endswith("Z")


def test_a_reason_name_is_never_a_name_of_the_run_nor_another_long_names_reason() -> None:
    """`T-7001.txt.reason` is a customer's file beside a bad `T-7001.txt`: the reason goes
    elsewhere. Two 246-byte names that differ only at the end, cut to fit, stay two."""
    taken = {"T-7001.txt", "T-7001.txt.reason"}
    assert inbox.reason_name("T-7001.txt.reason", taken) == "T-7001.txt.reason.reason"
    moved = inbox.reason_name("T-7001.txt", taken)
    assert moved.startswith("T-7001.txt~") and moved.endswith(".reason") and moved not in taken
    first, second = "x" * 241 + "a.txt", "x" * 241 + "b.txt"
    one, two = inbox.reason_name(first, set()), inbox.reason_name(second, set())
    assert one != two
    assert max(len(one.encode()), len(two.encode())) <= inbox.REASON_NAME_MAX
    assert inbox.reason_name(first, {one}) not in (one, two)  # even its own hash taken
    assert inbox.reason_name("T-9.txt", set()) == "T-9.txt.reason"  # the usual name


def test_route_text_cuts_a_long_ticket_on_a_word_boundary() -> None:
    assert inbox.route_text("short ticket", 100) == "short ticket"
    cut = inbox.route_text("word " * 100, 100)
    assert len(cut) <= 100 and cut.endswith("word […]")
    assert inbox.route_text("x" * 500, 100) == "x" * 96 + " […]"


def test_inbox_limits_are_frozen_and_reject_unknown_keys() -> None:
    with pytest.raises(ValidationError):
        InboxRules(max_bytez=1)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        LIMITS.max_bytes = 1  # type: ignore[misc]


@pytest.mark.timeout(10)
def test_a_file_swapped_after_lstat_is_still_refused_when_opened(box: Path, tmp_path: Path) -> None:
    # `_read` runs after lstat said "regular file"; here the file changed in between.
    os.symlink(write(tmp_path, "secret", "root:x:0:0"), box / "link.txt")
    os.mkfifo(box / "T-1.txt")
    write(box, "T-2.txt", "x" * 2000)
    small = InboxRules(max_bytes=1000)
    assert inbox._read(box / "link.txt", LIMITS) == ticketfile.Problem(
        ticketfile.RejectKind.SYMLINK,
        "is a symbolic link; tickets must be regular files (links are never followed)",
    )
    fifo = inbox._read(box / "T-1.txt", LIMITS)
    assert isinstance(fifo, ticketfile.Problem) and fifo.kind == "not_regular_file"
    grown = inbox._read(box / "T-2.txt", small)
    assert grown == ticketfile.Problem(
        ticketfile.RejectKind.TOO_BIG, "is 2,000 bytes, over the 1,000-byte cap ([inbox] max_bytes)"
    )
