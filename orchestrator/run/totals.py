"""What a run paid and how its tickets ended, as run.json keeps it once the run ended
(`RunTotals`, and the budget block's settled figures): `status`, `runs`, the verdict line,
the web view and /metrics all show these numbers for a run that is no longer running.

What was paid comes from the agents' saved states (agents/*.json: every paid turn, saved
before the step goes on), not from the nodes or the records: a run stopped mid-fan-out
ends before the tickets in flight record what they spent, and its per-ticket nodes never
close. The counts come from the records.

A run can end while tickets are still in flight (a cancel, `--timeout`, a lost broker):
`ending.end` writes the end first and counts after, so a step that saves a record later
finds the run ended and counts again (`recount`), as do the `cancel` command once every
worker stopped the run's steps and the waiting `run` once its wait is over.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

from pydantic import BaseModel, ValidationError

from orchestrator.errors import RunStateError
from orchestrator.run import waitlist
from orchestrator.run.records import RunMeta, RunStatus, RunTotals, spent
from orchestrator.run.store import ROUTE_NODE, RunStore
from workers import versions
from workers.usage import RunUsage

log = logging.getLogger(__name__)


class _Paid(BaseModel):
    """The part of an agent's saved state (workers.state.RunState) that says what it paid:
    parsed without its transcript's messages."""

    usage: RunUsage = RunUsage()
    cost_usd: float = 0.0


@dataclass(frozen=True)
class Paid:
    """What a run's agents paid for: model calls, tokens, USD."""

    calls: int = 0
    tokens: int = 0
    cost_usd: float = 0.0


def paid(store: RunStore) -> Paid:
    """Every agent run's paid turns, summed (a file that cannot be read is left out, and
    said in the worker's log)."""
    calls = tokens = 0
    cost = 0.0
    for state in _agents(store):
        calls += state.usage.requests
        tokens += state.usage.total_tokens
        cost += state.cost_usd
    return Paid(calls, tokens, round(cost, 8))


def _agents(store: RunStore) -> Iterator[_Paid]:
    for path in sorted((store.dir / "agents").glob("*.json")):
        try:
            yield versions.read(path, _Paid.model_validate_json)
        except (OSError, ValidationError):  # a torn or foreign file
            log.warning("cannot read %s; what it paid is not counted", path)


def count(store: RunStore, meta: RunMeta) -> None:
    """Set `meta.totals` from the records and the agents' states, and the budget block's
    settled figures to the same; leave both as they were if a record or node cannot be
    read (a damaged folder: the run still ends, and materialising reports the damage)."""
    by_status: dict[str, int] = {}
    used: list[tuple[int, int, float]] = []
    try:
        nodes = store.nodes()
        for _ticket_id, t in store.records():
            by_status[t.status.value] = by_status.get(t.status.value, 0) + 1
            total = t.total()
            used.append((total.calls, total.tokens, total.cost_usd))
    except (OSError, RunStateError):
        return
    # What the nodes and records say is a floor: an agent's file that could not be read.
    figures = spent(
        (n.model_dump() for n in nodes.values()),
        nodes[ROUTE_NODE].model_dump() if ROUTE_NODE in nodes else {},
        used,
    )
    agents = paid(store)
    calls, tokens = max(figures["calls"], agents.calls), max(figures["tokens"], agents.tokens)
    cost = max(figures["cost_usd"], agents.cost_usd)
    meta.totals = RunTotals(
        tickets=len(used), by_status=by_status, calls=calls, tokens=tokens, cost_usd=cost
    )
    agree(meta)


def agree(meta: RunMeta) -> None:
    """Make an ended run's budget block say what its totals say was paid: settled and calls
    as counted, nothing held (a step still running settles or releases its call, and counts
    again). The ledger's own copy misses what settled after it was read, and starts again
    from the folder, with no calls, after Redis lost it; where it knew more (a worker
    killed between a reply's settlement and its save), the totals take its figures: paid
    all the same."""
    if meta.budget is None or meta.totals is None:
        return
    totals, ledger = meta.totals, meta.budget
    settled = max(totals.cost_usd, ledger.settled_usd)
    calls = max(totals.calls, ledger.calls)
    if (settled, calls) != (totals.cost_usd, totals.calls):  # the ledger knew more
        meta.totals = totals.model_copy(update={"cost_usd": settled, "calls": calls})
    left = None if ledger.limit_usd is None else round(max(ledger.limit_usd - settled, 0.0), 9)
    meta.budget = ledger.model_copy(
        update={"settled_usd": settled, "calls": calls, "reserved_usd": 0.0, "remaining_usd": left}
    )


def recount(store: RunStore) -> None:
    """Count an ended run again (a record may have landed after it ended) and show it in
    run-state.json; nothing for a running run. Keeps run.json's time of last update (how
    long the run took) and writes it only if a figure changed. Reads the files as they are
    (not a task's fenced view, which keeps what it read)."""
    store = RunStore(store.dir)
    with store.locked():
        meta = store.meta()
        if meta.status is RunStatus.RUNNING:
            return
        before = (meta.totals, meta.budget)
        count(store, meta)
        if (meta.totals, meta.budget) != before:
            store.write_meta(meta, touch=False)
    waitlist.materialise(store)


def recount_quietly(store: RunStore) -> None:
    """`recount`, for a caller whose own outcome must not change if the run folder cannot be
    written now (the next count, or `resume`, counts it)."""
    try:
        recount(store)
    except (OSError, RunStateError) as exc:
        log.warning("run %s: cannot count its totals again (%s)", store.run_id, exc)
