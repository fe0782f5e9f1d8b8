"""What every floor knows of the plan's steps without their functions: each step's name, the
node it records, whether it runs per ticket, whether a run may be asked to stop after it, and
whether its node is a row of the report's table.

The plan's table (plan/steps.py) makes its rows of these and adds each step's function; the
floors below the plan read them here (the stop points `--stop-after` and STOP_AFTER accept,
the report's nodes of a run recorded before runs kept their plan's), and everything that
reads a run reads its plan's nodes from the run's config (`RunConfig.nodes`), so a step added
to the plan is shown without naming it anywhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Scope(StrEnum):
    """Whether a step runs once per run or once per ticket."""

    RUN = "run"
    TICKET = "ticket"


@dataclass(frozen=True)
class Outline:
    """A step as the floors below the plan know it."""

    name: str
    scope: Scope
    label: str | None = None  # the seed's name for its node, where it differs
    stop_point: bool = False  # a run may be asked to stop after it (exit 2, resumable)
    rounds: bool = False  # its node counts its tickets' gate rounds (the seed's table)
    reported: bool = True  # its node is a row of the report's table

    @property
    def node(self) -> str:
        """The node this step records: nodes/<node>.json, `node` in the trace, the report."""
        return self.label or self.name


ROUTE = Outline("route", Scope.RUN, stop_point=True)
DRAFT = Outline("draft", Scope.TICKET, label="fanout")  # the seed's table prints `fanout`
MERGE = Outline("merge", Scope.RUN, stop_point=True)
REVIEW = Outline("review", Scope.TICKET, rounds=True)
REPORT = Outline("report", Scope.RUN, reported=False)
OUTLINE = (ROUTE, DRAFT, MERGE, REVIEW, REPORT)

STOP_POINTS = tuple(o.name for o in OUTLINE if o.stop_point)
REPORTED_NODES = tuple(o.node for o in OUTLINE if o.reported)
