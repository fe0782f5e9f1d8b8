"""The exit codes a run ends with: what `ticketgraph run` returns and cron checks."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """0 all pass, 1 some need a human, 2 stopped early, 3 crashed."""

    ALL_PASS = 0
    NEEDS_HUMAN = 1
    STOPPED = 2
    CRASHED = 3
