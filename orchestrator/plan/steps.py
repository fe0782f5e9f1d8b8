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
in run-state.json, the trace and the report, as in the seed).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from orchestrator.run.records import NodeRecord, TicketStatus
from orchestrator.steps.draft import draft
from orchestrator.steps.merge import merge
from orchestrator.steps.report import report
from orchestrator.steps.review import review
from orchestrator.steps.route import route


class Scope(StrEnum):
    """Whether a step runs once per run or once per ticket."""

    RUN = "run"
    TICKET = "ticket"


@dataclass(frozen=True)
class Step:
    """One row of the plan."""

    name: str
    scope: Scope
    run: Callable[..., Any]
    takes: TicketStatus | None = None  # per-ticket: the status of the tickets it takes
    leaves: tuple[TicketStatus, ...] = ()  # the statuses its tickets have after it
    then: str | None = None  # the step that follows (None: the run ends with this one)
    label: str | None = None  # the seed's name for its node, where it differs
    rounds: bool = False  # its node counts its tickets' gate rounds (the seed's table)
    reported: bool = True  # its node is a row of the report's table

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


@dataclass(frozen=True)
class Plan:
    """The steps of a run, in order, from the first to the one that ends it."""

    steps: tuple[Step, ...]

    def __post_init__(self) -> None:
        names = [s.name for s in self.steps]
        for step, after in zip(self.steps, self.steps[1:], strict=False):
            if step.then != after.name:
                raise ValueError(f"step {step.name} is followed by {after.name}, not {step.then}")
        if self.steps[-1].then is not None or self.steps[-1].per_ticket:
            raise ValueError("the plan must end with a whole-run step that follows nothing")
        if self.steps[0].per_ticket:
            raise ValueError("the plan must start with a whole-run step")
        if len(set(names)) != len(names):
            raise ValueError(f"two steps share a name: {names}")

    def __iter__(self) -> Iterator[Step]:
        return iter(self.steps)

    def __getitem__(self, name: str) -> Step:
        return next(s for s in self.steps if s.name == name)

    def after(self, step: Step) -> Step | None:
        """The step that follows `step`."""
        return None if step.then is None else self[step.then]

    def before(self, step: Step) -> Step | None:
        """The step `step` follows."""
        return next((s for s in self.steps if s.then == step.name), None)

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
        return self["review" if drafted else "draft"]

    @property
    def nodes(self) -> tuple[str, ...]:
        """Every step's node, in order (the progress view)."""
        return tuple(s.node for s in self.steps)

    @property
    def reported_nodes(self) -> list[str]:
        """The nodes the report's table lists, in order."""
        return [s.node for s in self.steps if s.reported]

    def with_step(self, step: Step, after: str) -> Plan:
        """This plan with `step` inserted after the step named `after`."""
        steps = list(self.steps)
        at = steps.index(self[after])
        steps[at] = replace(steps[at], then=step.name)
        steps.insert(at + 1, replace(step, then=self[after].then))
        return Plan(tuple(steps))


PLAN = Plan(
    (
        Step("route", Scope.RUN, route, leaves=(TicketStatus.ROUTED,), then="draft"),
        Step(
            "draft",
            Scope.TICKET,
            draft,
            takes=TicketStatus.ROUTED,
            leaves=(TicketStatus.DRAFTED,),
            then="merge",
            label="fanout",
        ),
        Step("merge", Scope.RUN, merge, leaves=(TicketStatus.DRAFTED,), then="review"),
        Step(
            "review",
            Scope.TICKET,
            review,
            takes=TicketStatus.DRAFTED,
            leaves=(TicketStatus.PASS, TicketStatus.NEEDS_HUMAN),
            then="report",
            rounds=True,
        ),
        Step("report", Scope.RUN, report, reported=False),
    )
)
