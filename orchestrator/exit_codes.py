"""The exit codes a run ends with: what `ticketgraph run` returns and cron checks."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """0 all pass, 1 some need a human, 2 stopped early, 3 crashed; and sysexits: 64 usage
    error, 75 try again later (another process holds the run), 78 configuration error."""

    ALL_PASS = 0
    NEEDS_HUMAN = 1
    STOPPED = 2
    CRASHED = 3
    USAGE = 64
    TEMPFAIL = 75
    CONFIG = 78
