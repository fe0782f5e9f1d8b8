"""The files of one run: small records written independently, run-state.json made from them.

Per-ticket steps read and write only their own ticket's record (`records/<ticket>.json`) and
the small run.json, so an update costs the same at 6 tickets and at 10,000, and no lock is
taken on the hot path: each ticket has one writer at a time (the task that holds it), and
every write is atomic (temp file, fsync, rename). A node is opened by whoever creates its
file first (`os.link` of a complete temp file fails if the name exists). run-state.json is
materialised from the records by the single-writer steps (route, merge, report), by `status`,
and at the end. Route writes its decisions in one file (routes.json) that a record still
`claimed` shows until drafting writes them in. The run folder must be on a volume all workers
share (same path everywhere).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

from orchestrator.errors import RunStateError, UsageError
from orchestrator.run import ids
from orchestrator.run.outline import ROUTE
from orchestrator.run.records import (
    NodeRecord,
    Routed,
    RunMeta,
    RunRecord,
    TicketRecord,
    TicketStatus,
)
from orchestrator.run.workspace import Workspace
from workers import atomic, versions
from workers.fence import UNFENCED, Fence
from workers.trace import Tracer, now_iso

STATE_FILE = "run-state.json"
META_FILE = "run.json"
TRACE_FILE = "run.jsonl"
REPORT_FILE = "report.txt"
ROUTES_FILE = "routes.json"
ROUTE_NODE = ROUTE.node  # the node that writes ROUTES_FILE

ROUTER = "_router"  # the router's agent files: no ticket id starts with "_"

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


def new_run_id() -> str:
    """A sortable, unique run id: run-YYYYMMDD-HHMMSS-xxxx."""
    return f"run-{datetime.now(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


class RunStore:
    """The files of one run under `runs/<run_id>/`."""

    def __init__(self, run_dir: Path, fence: Fence = UNFENCED) -> None:
        # Workers on other machines get this path as is; tasks already carry it absolute.
        self.dir = run_dir if run_dir.is_absolute() else run_dir.resolve()
        ids.run(self.dir.name)  # a path from a message or a state file: a plain run folder
        # Every write goes through it: a task's copy that was superseded writes nothing.
        self.fence = fence
        # A fenced store is one task's hold: a per-ticket step's on its ticket, a whole-run
        # step's on every record. Nobody else writes what it holds meanwhile, so it keeps
        # each record it read or wrote (as JSON: each read parses a fresh copy) instead of
        # reading the file again. An unfenced store (the CLI's, `status`) always reads the
        # files: workers write them meanwhile.
        self._records: dict[str, str] | None = None if fence is UNFENCED else {}
        self._route_was_closed = False

    @property
    def workspace(self) -> Workspace:
        """The workspace the run belongs to (runs/<run_id>/ in it)."""
        return Workspace(self.dir.parent.parent)

    def fenced(self, fence: Fence) -> RunStore:
        """The same run, written through `fence` (one delivery's hold, fence.py)."""
        return RunStore(self.dir, fence)

    def write(self, path: Path, text: atomic.Content, durable: bool = True) -> None:
        """Write one file of the run (or its out/ reply) atomically, through the fence."""
        self.fence.write(path, text, durable=durable)

    def write_many(self, items: Iterable[tuple[Path, str | bytes]]) -> None:
        """Write many files with one flush, through the fence."""
        self.fence.write_many(items)

    def link_many(self, items: Iterable[tuple[Path, Path]]) -> None:
        """Put durable files (source, target) at their targets too, through the fence."""
        self.fence.link_many(items)

    @property
    def run_id(self) -> str:
        """The run id is the folder's name."""
        return self.dir.name

    @property
    def state_path(self) -> Path:
        """run-state.json of this run (materialised)."""
        return self.dir / STATE_FILE

    @property
    def meta_path(self) -> Path:
        """run.json: the run without its nodes and tickets."""
        return self.dir / META_FILE

    @property
    def trace_path(self) -> Path:
        """run.jsonl of this run."""
        return self.dir / TRACE_FILE

    @property
    def report_path(self) -> Path:
        """The printed report of this run."""
        return self.dir / REPORT_FILE

    @property
    def workers_log(self) -> Path:
        """The log of an embedded run's worker processes (Celery's, and tracebacks)."""
        return self.dir / "workers.log"

    def draft_path(self, ticket_id: str) -> Path:
        """Where the drafting task leaves a draft for merge to publish."""
        return self.dir / "drafts" / f"{ids.ticket(ticket_id)}.txt"

    def agent_path(self, ticket_id: str, step: str) -> Path:
        """Harness state of one agent run (resumable without paying twice)."""
        owner = ticket_id if ticket_id == ROUTER else ids.ticket(ticket_id)
        return self.dir / "agents" / f"{owner}.{ids.ticket(step)}.json"

    @property
    def claimed_dir(self) -> Path:
        """The files this run claimed from inbox/, as they were."""
        return self.dir / "claimed"

    def ticket_path(self, ticket_id: str) -> Path:
        """The ticket's text as claimed into the run (later nodes read it from here)."""
        return self.dir / "tickets" / f"{ids.ticket(ticket_id)}.txt"

    def ticket_text(self, ticket_id: str) -> str:
        """The ticket's text as claimed into the run folder."""
        return atomic.read_bytes(self.ticket_path(ticket_id)).decode("utf-8")

    def record_path(self, ticket_id: str) -> Path:
        """The ticket's record."""
        return self.dir / "records" / f"{ids.ticket(ticket_id)}.json"

    @property
    def actions_path(self) -> Path:
        """What the run's write tools did (one JSON line per effect, e.g. a refund request)."""
        return self.dir / "actions.jsonl"

    @property
    def published_path(self) -> Path:
        """merge's list of the drafts it published to out/, with their summaries."""
        return self.dir / "published.json"

    @property
    def routes_path(self) -> Path:
        """route's decisions for the tickets it passed on to drafting (`Routed`)."""
        return self.dir / ROUTES_FILE

    def node_path(self, node: str) -> Path:
        """One node's record."""
        return self.dir / "nodes" / f"{node}.json"

    def tracer(self, **fields: object) -> Tracer:
        """A tracer appending to this run's run.jsonl; the run id is the folder's name."""
        return Tracer(self.trace_path, self.run_id, **fields)

    # --- the run ---------------------------------------------------------------------------

    def meta(self) -> RunMeta:
        """run.json; `RunStateError` if missing or corrupt."""
        return _load(RunMeta, self.meta_path)

    def meta_version(self) -> tuple[int, int, int] | None:
        """run.json's version (every write is a rename of a new file), None if it is missing:
        whether it changed is one stat, not a read."""
        try:
            stat = os.stat(self.meta_path)
        except FileNotFoundError:
            return None
        return (stat.st_ino, stat.st_mtime_ns, stat.st_size)

    def write_meta(self, meta: RunMeta, touch: bool = True) -> None:
        """Write run.json atomically (`touch`: as the run's last update, which an ended
        run's duration runs to)."""
        if touch:
            meta.updated_at = now_iso()
        self.write(self.meta_path, meta.model_dump_json(indent=2))

    @contextlib.contextmanager
    def update_meta(self) -> Iterator[RunMeta]:
        """Read, let the caller change, and write run.json under the run's lock.

        Only whole-run transitions come here (start, stop, crash, verdict): a handful per run.
        """
        with self.locked():
            meta = self.meta()
            yield meta
            self.write_meta(meta)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the run's lock (the one every change of run.json is made under)."""
        fd = os.open(self.dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the lock

    # --- tickets ---------------------------------------------------------------------------

    def ticket(self, ticket_id: str) -> TicketRecord:
        """One ticket's record; `RunStateError` naming the ticket and the file if it is gone
        (the run folder was damaged: the run must not go on as if it had fewer tickets).

        A record still `claimed` shows route's decision (routes.json), if it made one: route
        writes one file for the whole run, and drafting writes the decision into the record
        when it takes the ticket."""
        record = self._ticket(ticket_id)
        if record.status is TicketStatus.CLAIMED:
            if (routed := self.routes().get(ticket_id)) is not None:
                routed.show_in(record)
            elif self._route_closed() and not self.routes_path.exists():
                raise RunStateError(
                    f"ticket {ticket_id} has no routing decision: {self.routes_path} is "
                    "missing (the run folder was damaged; restore the file, or "
                    f"`ticketgraph requeue {self.run_id} {ticket_id}` to run it again in a "
                    "new run)"
                )
        return record

    def _route_closed(self) -> bool:
        """Route's node is closed (it wrote routes.json before it closed); asked once a
        store once it is (a store reading every record asks once, not once a record)."""
        if not self._route_was_closed:
            try:
                self._route_was_closed = _load(NodeRecord, self.node_path(ROUTE_NODE)).done
            except RunStateError:  # not started
                return False
        return self._route_was_closed

    def record(self, ticket_id: str) -> TicketRecord:
        """One ticket's record as it is on disk, without route's decision (`ticket` shows
        it): for what the record alone holds, such as the file the ticket came from."""
        return self._ticket(ticket_id)

    def _ticket(self, ticket_id: str) -> TicketRecord:
        if self._records is not None and (kept := self._records.get(ticket_id)) is not None:
            return TicketRecord.model_validate_json(kept)
        path = self.record_path(ticket_id)
        try:
            version, record = _newest_record(_read(path), path)
            if self._records is not None:
                self._records[ticket_id] = version.decode("utf-8")
            return record
        except RunStateError:
            if path.exists():
                raise
            raise RunStateError(
                f"the record of ticket {ticket_id} is missing: {path} (the run folder was "
                f"damaged; restore the file, or `ticketgraph requeue {self.run_id} "
                f"{ticket_id}` to run it again in a new run)"
            ) from None

    def keep(self, ticket_id: str, record: TicketRecord) -> None:
        """Hold on to `record` as the ticket's current record (a fenced store: its holder
        read it under the fence it now holds)."""
        if self._records is not None:
            self._records[ticket_id] = record.model_dump_json()

    def save_ticket(self, ticket_id: str, record: TicketRecord) -> None:
        """Write one ticket's record as its file's newest version (workers/versions.py; its
        holder is the only writer)."""
        text = record.model_dump_json()
        self.fence.append(self.record_path(ticket_id), text)
        if self._records is not None:
            self._records[ticket_id] = text

    def save_tickets(self, records: Iterable[tuple[str, TicketRecord]]) -> None:
        """Write many tickets' records (id, record: each serialised as it comes) with one
        flush (a single-writer step: route, claim)."""

        written: list[tuple[str, str]] = []

        def texts() -> Iterator[tuple[Path, str]]:
            for ticket_id, record in records:
                written.append((ticket_id, record.model_dump_json()))
                yield self.record_path(ticket_id), written[-1][1]

        self.write_many(texts())
        if self._records is not None:
            self._records.update(written)

    def save_routes(self, routes: Mapping[str, Routed]) -> None:
        """Write route's decisions for the tickets it passes on, in one file."""
        self.write(self.routes_path, _ROUTES.dump_json(dict(routes)))

    def routes(self) -> Mapping[str, Routed]:
        """route's decisions (empty before route wrote them), parsed once a process for each
        version of the file."""
        path = self.routes_path
        try:
            stat = os.stat(path)
        except FileNotFoundError:
            return _NO_ROUTES  # the same object each time: a reader can tell nothing changed
        version = (stat.st_ino, stat.st_mtime_ns, stat.st_size)  # each write is a new inode
        # The tasks' threads and the web view's share what was read. One of them reads a new
        # version while the others wait for it: the hundreds of threads a fan-out starts at
        # once would each parse the same file (700 KB at 10,000 tickets) at the same moment.
        with _routes_lock:
            kept = _routes_read.get(path)
            if kept is None or kept[0] != version:
                kept = (version, _parse_with(_ROUTES.validate_json, _read(path), path))
                _routes_read[path] = kept
            _routes_read.move_to_end(path)
            while len(_routes_read) > _ROUTES_KEPT:
                _routes_read.popitem(last=False)  # the run read least recently
        return kept[1]

    def ticket_ids(self) -> list[str]:
        """Every ticket of the run, sorted: those it claimed (their texts) and those with a
        record, so a file lost from either folder is found, not a ticket quietly dropped."""
        claimed = _names(self.dir / "tickets", ".txt")
        return sorted(claimed | _names(self.dir / "records", ".json"))

    def tickets(self) -> dict[str, TicketRecord]:
        """Every ticket's record, by id (reads one file per ticket: for single-writer steps)."""
        return dict(self.records())

    def records(self) -> Iterator[tuple[str, TicketRecord]]:
        """Every ticket's record, by id, parsed one at a time as the caller goes: a parsed
        record is about 5.9 KB of objects against 0.7 KB of JSON (tracemalloc), so a
        whole-run step over 10,000 tickets that held them all grew its worker by 66 MB,
        which the allocator never gave back."""
        for ticket_id in self.ticket_ids():
            yield ticket_id, self.ticket(ticket_id)

    # --- nodes -----------------------------------------------------------------------------

    def node(self, name: str) -> NodeRecord | None:
        """One node's record, or None if the node has not started."""
        path = self.node_path(name)
        return _load(NodeRecord, path) if path.exists() else None

    def open_node(self, name: str, record: NodeRecord) -> bool:
        """Create the node's record unless it exists; True if this call created it."""
        path = self.node_path(name)
        if path.exists():  # every ticket's task asks; only the first needs the durable create
            return False
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(record.model_dump_json())
                handle.flush()
                os.fsync(handle.fileno())
            os.link(tmp, path)  # atomic create-if-absent, complete from its first moment
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)

    def save_node(self, name: str, record: NodeRecord) -> None:
        """Write one node's record."""
        self.write(self.node_path(name), record.model_dump_json())

    def nodes(self) -> dict[str, NodeRecord]:
        """Every started node's record, by name."""
        folder = self.dir / "nodes"
        names = sorted(os.listdir(folder)) if folder.is_dir() else []
        return {
            n[: -len(".json")]: _load(NodeRecord, folder / n) for n in names if n.endswith(".json")
        }

    # --- the whole run ---------------------------------------------------------------------

    def published(self) -> dict[str, str]:
        """What merge published to out/: ticket id -> one-line summary (empty before merge)."""
        if not self.published_path.exists():
            return {}
        return dict(json.loads(self.published_path.read_bytes()))

    def save_published(self, summaries: dict[str, str]) -> None:
        """Record what merge published, in one file (merge is the only writer)."""
        self.write(self.published_path, json.dumps(summaries, ensure_ascii=False))

    def read(self, tickets: Mapping[str, TicketRecord] | None = None) -> RunRecord:
        """The whole run, assembled from its records (what run-state.json shows).

        A ticket merge published and review has not taken yet shows its out/ file and
        summary from published.json; a caller that holds every record passes `tickets`.
        """
        shown = dict(self.shown(None if tickets is None else tickets.items()))
        return RunRecord(**dict(self.meta()), nodes=self.nodes(), tickets=shown)

    def shown(
        self, tickets: Iterable[tuple[str, TicketRecord]] | None = None
    ) -> Iterator[tuple[str, TicketRecord]]:
        """Each ticket's record as run-state.json shows it, by id: `records()` (or the
        caller's `tickets`), with what merge published and review has not taken yet."""
        published = self.published()
        for ticket_id, ticket in self.records() if tickets is None else tickets:
            _show_published(ticket, ticket_id, published.get(ticket_id))
            yield ticket_id, ticket

    def materialise(self, tickets: Iterable[tuple[str, TicketRecord]] | None = None) -> None:
        """Write run-state.json from the records (`tickets`: every record by id, in order,
        if the caller has them; else each is read, written out and let go in turn).

        The document is `read()`'s, byte for byte: the run without its tickets serialised
        as one, and each ticket's record serialised on its own and indented into its place,
        so no more than one ticket's record is held parsed at a time.
        """
        head = RunRecord(**dict(self.meta()), nodes=self.nodes())
        # Bytes straight from pydantic's serializer: model_dump_json makes a str first (four
        # bytes a character once one is not Latin-1).
        text = RunRecord.__pydantic_serializer__.to_json(head, indent=2)
        if not text.endswith(b'"tickets": ' + _NO_TICKETS):  # its last field
            raise RuntimeError(f"run-state.json no longer ends with its tickets: {text[-40:]!r}")
        entries = self.shown(tickets)

        def pieces() -> Iterator[bytes]:  # written to the file as they come, 64 KB at a time
            block, size, n = [text[: -len(_NO_TICKETS)]], 0, -1
            for n, (ticket_id, ticket) in enumerate(entries):
                one = _TICKET.to_json(ticket, indent=2).replace(b"\n", b"\n    ")
                key = json.dumps(ticket_id).encode()
                block += [b",\n    " if n else b"{\n    ", key, b": ", one]
                size += len(one)
                if size >= 1 << 16:
                    yield b"".join(block)
                    block, size = [], 0
            block.append(_NO_TICKETS if n < 0 else b"\n  }\n}")
            yield b"".join(block)

        self.write(self.state_path, pieces())

    def materialised(self) -> RunRecord:
        """run-state.json as last materialised (one file read, however many tickets)."""
        return _load(RunRecord, self.state_path)

    def materialised_since_meta(self) -> bool:
        """Whether run-state.json was written after run.json last changed (two stats): once
        a run's end has written its verdict, whether the end's own materialisation is done."""
        try:
            return self.state_path.stat().st_mtime_ns >= self.meta_path.stat().st_mtime_ns
        except FileNotFoundError:
            return False


_ROUTES: TypeAdapter[dict[str, Routed]] = TypeAdapter(dict[str, Routed])
_ROUTES_KEPT = 64  # runs whose routes.json a process keeps parsed (a worker serves many)
_routes_read: OrderedDict[Path, tuple[tuple[int, int, int], dict[str, Routed]]] = OrderedDict()
_routes_lock = threading.Lock()
_NO_ROUTES: Mapping[str, Routed] = MappingProxyType({})

_NO_TICKETS = b"{}\n}"  # how a serialised run with no tickets ends
_TICKET = TicketRecord.__pydantic_serializer__


def _show_published(ticket: TicketRecord, ticket_id: str, one_line: str | None) -> None:
    """A ticket merge published (`one_line`: its summary in published.json) that review has
    not taken yet: its out/ file and summary."""
    if one_line is not None and ticket.file is None:
        ticket.file, ticket.one_line = ids.out_name(ticket_id), one_line


def _names(folder: Path, suffix: str) -> set[str]:
    """The stems of `folder`'s files ending in `suffix` (none if there is no folder)."""
    names = os.listdir(folder) if folder.is_dir() else []
    return {n[: -len(suffix)] for n in names if n.endswith(suffix) and not n.startswith(".")}


def _load(model: type[M], path: Path) -> M:
    """A record file parsed as `model`; `RunStateError` if missing or corrupt."""
    return _parse(model, _read(path), path)


def _read(path: Path) -> bytes:
    """A record file's bytes; `RunStateError` if it is missing."""
    try:
        return atomic.read_bytes(path)
    except FileNotFoundError as exc:
        raise RunStateError(f"no run state at {path}") from exc


def _parse(model: type[M], data: bytes, path: Path) -> M:
    """A record file's bytes parsed as `model`; `RunStateError` if corrupt."""
    return _parse_with(model.model_validate_json, data, path)


def _newest_record(data: bytes, path: Path) -> tuple[bytes, TicketRecord]:
    """A record file's newest version (workers/versions.py), its bytes and parsed;
    `RunStateError` if no version in it parses."""

    def parsed(version: bytes) -> tuple[bytes, TicketRecord]:
        return version, TicketRecord.model_validate_json(version)

    return _parse_with(lambda whole: versions.newest(whole, parsed), data, path)


def _parse_with(validate: Callable[[bytes], T], data: bytes, path: Path) -> T:
    """A run file's bytes parsed by `validate`; `RunStateError` if corrupt."""
    try:
        return validate(data)
    except ValidationError as exc:
        if exc.errors()[0]["type"] == "json_invalid":
            error = exc.errors()[0]["msg"]
            raise RunStateError(f"corrupt run state at {path}: not JSON ({error})") from None
        raise RunStateError(f"corrupt run state at {path}: {_first_error(exc)}") from None


def _first_error(exc: ValidationError) -> str:
    """A validation error in one line: where, what, and how many more."""
    errors = exc.errors()
    where = ".".join(map(str, errors[0]["loc"])) or "the file"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {errors[0]['msg']}{more}"


def link_latest(workspace_root: Path, store: RunStore) -> None:
    """Point <workspace>/run-state.json and run.jsonl at this run's files (atomic swap)."""
    for name in (STATE_FILE, TRACE_FILE):
        link = workspace_root / name
        tmp = workspace_root / f".{name}.{secrets.token_hex(4)}.tmp"
        tmp.symlink_to(os.path.relpath(store.dir / name, workspace_root))
        os.replace(tmp, link)


def find(workspace: Workspace, run_id: str) -> RunStore:
    """The store of `run_id` in this workspace; `RunStateError` if there is none (a run id
    that is not a plain name, e.g. `../elsewhere/x`, never becomes a path)."""
    try:
        ids.run(run_id)
    except RunStateError as exc:
        raise UsageError(str(exc)) from None
    store = RunStore(workspace.runs / run_id)
    if not store.meta_path.exists():
        raise UsageError(f"no run {run_id!r} under {workspace.runs} (see `ls runs/`)")
    return store
