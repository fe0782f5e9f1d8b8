"""The plan of a run: one table of steps, one row each. The whole flow is here:

    route ──▶ draft(ticket) × N, ≤ pool_size in flight ──▶ merge
          ──▶ review(ticket) × N, ≤ pool_size in flight ──▶ report

Everything else comes from this table: the Celery task of each step (plan/tasks.py), what a
submission sends first and so where `resume` takes a run up again, the steps a retried
ticket goes back through, the progress view's nodes and the report's order. A new step is
one row and one function (steps/<name>.py); the function is plain code over a `Context`:

- a whole-run step, `run(ctx)`, is the only writer of every record while it runs; it returns
  the tickets the per-ticket step after it takes (or, the last step, the run's exit code);
- a per-ticket step, `run(ctx, ticket_id)`, runs as one task per ticket that has the status
  it `takes`, at most pool_size at a time, and returns the ticket's new status; the step
  after it starts when the last ticket is done.

A step has one name (its task `orchestrator.<name>`, its Redis keys, its agents' state files);
`label` is the seed's name for its node where that differs (the draft step's node is `fanout`
in run-state.json, the trace and the report, as in the seed). What else a step needs
elsewhere is a column of its row: whether a run may stop after it (`--stop-after`), its
progress line, whether its node counts gate rounds and is a row of the report; what a ticket's
step spent is kept on the ticket's record under the step's name (TicketRecord.spend). The
floors below the plan know the default steps by their outline (run/outline.py), and every
reader of a run by the nodes its config lists: nothing else names a step.

The order of the rows is the order of the run; the statuses a step `leaves` its tickets in
are each taken by a later step, or are a verdict.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.plan import progress
from orchestrator.run import outline
from orchestrator.run.outline import Outline, Scope
from orchestrator.run.records import NodeRecord, RunRecord, TicketStatus
from orchestrator.steps.draft import draft
from orchestrator.steps.merge import merge
from orchestrator.steps.report import report
from orchestrator.steps.review import review
from orchestrator.steps.route import route

__all__ = ["PLAN", "Plan", "Scope", "Step"]

# A ticket in one of these has its verdict (or waits for a person): no later step must take it.
VERDICTS = frozenset({TicketStatus.PASS, TicketStatus.NEEDS_HUMAN, TicketStatus.AWAITING_APPROVAL})
ProgressLine = Callable[[RunRecord, str], str]


@dataclass(frozen=True)
class Step:
    """One row of the plan."""

    name: str
    scope: Scope
    run: Callable[..., Any]
    takes: TicketStatus | None = None  # per-ticket: the status of the tickets it takes
    leaves: tuple[TicketStatus, ...] = ()  # the statuses its tickets have after it
    label: str | None = None  # the seed's name for its node, where it differs
    stop_point: bool = False  # a run may be asked to stop after it (--stop-after, STOP_AFTER)
    rounds: bool = False  # its node counts its tickets' gate rounds (the seed's table)
    reported: bool = True  # its node is a row of the report's table
    # Its line once its node is done (`run` in line mode); None: it prints none.
    progress: ProgressLine | None = progress.spent

    @classmethod
    def of(cls, known: Outline, run: Callable[..., Any], **columns: Any) -> Step:
        """The row of a step the floors below the plan know by its outline."""
        shared = {"label", "stop_point", "rounds", "reported"}
        return cls(
            known.name, known.scope, run, **{f: getattr(known, f) for f in shared}, **columns
        )

    @property
    def node(self) -> str:
        """The node this step records: nodes/<node>.json, `node` in the trace, the report."""
        return self.label or self.name

    @property
    def task(self) -> str:
        """The Celery task that runs the step."""
        return f"orchestrator.{self.name}"

    @property
    def per_ticket(self) -> bool:
        """True for a step that runs once per ticket."""
        return self.scope is Scope.TICKET

    def progress_line(self, record: RunRecord) -> str | None:
        """`[node] …` once its node is done in `record` (None before, or if it prints none)."""
        if self.progress is None or not record.done(self.node):
            return None
        return f"[{self.node}] {self.progress(record, self.node)}"


@dataclass(frozen=True)
class Plan:
    """The steps of a run, in order, from the first to the one that ends it."""

    steps: tuple[Step, ...]

    def __post_init__(self) -> None:
        names = [s.name for s in self.steps]
        if len(set(names)) != len(names):
            raise ValueError(f"two steps share a name: {names}")
        if self.steps[0].per_ticket:
            raise ValueError("the plan must start with a whole-run step")
        if self.steps[-1].per_ticket:
            raise ValueError("the plan must end with a whole-run step")
        for at, step in enumerate(self.steps):
            later = {s.takes for s in self.steps[at + 1 :] if s.per_ticket}
            for status in (s for s in step.leaves if s not in VERDICTS and s not in later):
                if at + 1 == len(self.steps):
                    raise ValueError(
                        f"the plan must end with a step after which every ticket has its "
                        f"verdict: {step.name} leaves tickets {status.value}"
                    )
                raise ValueError(
                    f"step {step.name} is followed by {self.steps[at + 1].name}, and no step "
                    f"after it takes the tickets it leaves {status.value}"
                )

    def __iter__(self) -> Iterator[Step]:
        return iter(self.steps)

    def __getitem__(self, name: str) -> Step:
        return next(s for s in self.steps if s.name == name)

    def after(self, step: Step) -> Step | None:
        """The step that follows `step` (None: the run ends with it)."""
        at = self.steps.index(step) + 1
        return self.steps[at] if at < len(self.steps) else None

    def before(self, step: Step) -> Step | None:
        """The step `step` follows (None: it is the first)."""
        at = self.steps.index(step)
        return self.steps[at - 1] if at > 0 else None

    def from_step(self, step: Step) -> tuple[Step, ...]:
        """`step` and every step after it: what runs again for a ticket taken up there."""
        return self.steps[self.steps.index(step) :]

    def first_unfinished(self, nodes: Mapping[str, NodeRecord]) -> Step | None:
        """Where the run stands: the first step whose node has not finished (None: all)."""
        return next((s for s in self.steps if s.node not in nodes or not nodes[s.node].done), None)

    def stopped_in(self, name: str | None, drafted: bool) -> Step:
        """The step a ticket is taken up again by: the one it stopped in (records from
        before that was kept: review if it had a draft, else draft)."""
        if name is not None and any(s.name == name for s in self.steps):
            return self[name]
        return self[outline.REVIEW.name if drafted else outline.DRAFT.name]

    @property
    def nodes(self) -> tuple[str, ...]:
        """Every step's node, in order (the progress view)."""
        return tuple(s.node for s in self.steps)

    @property
    def reported_nodes(self) -> list[str]:
        """The nodes the report's table lists, in order."""
        return [s.node for s in self.steps if s.reported]

    @property
    def stop_points(self) -> tuple[str, ...]:
        """The steps a run may be asked to stop after."""
        return tuple(s.name for s in self.steps if s.stop_point)

    def progress_lines(self, record: RunRecord) -> list[str]:
        """One line per finished node, as in the seed."""
        return [line for s in self.steps if (line := s.progress_line(record)) is not None]

    def with_step(self, step: Step, after: str) -> Plan:
        """This plan with `step` inserted after the step named `after`."""
        steps = list(self.steps)
        steps.insert(steps.index(self[after]) + 1, step)
        return Plan(tuple(steps))


PLAN = Plan(
    (
        Step.of(outline.ROUTE, route, leaves=(TicketStatus.ROUTED,), progress=progress.routed),
        Step.of(
            outline.DRAFT,
            draft,
            takes=TicketStatus.ROUTED,
            leaves=(TicketStatus.DRAFTED,),
            progress=progress.drafted,
        ),
        Step.of(outline.MERGE, merge, leaves=(TicketStatus.DRAFTED,), progress=progress.merged),
        Step.of(
            outline.REVIEW,
            review,
            takes=TicketStatus.DRAFTED,
            leaves=(TicketStatus.PASS, TicketStatus.NEEDS_HUMAN),
            progress=progress.reviewed,
        ),
        Step.of(outline.REPORT, report, progress=None),
    )
)
