"""The records of a run: what run-state.json holds, and the pieces it is materialised from.

A run is kept as small records, each with one writer at a time, so the cost of an update does
not grow with the number of tickets:

    runs/<run_id>/run.json              RunMeta: config, status, exit code (rare writers)
    runs/<run_id>/nodes/<node>.json     NodeRecord: the node's opener, then its closer
    runs/<run_id>/records/<ticket>.json TicketRecord: the task that holds the ticket
    runs/<run_id>/routes.json           Routed by ticket: route (shown in claimed records)
    runs/<run_id>/run-state.json        RunRecord: all of the above, materialised

`RunRecord` keeps the fields run-state.json has always had, so readers of that file see no
change.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.run.outline import REPORTED_NODES
from workers.pricing import PriceTable

# How the gate joins one round's problems into one report (gate_reports, a trace's `gate`).
REPORT_SEPARATOR = " | "


class TicketStatus(StrEnum):
    """Where a ticket is in the graph."""

    CLAIMED = "claimed"
    ROUTED = "routed"
    DRAFTED = "drafted"
    PASS = "pass"
    NEEDS_HUMAN = "needs_human"
    AWAITING_APPROVAL = "awaiting_approval"  # a tool call of its worker waits for a person


class RunStatus(StrEnum):
    """Where the graph run as a whole is (run.json's `status`; an agent run's is the
    harness's AgentStatus, workers/state.py)."""

    RUNNING = "running"
    STOPPED = "stopped_early"
    DONE = "done"
    CRASHED = "crashed"


class NodeStatus(StrEnum):
    """Where one node of the graph is (run-state.json's nodes.<node>.status)."""

    RUNNING = "running"
    OK = "ok"


class NodeRecord(BaseModel):
    """Time, model calls and tokens of one node (per the seed's summary table)."""

    ms: int = 0
    calls: int = 0
    tokens: int = 0
    status: NodeStatus = NodeStatus.RUNNING
    rounds: int | None = None
    started: float | None = None  # epoch seconds, so any machine can close the node
    error: str | None = None
    cost_usd: float = 0.0
    estimated: int = 0  # replies whose usage the server left out (counted by us)
    waited: int = 0  # requests that waited for the endpoint's cap (coordination/ratecap.py)

    @property
    def done(self) -> bool:
        """True once the node has been closed."""
        return self.status is NodeStatus.OK

    def close(
        self, calls: int = 0, tokens: int = 0, rounds: int | None = None, usage: Any = None
    ) -> None:
        """Close the node with its totals; its time runs from its start to now."""
        self.ms = round((time.time() - (self.started or time.time())) * 1000)
        self.calls, self.tokens, self.rounds, self.status = calls, tokens, rounds, NodeStatus.OK
        if usage is not None:
            self.cost_usd, self.estimated = usage.cost_usd, usage.estimated
            self.waited = usage.waited


class StepUsage(BaseModel):
    """What one ticket's step (drafting or review) spent."""

    calls: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    estimated: int = 0  # replies whose usage the server left out (counted by us)
    waited: int = 0  # requests that waited for the endpoint's cap

    def __add__(self, other: StepUsage) -> StepUsage:
        return StepUsage(
            calls=self.calls + other.calls,
            tokens=self.tokens + other.tokens,
            cost_usd=self.cost_usd + other.cost_usd,
            estimated=self.estimated + other.estimated,
            waited=self.waited + other.waited,
        )


CANCELLED = "cancelled"  # how every cancel's reason starts, and the stop of a cancelled ticket


# Stop reasons of a ticket whose worker gave no answer (as opposed to a gate verdict).
FAILED_STOPS = frozenset(
    {"worker_failed", "time_limit", "max_turns", "budget", "declarations_differ", CANCELLED}
)


class WaitingCall(BaseModel):
    """A tool call of a ticket's worker that waits for a person (approvals/ has the request,
    decisions/ the decision once made)."""

    call_id: str
    tool: str
    args: dict[str, Any] = {}
    args_hash: str
    asked_at: str = ""


class Cancel(BaseModel):
    """Who cancelled a run (or one ticket of it), when and why (run/cancels.py)."""

    run_id: str
    ticket: str | None = None
    by: str
    at: str
    reason: str = ""

    @property
    def why(self) -> str:
        """The reason agents stop with: `cancelled by <who>[: <reason>]`."""
        return f"{CANCELLED} by {self.by}" + (f": {self.reason}" if self.reason else "")


class Routed(BaseModel, frozen=True):
    """Route's decision for a ticket it passed on to drafting (routes.json): the record still
    reads `claimed` on disk until drafting takes the ticket and writes it (RunStore.ticket).
    Frozen: a process keeps the decisions it read and shares them between threads."""

    category: str
    routing: str  # matched or clamped
    routed_as: str | None = None  # the router's own label when it was clamped

    def shown(self) -> dict[str, Any]:
        """The fields a record drafting has not written yet shows: the decision, `routed`."""
        return self.model_dump() | {"status": TicketStatus.ROUTED}

    def show_in(self, ticket: TicketRecord) -> None:
        """Show the decision in a record that drafting has not written yet."""
        for name, value in self.shown().items():
            setattr(ticket, name, value)


class Candidate(BaseModel):
    """One angle's draft in a vote (steps/voting.py): how long it is, what the gate said of
    it, and what it cost."""

    angle: str
    chars: int | None = None  # None: the angle gave no draft
    passed: bool = False
    report: str = ""  # the gate's report ("" when it passed), or why there was no draft
    usage: StepUsage = StepUsage()


class Vote(BaseModel):
    """Which angle's draft a ticket went on with, and why: code chose, never a model."""

    angle: str
    why: str
    candidates: list[Candidate] = []


class TicketRecord(BaseModel):
    """One ticket's record: the seed's fields plus where it came from and what it cost."""

    category: str | None = None
    routing: str | None = None  # how the category was decided: matched, clamped, missing
    routed_as: str | None = None  # the router's own label when it was clamped
    handler: str | None = None
    file: str | None = None
    one_line: str | None = None
    summary: str | None = None  # the reply's first sentence, up to 100 characters (report)
    gate_rounds: int = 0
    gate_reports: list[str] = []
    stop: str | None = None
    status: TicketStatus = TicketStatus.CLAIMED
    source: str
    format: str | None = None  # txt, md, json or eml
    encoding: str | None = None  # as the file was decoded
    subject: str | None = None  # a .json or .eml ticket's subject line
    sender: str | None = None  # and who sent it
    error: str | None = None
    retryable: bool = False  # its failure may pass on a retry (provider down, a crash)
    # The step it stopped in (it failed, or waits for a person): where `resume` takes it up.
    stopped_in: str | None = None
    waiting: WaitingCall | None = None  # the call that waits for a person's decision
    # Write tool calls interrupted by a crash before their result: maybe done, never redone.
    unsure_writes: list[str] = []
    # What each step paid for it: a step with a field of its own name keeps it there (draft
    # and review, as run-state.json has shown them since the seed), any other in `spent`.
    draft: StepUsage = StepUsage()  # with angles: every angle's draft
    review: StepUsage = StepUsage()
    spent: dict[str, StepUsage] = {}  # what any other step paid for it, by step
    vote: Vote | None = None  # its worker's angles, and the one whose draft won

    def spent_in(self, step: str) -> StepUsage:
        """What `step` paid for this ticket."""
        if step in _OWN_SPEND:
            return getattr(self, step)  # type: ignore[no-any-return]
        return self.spent.get(step, StepUsage())

    def total(self) -> StepUsage:
        """What every step paid for this ticket (its cost): `ticket_spend` of its JSON, from
        its fields (no dump), added up in the same order."""
        steps = [*(getattr(self, name) for name in _OWN_SPEND), *self.spent.values()]
        return _summed((s.calls, s.tokens, s.cost_usd, s.estimated, s.waited) for s in steps)

    def spend(self, step: str, usage: StepUsage) -> None:
        """Add what `step` paid for this ticket."""
        total = self.spent_in(step) + usage
        if step in _OWN_SPEND:
            setattr(self, step, total)
        else:
            self.spent[step] = total


# The steps whose spend a ticket's record keeps in a field of their own (see TicketRecord).
# Sorted: every sum of a ticket's spend adds its steps in this order, then `spent`'s.
_OWN_SPEND = tuple(
    sorted(name for name, f in TicketRecord.model_fields.items() if f.annotation is StepUsage)
)


def ticket_spend(record: Mapping[str, Any]) -> StepUsage:
    """What every step paid for a ticket (its cost), from its record as JSON data: the one
    sum that the report, the web view and the run's totals show."""
    spends = [
        *(record.get(name) for name in _OWN_SPEND),
        *(record.get("spent") or {}).values(),
    ]
    return _summed(_figures(used) for used in spends if used)


_Figures = tuple[int, int, float, int, int]  # calls, tokens, cost_usd, estimated, waited


def _figures(used: Any) -> _Figures:
    """One step's spend as JSON data, as its numbers. A mapping of plain numbers is read as
    it is (a model made and checked for each step's spend was half of a live 10,000-ticket
    page's first view); anything else is checked by StepUsage, as every spend once was, so
    what it refuses is refused the same way (ValueError)."""
    if type(used) is dict:
        get = used.get
        calls, tokens, cost = get("calls", 0), get("tokens", 0), get("cost_usd", 0.0)
        estimated, waited = get("estimated", 0), get("waited", 0)
        if (
            type(calls) is int
            and type(tokens) is int
            and type(cost) in (float, int)
            and type(estimated) is int
            and type(waited) is int
        ):
            return calls, tokens, float(cost), estimated, waited
    checked = StepUsage.model_validate(used)
    return checked.calls, checked.tokens, checked.cost_usd, checked.estimated, checked.waited


def _summed(spends: Iterable[_Figures]) -> StepUsage:
    """Spends added up, one after another (`sum` of floats compensates from Python 3.12:
    the record's total and its JSON's must not differ in the last bits)."""
    calls = tokens = estimated = waited = 0
    cost = 0.0
    for step_calls, step_tokens, step_cost, step_estimated, step_waited in spends:
        calls += step_calls
        tokens += step_tokens
        cost += step_cost
        estimated += step_estimated
        waited += step_waited
    return StepUsage(calls=calls, tokens=tokens, cost_usd=cost, estimated=estimated, waited=waited)


class RoleSettings(BaseModel):
    """A role's own settings (the router's, a worker's) where they differ from [harness]."""

    # Per agent run (stored as `budget_usd`); the graph run's is `run_budget_usd`.
    model_config = ConfigDict(
        validate_by_name=True, validate_by_alias=True, serialize_by_alias=True
    )

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    max_turns: int | None = None
    agent_budget_usd: float | None = Field(default=None, alias="budget_usd", title="Budget Usd")
    prompt: str | None = None  # the system prompt's text, read from its prompt_file


class WorkerSpec(RoleSettings):
    """One category's worker as the run fixed it, so every machine drafts with exactly it."""

    description: str = ""
    prompt: str = ""  # the system prompt's text (with angles: the first angle's)
    # Angle name -> its system prompt's text, in the order declared (steps/voting.py);
    # empty: the worker drafts once, with `prompt`.
    angles: dict[str, str] = {}
    tools: list[str] = []
    reads: list[str] = []
    approval: dict[str, str] = {}

    def prompt_of(self, angle: str | None) -> str:
        """The system prompt of `angle`, or the worker's own (None)."""
        return self.prompt if angle is None else self.angles[angle]


class RunConfig(BaseModel):
    """The run's effective configuration, fixed at submit time so every worker agrees."""

    # `agent_budget_usd` is per agent run (stored as `budget_usd`), `run_budget_usd` per graph run.
    model_config = ConfigDict(
        validate_by_name=True, validate_by_alias=True, serialize_by_alias=True
    )

    categories: list[str]
    pool_size: int
    max_rounds: int
    filler_phrases: list[str]
    # Request settings: the workers', and the router's where they differ.
    max_tokens: int | None = None
    temperature: float | None = None
    token_param: str = "max_tokens"
    router_model: str | None = None
    router_max_tokens: int | None = None
    router_temperature: float | None = None
    router_context_tokens: int = 8192  # the router's batches fit this window (steps/batches.py)
    router_batch_tickets: int | None = None  # and hold at most this many tickets
    tool_call_text_fallback: bool = True
    evaluator: bool = False
    evaluator_model: str | None = None
    evaluator_max_tokens: int | None = 200
    evaluator_temperature: float | None = 0.0
    evaluator_budget_usd: float | None = 0.01
    prices: PriceTable | None = None  # None: the worker's LLM_PRICES (runs from before)
    gate_off: list[str] = []
    min_chars: int = 40
    max_chars: int = 4000
    model: str
    max_turns: int
    agent_budget_usd: float | None = Field(alias="budget_usd", title="Budget Usd")
    # What the whole run, and one ticket, may spend across every worker (coordination/budget.py).
    run_budget_usd: float | None = None
    ticket_budget_usd: float | None = None
    stop_after: str | None = None
    route_chars: int = 2000
    # The router's own settings ([harness.router]) where they differ from [harness].
    roles: dict[str, RoleSettings] = {}
    # category -> its worker as the run fixed it (prompt text, tools, reads, caps).
    workers: dict[str, WorkerSpec] = {}
    # category without a worker -> its template's text.
    templates: dict[str, str] = {}
    checks: list[str] = []  # the team's own gate checks, by import path
    approval_expire_h: float = 72  # a call undecided this long ends needs_human
    audit_share: float = 0.0  # of the passes, sampled for a person to audit (people/audit.py)
    # A hash of the workers, templates and checks and of the modules they come from: a
    # worker process whose own differs refuses the run's tasks (config/declarations.py).
    fingerprint: str = ""
    scripted: bool = False  # the run is served by the workspace's scripted provider
    # The nodes of the run's plan that its report lists, in order (the plan's table; a run
    # recorded before runs kept theirs ran the default plan).
    nodes: list[str] = list(REPORTED_NODES)


class BudgetTotals(BaseModel):
    """A run's budget ledger (coordination/budget.py) as `status`, `runs`, the report and
    --json show it (`budget`), copied into run.json at the end of each step and of the run."""

    limit_usd: float | None  # None: the run has no budget
    reserved_usd: float
    settled_usd: float
    remaining_usd: float | None
    calls: int = 0  # settled calls
    estimated: int = 0  # of them, settled from our own count (the reply had no usage)
    refused: int = 0  # calls not started for want of budget
    expired: int = 0  # holds whose holder died, returned by their lease
    spent: bool = False  # a call was refused for the run's limit: no further call starts
    calls_waited: int = 0  # requests that waited for the endpoint's cap (coordination/ratecap.py)


class RejectedFile(BaseModel):
    """A file claimed from inbox/ that is not a ticket, and where it went."""

    name: str
    kind: str
    reason: str
    file: str  # relative to the workspace: quarantine/<run_id>/<name>


class RunTotals(BaseModel):
    """A run's counts as it ended (run/totals.py: calls, tokens and USD from what its agents
    paid), kept in run.json so a list of runs (`ticketgraph web`, /metrics) reads one small
    file per run, not every ticket's record."""

    tickets: int
    by_status: dict[str, int]  # ticket status -> how many
    calls: int  # model calls, all nodes
    tokens: int
    cost_usd: float


def spent(
    nodes: Iterable[Mapping[str, Any]],
    route: Mapping[str, Any],
    tickets: Iterable[tuple[int, int, float]],
) -> dict[str, Any]:
    """A run's calls, tokens and cost (`calls`, `tokens`, `cost_usd`): its nodes' totals, or,
    while (or because) its per-ticket nodes are open — they add theirs when they close — the
    router's plus what each ticket's record says it spent (calls, tokens, cost), whichever is
    more. A live run's figures (`status`, the web view), and the floor of an ended run's."""
    nodes = list(nodes)
    totals = {f: sum(n.get(f, 0) for n in nodes) for f in ("calls", "tokens", "cost_usd")}
    by_ticket = {f: route.get(f, 0) for f in totals}
    for calls, tokens, cost in tickets:
        by_ticket["calls"] += calls
        by_ticket["tokens"] += tokens
        by_ticket["cost_usd"] += cost
    figures = {f: max(totals[f], by_ticket[f]) for f in totals}
    figures["cost_usd"] = round(figures["cost_usd"], 8)
    return figures


class RunMeta(BaseModel):
    """run.json: the run as a whole, without its nodes and tickets."""

    version: int = 2
    run_id: str
    started_at: str
    updated_at: str
    workspace: str
    status: RunStatus = RunStatus.RUNNING
    exit_code: int | None = None
    error: str | None = None
    config: RunConfig
    rejected: list[RejectedFile] = []
    cancel: Cancel | None = None  # who cancelled the run, if someone did (resume lifts it)
    budget: BudgetTotals | None = None  # the run's budget ledger as last copied
    totals: RunTotals | None = None  # set when the run ends, cleared when it is resumed

    def end(self, status: RunStatus, exit_code: int | None, error: str | None = None) -> None:
        """Set where the run ended and the exit code cron will see (run/ending.py ends a
        run; a claim that has not finished reads crashed until it does)."""
        self.status, self.exit_code, self.error = status, exit_code, error

    def reopen(self) -> None:
        """Set the run running again (a claim finished, or `resume`): no exit code, no
        error, and no totals (they are counted again when it ends)."""
        self.status, self.exit_code, self.error, self.totals = RunStatus.RUNNING, None, None, None


class RunRecord(RunMeta):
    """The whole run-state.json: the run, its nodes and its tickets."""

    nodes: dict[str, NodeRecord] = {}
    tickets: dict[str, TicketRecord] = {}

    def done(self, node: str) -> bool:
        """True once `node` has finished."""
        return node in self.nodes and self.nodes[node].done
