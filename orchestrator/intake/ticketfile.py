"""A ticket file's name and bytes into a ticket: the id rule, decoding, and one parser per format.

Nothing here touches the filesystem: `orchestrator.inbox` decides which files get this far.
A file that cannot be a ticket comes back as a `Problem`, whose `detail` finishes a sentence
that starts with the file's name ("T-9.txt" + " is empty (0 bytes)").
"""

from __future__ import annotations

import codecs
import json
import re
from dataclasses import dataclass
from email import policy
from email.message import EmailMessage
from email.parser import BytesParser
from enum import StrEnum
from html.parser import HTMLParser
from pathlib import PurePath
from typing import Any, Literal, cast, get_args

from charset_normalizer import CharsetMatch, from_bytes

from orchestrator.run.ids import ID_RULE, TICKET_ID

Format = Literal["txt", "md", "json", "eml"]
FORMATS: tuple[Format, ...] = get_args(Format)
ACCEPTED = ".txt, .md, .json or .eml"

# Encodings worth guessing for a ticket that is not UTF-8. Left to choose among every code
# page it knows, charset-normalizer calls short Western-European text cp850, cp775 or
# mac_roman, which nobody saves tickets in; the Windows code pages and the usual CJK and
# Cyrillic encodings cover what support inboxes receive.
LIKELY_ENCODINGS = [
    *(f"cp{n}" for n in range(1250, 1259)),
    *("iso8859_2", "iso8859_5", "iso8859_7", "iso8859_15", "koi8_r", "koi8_u", "cp874"),
    *("shift_jis", "cp932", "euc_jp", "iso2022_jp", "gb18030", "big5", "euc_kr", "cp949"),
]
# When candidates score the same, these names win in this order (first: the commonest legacy
# encoding of Western text; then the standard name of what Windows calls cp932).
PREFERRED_ENCODINGS = ("cp1252", "shift_jis")

_WIDE_BOMS = (
    (codecs.BOM_UTF32_LE, "utf_32"),  # before UTF-16 LE: its BOM starts with UTF-16 LE's
    (codecs.BOM_UTF32_BE, "utf_32"),
    (codecs.BOM_UTF16_LE, "utf_16"),
    (codecs.BOM_UTF16_BE, "utf_16"),
)


class RejectKind(StrEnum):
    """Why a file in the inbox cannot be a ticket."""

    EMPTY = "empty"
    WHITESPACE = "whitespace"
    BINARY = "binary"
    TOO_BIG = "too_big"
    NOT_REGULAR_FILE = "not_regular_file"
    SYMLINK = "symlink"
    BAD_NAME = "bad_name"
    BAD_ID = "bad_id"
    UNSUPPORTED_FORMAT = "unsupported_format"
    UNDECODABLE = "undecodable"
    BAD_JSON = "bad_json"
    BAD_EML = "bad_eml"
    UNREADABLE = "unreadable"
    DUPLICATE_ID = "duplicate_id"


@dataclass(frozen=True)
class Problem:
    """Why a file cannot be a ticket; `detail` follows the file's name in one sentence."""

    kind: RejectKind
    detail: str


@dataclass(frozen=True)
class Parsed:
    """What a ticket file holds, before it is tied to its file name and format."""

    id: str
    text: str
    encoding: str
    subject: str | None = None
    sender: str | None = None


def shown(text: str) -> str:
    """`text` safe to print on one line: quoted, with unprintable characters escaped, if needed."""
    if all(c.isprintable() and not c.isspace() for c in text):
        return text
    escaped = "".join(c if c == " " or c.isprintable() else _escaped(c) for c in text)
    return f'"{escaped}"'


def _escaped(c: str) -> str:
    """An unprintable character as Python writes it in a string: \\x01, \\n, \\udcff."""
    return c.encode("unicode_escape").decode("ascii")


