"""Run records under many concurrent writers (real processes), and the cost of one update."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import threading
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config import cassette
from orchestrator.run import ids
from orchestrator.run import store as store_module
from orchestrator.run.fence import EpochFence
from orchestrator.run.fence import path as fence_path
from orchestrator.run.records import Routed, RunConfig, RunMeta, TicketRecord, TicketStatus
from orchestrator.run.store import RunStore
from orchestrator.steps.context import Context
from orchestrator.steps.draft import draft
from workers import atomic
from workers.settings import HarnessSettings
from workers.trace import now_iso

WRITERS, TICKETS_EACH = 6, 25


def _new_run(root: Path, tickets: list[str], status: TicketStatus) -> RunStore:
    """A run folder with `tickets` records in `status`, as start and route leave it."""
    store = RunStore(root / "run-x")
    store.dir.mkdir(parents=True)
    config = RunConfig(
        categories=["other"],
        pool_size=1,
        max_rounds=3,
        filler_phrases=[],
        model="demo",
        max_turns=6,
        budget_usd=None,
        templates={"other": "Ticket {ticket_id} received."},
    )
    now = now_iso()
    store.write_meta(
        RunMeta(run_id="run-x", started_at=now, updated_at=now, workspace=str(root), config=config)
    )
    record = TicketRecord(source="inbox/x.txt", status=status, category="other")
    atomic.write_many((store.record_path(t), record.model_dump_json()) for t in tickets)
    store.materialise()
    return store


def _writer(run_dir: str, writer: int) -> None:
    store = RunStore(Path(run_dir))
    tracer = store.tracer(node="test", writer=writer)
    for i in range(TICKETS_EACH):
        ticket = f"T-{writer}-{i}"
        record = store.ticket(ticket)
        record.status, record.one_line = TicketStatus.PASS, "x" * 200
        store.save_ticket(ticket, record)
        tracer.emit("gate", ticket=ticket, report="y" * 300)


def test_parallel_writers_lose_no_ticket_and_no_line(tmp_path: Path) -> None:
    tickets = [f"T-{w}-{i}" for w in range(WRITERS) for i in range(TICKETS_EACH)]
    store = _new_run(tmp_path, tickets, TicketStatus.DRAFTED)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(store.dir), w)) for w in range(WRITERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    store.materialise()
    record = store.materialised()
    assert sorted(record.tickets) == sorted(tickets)
    assert {t.status for t in record.tickets.values()} == {TicketStatus.PASS}
    on_disk = json.loads(store.state_path.read_text())
    assert {t["status"] for t in on_disk["tickets"].values()} == {"pass"}
    lines = store.trace_path.read_text().splitlines()
    assert len(lines) == WRITERS * TICKETS_EACH
    parsed = [json.loads(line) for line in lines]
    assert {e["ticket"] for e in parsed} == set(tickets)
    assert not list(store.dir.rglob("*.tmp"))


def _open(run_dir: str, results: multiprocessing.Queue) -> None:
    from orchestrator.run.records import NodeRecord

    results.put(RunStore(Path(run_dir)).open_node("fanout", NodeRecord(started=1.0)))


def test_a_node_is_opened_exactly_once_by_racing_processes(tmp_path: Path) -> None:
    store = _new_run(tmp_path, ["T-1"], TicketStatus.ROUTED)
    ctx = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue = ctx.Queue()
    procs = [ctx.Process(target=_open, args=(str(store.dir), results)) for _ in range(WRITERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    opened = [results.get(timeout=5) for _ in procs]
    assert opened.count(True) == 1
    node = store.node("fanout")
    assert node is not None and node.started == 1.0


def _stamps(folder: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.iterdir()}


def test_a_ticket_step_writes_its_own_record_and_nothing_that_grows(tmp_path: Path) -> None:
    """Drafting one ticket of 2,000 (the template path: no model) leaves run-state.json,
    run.json and every other ticket's record as they were."""
    tickets = [f"T-{i:04d}" for i in range(2000)]
    store = _new_run(tmp_path, tickets, TicketStatus.ROUTED)
    before = _stamps(store.dir / "records")
    state_before = os.stat(store.state_path)
    meta_before = os.stat(store.meta_path)
    drafted = draft(
        Context(store, HarnessSettings(), "draft", "fanout"), "T-0007", store.ticket("T-0007")
    )
    assert drafted.status is TicketStatus.DRAFTED
    assert _stamps(store.dir / "records") == before  # a step computes; its task saves
    store.save_ticket("T-0007", drafted)  # what the task layer does with what it returned
    after = _stamps(store.dir / "records")
    assert {name for name in before if before[name] != after[name]} == {"T-0007.json"}
    assert os.stat(store.state_path).st_mtime_ns == state_before.st_mtime_ns
    assert os.stat(store.meta_path).st_mtime_ns == meta_before.st_mtime_ns
    assert store.ticket("T-0007").status is TicketStatus.DRAFTED
    assert store.draft_path("T-0007").read_text().startswith("Ticket T-0007 received.")


