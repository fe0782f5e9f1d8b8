"""run-state.json and run.jsonl under many concurrent writers (real processes)."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

from orchestrator.runstate import RunConfig, RunRecord, RunStore, TicketRecord, TicketStatus
from workers.trace import now_iso

WRITERS, TICKETS_EACH = 6, 25


def _record(tickets: list[str]) -> RunRecord:
    config = RunConfig(
        categories=["other"],
        pool_size=1,
        max_rounds=3,
        filler_phrases=[],
        model="demo",
        max_turns=6,
        budget_usd=None,
    )
    now = now_iso()
    return RunRecord(
        run_id="run-x",
        started_at=now,
        updated_at=now,
        workspace="/w",
        config=config,
        tickets={t: TicketRecord(source=f"/w/inbox/{t}.txt") for t in tickets},
    )


def _writer(run_dir: str, writer: int) -> None:
    store = RunStore(Path(run_dir))
    tracer = store.tracer(node="test", writer=writer)
    for i in range(TICKETS_EACH):
        ticket = f"T-{writer}-{i}"
        with store.update() as record:
            record.tickets[ticket].status = TicketStatus.PASS
            record.tickets[ticket].one_line = "x" * 200  # make each write non-trivial
        tracer.emit("gate", ticket=ticket, report="y" * 300)


def test_parallel_writers_lose_no_ticket_and_no_line(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "run-x")
    tickets = [f"T-{w}-{i}" for w in range(WRITERS) for i in range(TICKETS_EACH)]
    store.dir.mkdir()
    store.write(_record(tickets))
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(store.dir), w)) for w in range(WRITERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    record = store.read()
    assert {t.status for t in record.tickets.values()} == {TicketStatus.PASS}
    lines = store.trace_path.read_text().splitlines()
    assert len(lines) == WRITERS * TICKETS_EACH
    parsed = [json.loads(line) for line in lines]
    assert {e["ticket"] for e in parsed} == set(tickets)
    assert not list(store.dir.glob("*.tmp")) and not list(store.dir.glob(".*.tmp"))