def id_problem(value: str) -> str | None:
    """Why `value` is not a valid ticket id, or None if it is one."""
    if not value:
        return "it is empty"
    bad = next((c for c in value if not (c.isascii() and (c.isalnum() or c in "_.-"))), None)
    if bad is not None:
        return f"it contains {_char(bad)}"
    if not value[0].isalnum():
        return f"it starts with '{value[0]}'"
    if ".." in value:
        return "it contains '..'"
    if not TICKET_ID.match(value):
        return f"it is {len(value)} characters long, over 64"
    return None


def _char(c: str) -> str:
    """One offending character, described so a person can find it."""
    if c == " ":
        return "a space"
    if "\udc80" <= c <= "\udcff":  # how Python lists a name byte that is not UTF-8
        return f"a byte that is not UTF-8 (0x{ord(c) - 0xDC00:02x})"
    if not c.isprintable():
        return f"the control character {_escaped(c)}"
    return f"'{c}'" if c.isascii() else f"the non-ASCII character '{c}'"


def split_name(name: str) -> tuple[Format, str] | Problem:
    """A file name's format and stem (its ticket id unless the file names another)."""
    path = PurePath(name)
    suffix, stem = path.suffix, path.stem
    if suffix[1:] not in FORMATS:
        return Problem(RejectKind.UNSUPPORTED_FORMAT, _format_detail(suffix))
    why = id_problem(stem)
    if why is not None:
        detail = f"is not a valid ticket file name: {why}; name it <id>{suffix}, the id {ID_RULE}"
        return Problem(RejectKind.BAD_NAME, detail)
    return cast(Format, suffix[1:]), stem


def _format_detail(suffix: str) -> str:
    """Why an extension is not accepted, and what to rename the file to."""
    if suffix[1:].lower() in FORMATS:
        return (
            f"ends in {shown(suffix)}, but extensions are matched in lower case only: "
            f"rename it to end in {suffix.lower()}"
        )
    what = f"the extension {shown(suffix)}" if suffix else "no extension"
    return f"has {what}; tickets must end in {ACCEPTED} (lower case)"


def parse(raw: bytes, fmt: Format, stem: str, id_header: str) -> Parsed | Problem:
    """Decide what a ticket file's bytes hold: empty, binary, undecodable, or a ticket."""
    if not raw:
        return Problem(RejectKind.EMPTY, "is empty (0 bytes)")
    if b"\x00" in raw and _wide_bom(raw) is None:
        return Problem(RejectKind.BINARY, "contains NUL bytes: it is binary, not a text ticket")
    if fmt == "eml":
        return _parse_eml(raw, stem, id_header) if raw.strip() else _whitespace(raw)
    decoded = decode(raw)
    if decoded is None:
        return _undecodable("is")
    text, encoding = decoded
    if not text.strip():
        return _whitespace(raw)
    if fmt == "json":
        return _parse_json(text, encoding, stem)
    return Parsed(id=stem, text=_lines(text), encoding=encoding)


def _whitespace(raw: bytes) -> Problem:
    """The problem of a file with nothing but blanks in it."""
    return Problem(RejectKind.WHITESPACE, f"holds only whitespace ({len(raw):,} bytes)")


def _undecodable(subject: str) -> Problem:
    """The problem of text in no encoding we can find."""
    detail = f"{subject} not UTF-8, UTF-16 or UTF-32 and fits no other encoding; save it as UTF-8"
    return Problem(RejectKind.UNDECODABLE, detail)


def _lines(text: str) -> str:
    """`text` stripped, with Windows and old Mac line ends made `\\n`."""
    return text.replace("\r\n", "\n").replace("\r", "\n").strip()


def decode(raw: bytes) -> tuple[str, str] | None:
    """`raw` as text and the name of its encoding, or None if no encoding fits."""
    wide = _wide_bom(raw)
    if wide is not None:
        return _strict(raw, wide)
    decoded = _strict(raw, "utf_8_sig")
    if decoded is not None:
        return decoded[0], "utf_8"
    return _detect(raw)