def test_a_held_store_reads_back_its_own_records_and_an_unheld_one_reads_the_files(
    tmp_path: Path,
) -> None:
    """A task's store (fenced: its hold) keeps the records it read or wrote, each read a
    fresh copy; the CLI's (unfenced) reads the files, which workers write meanwhile."""
    store = _new_run(tmp_path, ["T-1", "T-2"], TicketStatus.ROUTED)
    held = store.fenced(EpochFence.take(fence_path(store.dir, "T-1")))
    mine = held.ticket("T-1")
    mine.status = TicketStatus.DRAFTED
    held.save_ticket("T-1", mine)
    # Someone else's write to the file: the holder never sees it (none happens while it
    # holds the ticket), the CLI's store does.
    other = TicketRecord(source="inbox/x.txt", status=TicketStatus.PASS, category="other")
    atomic.write_text(store.record_path("T-1"), other.model_dump_json())
    assert held.ticket("T-1").status is TicketStatus.DRAFTED
    assert store.ticket("T-1").status is TicketStatus.PASS
    # Each read is its own copy: changing one changes no later read.
    held.ticket("T-1").status = TicketStatus.PASS
    assert held.ticket("T-1").status is TicketStatus.DRAFTED
    # A record it read once is kept too; one handed to it is what it reads.
    assert held.ticket("T-2").status is TicketStatus.ROUTED
    atomic.write_text(store.record_path("T-2"), other.model_dump_json())
    assert held.ticket("T-2").status is TicketStatus.ROUTED
    held.keep("T-2", other)
    assert held.ticket("T-2").status is TicketStatus.PASS


def test_a_claimed_record_shows_routes_decision_until_drafting_writes_its_own(
    tmp_path: Path,
) -> None:
    """Route's decisions live in routes.json until drafting takes each ticket: a record
    still `claimed` shows its decision (a rewritten routes.json, as a re-run route writes
    it, is read again in a process that read the first), a record drafting wrote shows its
    own, and one with no decision stays claimed."""
    store = _new_run(tmp_path, ["T-1", "T-2", "T-3"], TicketStatus.CLAIMED)
    assert store.ticket("T-1").status is TicketStatus.CLAIMED  # before route decided
    store.save_routes({i: Routed(category="billing", routing="matched") for i in ("T-1", "T-2")})
    shown = store.ticket("T-1")
    assert (shown.status, shown.category, shown.routing) == (
        TicketStatus.ROUTED,
        "billing",
        "matched",
    )
    store.save_routes(
        {i: Routed(category="bug", routing="clamped", routed_as="oops") for i in ("T-1", "T-2")}
    )
    shown = store.ticket("T-1")
    assert (shown.category, shown.routing, shown.routed_as) == ("bug", "clamped", "oops")
    drafted = store.ticket("T-2")
    drafted.status, drafted.category = TicketStatus.DRAFTED, "other"
    store.save_ticket("T-2", drafted)
    assert (store.ticket("T-2").status, store.ticket("T-2").category) == (
        TicketStatus.DRAFTED,
        "other",
    )
    assert store.ticket("T-3").status is TicketStatus.CLAIMED
    held = store.fenced(EpochFence.take(fence_path(store.dir, "T-1")))  # a task's store
    for _ in range(2):  # read from the file, then from what it keeps
        assert (held.ticket("T-1").status, held.ticket("T-1").category) == (
            TicketStatus.ROUTED,
            "bug",
        )
    store.materialise()
    doc = json.loads(store.state_path.read_text())
    assert {i: t["status"] for i, t in doc["tickets"].items()} == {
        "T-1": "routed",
        "T-2": "drafted",
        "T-3": "claimed",
    }


def test_threads_reading_the_decisions_of_more_runs_than_a_process_keeps_all_see_them(
    tmp_path: Path,
) -> None:
    """A worker's threads (and the web view's) share the routes.json a process keeps
    parsed: reading more runs than it keeps, from many threads at once, every read shows
    its run's decision and the process keeps no more than its limit."""
    runs = []
    for k in range(store_module._ROUTES_KEPT + 8):
        store = _new_run(tmp_path / f"w{k}", ["T-1"], TicketStatus.CLAIMED)
        store.save_routes({"T-1": Routed(category=f"c{k}", routing="matched")})
        runs.append((store.dir, f"c{k}"))
    seen: list[tuple[str, str]] = []

    def reader(offset: int) -> None:
        for i in range(3 * len(runs)):
            run_dir, category = runs[(i * 7 + offset) % len(runs)]
            seen.append((RunStore(run_dir).ticket("T-1").category or "", category))

    threads = [threading.Thread(target=reader, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(seen) == 8 * 3 * len(runs)
    assert all(shown == decided for shown, decided in seen)
    assert len(store_module._routes_read) <= store_module._ROUTES_KEPT


def test_threads_that_start_together_parse_routes_json_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fan-out starts hundreds of threads at once, each reading its ticket: one of them
    parses the run's routes.json, the others wait for it (in section h, each parsing a
    700 KB file kept 433 of 512 requests from starting in the first two seconds)."""
    tickets = [f"T-{k}" for k in range(5_000)]
    store = _new_run(tmp_path, tickets[:1], TicketStatus.CLAIMED)
    store.save_routes({t: Routed(category="billing", routing="matched") for t in tickets})
    parsed: list[int] = []
    real = store_module._parse_with

    def counted(validate: Any, data: bytes, path: Path) -> Any:
        parsed.append(len(data))
        return real(validate, data, path)

    monkeypatch.setattr(store_module, "_parse_with", counted)
    start = threading.Barrier(32)
    shown: list[str | None] = []

    def reader() -> None:
        start.wait()
        shown.append(RunStore(store.dir).ticket("T-0").category)

    threads = [threading.Thread(target=reader) for _ in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert shown == ["billing"] * 32
    routes_size = store.routes_path.stat().st_size
    assert parsed.count(routes_size) == 1


def test_run_state_json_reads_as_before_with_any_script_in_it(tmp_path: Path) -> None:
    """materialise writes pydantic's bytes, a ticket at a time: the file is byte for byte
    the indented JSON `model_dump_json` gives of the whole run (`read`), text in any script
    intact, what merge published shown, with no tickets and with enough to span blocks."""
    store = _new_run(tmp_path, [], TicketStatus.PASS)
    assert store.state_path.read_bytes() == _whole(store)
    assert json.loads(store.state_path.read_bytes())["tickets"] == {}
    tickets = [f"T-{i}" for i in range(300)]  # ~1 KB each: past several 64 KB blocks
    store = _new_run(tmp_path / "many", tickets, TicketStatus.DRAFTED)
    record = store.ticket("T-2")
    record.one_line, record.subject = "Ticket T-2: refund…", 'คืนเงิน 返金 €\n"x"'
    store.save_ticket("T-2", record)
    store.save_published({"T-3": "Ticket T-3: publi…"})
    store.materialise()
    text = store.state_path.read_bytes()
    assert text == _whole(store)
    assert len(text) > 3 * (1 << 16)
    on_disk = json.loads(text)
    assert on_disk["tickets"]["T-2"]["subject"] == 'คืนเงิน 返金 €\n"x"'
    assert on_disk["tickets"]["T-3"]["file"] == "out/T-3.txt"
    assert list(on_disk["tickets"]) == sorted(tickets)
    store.materialise(store.tickets().items())  # a caller that has every record: the same
    assert store.state_path.read_bytes() == text
    atomic.write_text(tmp_path / "raw.bin", "é€".encode())
    assert (tmp_path / "raw.bin").read_bytes() == "é€".encode()


def _whole(store: RunStore) -> bytes:
    """The whole run serialised as one document, as run-state.json was written before."""
    return store.read().model_dump_json(indent=2).encode()


def test_materialising_holds_one_record_at_a_time_not_all_of_them(tmp_path: Path) -> None:
    """Writing run-state.json from 2,000 records peaks (tracemalloc) at a small part of what
    holding them all parsed costs, measured in the same process: the whole-run steps of a
    10,000-ticket run no longer grow a worker by the size of every record."""
    store = _new_run(tmp_path, [f"T-{i}" for i in range(2000)], TicketStatus.PASS)
    tracemalloc.start()
    try:
        held = store.tickets()
        all_parsed = tracemalloc.get_traced_memory()[0]
        del held
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        store.materialise()
        streamed = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    # Measured: 0.4 MB (2.3 when the interpreter's table of interned names grows meanwhile)
    # against 10.9 MB held; writing the whole run as one document peaked at 12.6 MB.
    assert streamed * 3 < all_parsed, (streamed, all_parsed)
    assert len(json.loads(store.state_path.read_bytes())["tickets"]) == 2000


def test_a_write_in_pieces_that_fails_leaves_the_old_file(tmp_path: Path) -> None:
    """Content written in pieces is still atomic: a producer that fails half way leaves
    the old file whole and no temp file behind."""
    target = tmp_path / "state.json"
    atomic.write_text(target, "old")

    def pieces() -> Iterator[bytes]:
        yield b"new, first half"
        raise RuntimeError("the producer failed")

    with pytest.raises(RuntimeError, match="producer failed"):
        atomic.write_text(target, pieces())
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["state.json"]
    atomic.write_text(target, iter([b"new, ", b"and whole"]))
    assert target.read_text() == "new, and whole"


def test_an_error_of_the_producer_is_its_own_not_the_files_it_writes(tmp_path: Path) -> None:
    """Content made as it is written (run-state.json from each record in turn): a record the
    producer cannot read is the error raised, naming that record, not the file being written
    (which would say the run folder is unwritable); the old file stays whole."""
    target, record = tmp_path / "run-state.json", tmp_path / "records" / "T-2.json"
    atomic.write_text(target, "old")

    def pieces() -> Iterator[bytes]:
        yield b"{"
        raise PermissionError(errno.EACCES, "Permission denied", str(record))  # as open() does

    with pytest.raises(PermissionError) as raised:
        atomic.write_text(target, pieces())
    assert raised.value.filename == str(record)
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["run-state.json"]


def test_an_agent_state_names_its_ticket_whole_when_the_id_has_dots(tmp_path: Path) -> None:
    """Ticket ids may hold dots (`T.1`): the budget meter and a cassette miss take the owner
    of `agents/<owner>.<step>.json` up to the step, not up to the first dot."""
    store = _new_run(tmp_path, ["T.1"], TicketStatus.ROUTED)
    for step in ("draft", "review-2", "draft-warm"):
        assert ids.agent_of(store.agent_path("T.1", step)) == ("T.1", step)
    said = cassette.miss_sentence(
        "the cassette x.json holds no reply", store.agent_path("T.1", "review-2")
    )
    assert said == "ticket T.1, step review-2: the cassette x.json holds no reply"