def _wide_bom(raw: bytes) -> str | None:
    """The UTF-16 or UTF-32 codec whose byte order mark starts `raw`, if any."""
    return next((codec for bom, codec in _WIDE_BOMS if raw.startswith(bom)), None)


def _strict(raw: bytes, encoding: str) -> tuple[str, str] | None:
    """`raw` decoded with `encoding` if every byte fits, with the codec's name."""
    try:
        return raw.decode(encoding), codec_name(encoding)
    except (UnicodeDecodeError, LookupError):
        return None


def codec_name(encoding: str) -> str:
    """Python's own name for an encoding, with underscores: "UTF-8" -> "utf_8"."""
    return codecs.lookup(encoding).name.replace("-", "_")


def _detect(raw: bytes) -> tuple[str, str] | None:
    """charset-normalizer's best guess among the likely encodings, preferred names winning ties."""
    matches = from_bytes(raw, cp_isolation=LIKELY_ENCODINGS)
    best = matches.best()
    if best is None:
        return None
    for name in PREFERRED_ENCODINGS:
        for match in matches:
            if _tied(match, best) and name in match.could_be_from_charset:
                decoded = _strict(raw, name)
                if decoded is not None and decoded[0] == str(match):
                    return decoded
    return str(best), codec_name(best.encoding)


def _tied(match: CharsetMatch, best: CharsetMatch) -> bool:
    """Whether charset-normalizer cannot tell `match` from `best` (same mess, same language fit)."""
    return abs(match.chaos - best.chaos) < 0.01 and abs(match.coherence - best.coherence) < 0.01


def _with_subject(subject: str | None, body: str) -> str:
    """A ticket's text: its subject line, if any, then its body."""
    return f"Subject: {subject}\n\n{body}" if subject else body


def _given_id(value: str | None, stem: str, where: str) -> str | Problem:
    """The id a file names in `where`, checked, or its stem if it names none."""
    if value is None:
        return stem
    why = id_problem(value)
    if why is None:
        return value
    detail = f"gives the ticket id {shown(value)} in {where}, which is not valid: {why} ({ID_RULE})"
    return Problem(RejectKind.BAD_ID, detail)


def _parse_json(text: str, encoding: str, stem: str) -> Parsed | Problem:
    """A `.json` ticket: an object with a "body" string and optional "id", "subject", "from"."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        detail = f"is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}"
        return Problem(RejectKind.BAD_JSON, detail)
    fields = _json_fields(data)
    if isinstance(fields, Problem):
        return fields
    ticket_id = _given_id(fields["id"], stem, '"id"')
    if isinstance(ticket_id, Problem):
        return ticket_id
    body = _lines(_encodable(fields["body"] or ""))
    if not body:
        return Problem(RejectKind.EMPTY, 'has an empty "body"')
    subject, sender = _one_line(fields["subject"]), _one_line(fields["from"])
    return Parsed(ticket_id, _with_subject(subject, body), encoding, subject, sender)


def _json_fields(data: Any) -> dict[str, str | None] | Problem:
    """The four fields of a JSON ticket, or what is wrong with its shape."""
    shape = 'must hold a JSON object with a "body" string and optional "id", "subject", "from"'
    if not isinstance(data, dict):
        return Problem(RejectKind.BAD_JSON, f"{shape} strings, not {_json_type(data)}")
    if data.get("body") is None:
        return Problem(RejectKind.BAD_JSON, f'{shape} strings; "body" is missing')
    for key in ("id", "subject", "body", "from"):
        value = data.get(key)
        if value is not None and not isinstance(value, str):
            detail = f'{shape} strings; "{key}" is {_json_type(value)}, not a string'
            return Problem(RejectKind.BAD_JSON, detail)
    return {key: data.get(key) for key in ("id", "subject", "body", "from")}


def _json_type(value: Any) -> str:
    """How JSON would name the type of `value`."""
    if isinstance(value, bool):
        return "true or false"
    names = {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number"}
    return names.get(type(value), "null")


def _parse_eml(raw: bytes, stem: str, id_header: str) -> Parsed | Problem:
    """An `.eml` ticket: subject, sender and the plain-text body, or the HTML body's text."""
    try:
        # policy.default always builds an EmailMessage (typeshed says Message).
        message = cast(EmailMessage, BytesParser(policy=policy.default).parsebytes(raw))
        part = message.get_body(preferencelist=("plain", "html"))
        body = None if part is None else _part_text(part)
        headers = [_header(message, name) for name in (id_header, "subject", "from")]
    except Exception as exc:  # the stdlib parser raises assorted errors on malformed mail
        detail = f"could not be parsed as an email ({type(exc).__name__}: {exc})"
        return Problem(RejectKind.BAD_EML, detail)
    if part is None:
        return Problem(RejectKind.EMPTY, "has no text/plain or text/html body")
    if body is None:
        return _undecodable("has a body that is")
    header_id, subject, sender = headers
    ticket_id = _given_id(header_id, stem, f"its {id_header} header")
    if isinstance(ticket_id, Problem):
        return ticket_id
    text, encoding = body
    if part.get_content_subtype() == "html":
        text = html_text(text)
    if not text.strip():
        return Problem(RejectKind.EMPTY, "has an empty body")
    return Parsed(ticket_id, _with_subject(subject, _lines(text)), encoding, subject, sender)


def _part_text(part: EmailMessage) -> tuple[str, str] | None:
    """A MIME part's text and encoding: its declared charset if that fits, else detected."""
    payload = part.get_payload(decode=True)
    raw = payload if isinstance(payload, bytes) else b""
    declared = part.get_content_charset()
    decoded = None if declared is None else _strict(raw, declared)
    return decoded if decoded is not None else decode(raw)


def _header(message: EmailMessage, name: str) -> str | None:
    """A header's value on one line, or None; the raw value if the stdlib cannot parse it."""
    try:
        value = message.get(name)
    except Exception:  # e.g. IndexError on `From: '@`: keep the text as it was written
        value = next((v for k, v in message.raw_items() if k.lower() == name.lower()), None)
    return None if value is None else _one_line(str(value))


def _one_line(value: str | None) -> str | None:
    """A header-like value on one line with single spaces, or None if there is nothing."""
    return " ".join(_encodable(value or "").split()) or None


def _encodable(text: str) -> str:
    """`text` with lone surrogates (a JSON "\\ud800", raw header bytes) made "?".

    They cannot be written as UTF-8, so one would fail the run when the ticket is saved.
    """
    return text.encode("utf-8", "replace").decode("utf-8")


class _HtmlText(HTMLParser):
    """Collects the text of an HTML document, leaving out scripts, styles and the title."""

    SKIPPED = frozenset({"script", "style", "title"})
    BREAKS = frozenset({"br", "p", "div", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skipping = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        """Enter a skipped element, or break the line before a block."""
        if tag in self.SKIPPED:
            self._skipping += 1
        elif tag in self.BREAKS:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        """Leave a skipped element, or break the line after a block."""
        if tag in self.SKIPPED:
            self._skipping = max(0, self._skipping - 1)
        elif tag in self.BREAKS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        """Keep text outside skipped elements."""
        if not self._skipping:  # in HTML a line break in text is just a space
            self.parts.append(re.sub(r"\s+", " ", data))


def html_text(html: str) -> str:
    """The readable text of an HTML body: no tags, scripts or styles; whitespace collapsed."""
    parser = _HtmlText()
    parser.feed(html)
    parser.close()
    lines = (" ".join(line.split()) for line in "".join(parser.parts).splitlines())
    return "\n".join(line for line in lines if line)
