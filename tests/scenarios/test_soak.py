"""The crash soak, small: three distributed runs, each with a worker process SIGKILLed at
one of the three kill points (during a model call, inside the refund write, during review).
`python -m bench.soak --trials 30` is the full soak; its figures are in RELIABILITY.md."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.soak import (
    POINTS,
    STALL_POINTS,
    _holds_a_lock,
    run_trials,
    summary,
    turns_twice,
)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_killed_workers_lose_no_ticket_and_repeat_no_write(tmp_path: Path) -> None:
    trials = run_trials(len(POINTS), tmp_path)
    totals = summary(trials)
    assert totals["killed"] == len(POINTS), totals  # every trial reached its kill point
    assert totals["lost_tickets"] == 0, totals
    assert totals["refunds_done_twice"] == 0, totals
    assert totals["turns_paid_twice"] == 0, totals  # no saved model turn was paid again
    assert totals["wrong_verdicts"] == 0, totals
    assert totals["exit_codes"] == {"1": len(POINTS)}, totals
    # What a kill costs: the calls in flight in the killed process (and any reply it had
    # received but not saved), paid and never recorded.
    for trial in trials:
        assert 0 <= trial.gap <= trial.gap_bound, trial


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_stalled_workers_woken_after_the_run_change_no_finished_ticket(tmp_path: Path) -> None:
    """`--mode stall`, small: a worker process stopped past the visibility timeout during
    drafting, then one during review, each woken once its run has ended."""
    trials = run_trials(len(STALL_POINTS), tmp_path, mode="stall")
    totals = summary(trials)
    assert totals["stalled"] == len(STALL_POINTS), totals  # every trial reached its point
    assert totals["lost_tickets"] == 0, totals
    assert totals["refunds_done_twice"] == 0, totals
    assert totals["finished_records_changed"] == 0, totals
    assert totals["turns_paid_twice"] == 0, totals
    assert totals["wrong_verdicts"] == 0, totals
    assert totals["exit_codes"] == {"1": len(STALL_POINTS)}, totals
    for trial in trials:
        assert 0 <= trial.gap <= trial.gap_bound, trial


def test_a_saved_turn_paid_again_is_counted() -> None:
    """The soak's direct check of the durability rule sees a repeated turn (and only that)."""
    turn = lambda agent, n: {"event": "turn", "agent_run_id": agent, "turn": n}  # noqa: E731
    once = [turn("h-a", 1), turn("h-a", 2), turn("h-b", 1), {"event": "settled"}]
    assert turns_twice(once) == 0
    assert turns_twice([*once, turn("h-a", 2)]) == 1


def test_the_stall_soak_sees_which_process_holds_a_run_folders_lock(tmp_path: Path) -> None:
    """A process stopped while it holds a fence's lock holds its ticket (or the run) until it
    is woken, which the stall soak does not test: it tells such a process apart by
    /proc/locks (a real flock held by a real process, and the one waiting behind it)."""
    fence = tmp_path / "runs" / "run-1" / "fences" / "_report"
    fence.parent.mkdir(parents=True)
    fence.touch()
    hold = "import fcntl, sys, time; f = open(sys.argv[1]); fcntl.flock(f, fcntl.LOCK_EX); "
    holder = subprocess.Popen(
        [sys.executable, "-c", hold + "print(flush=True); time.sleep(60)", str(fence)],
        stdout=subprocess.PIPE,
    )
    waiter = None
    try:
        assert holder.stdout is not None and holder.stdout.readline()  # it holds the lock
        waiter = subprocess.Popen([sys.executable, "-c", hold, str(fence)])
        deadline = time.monotonic() + 30  # until it is blocked behind the holder:
        while str(waiter.pid) not in _waiting():  # listed in /proc/locks as waiting
            assert time.monotonic() < deadline and waiter.poll() is None
            time.sleep(0.01)
        assert _holds_a_lock(holder.pid, tmp_path / "runs")
        assert not _holds_a_lock(waiter.pid, tmp_path / "runs")
        assert not _holds_a_lock(holder.pid, tmp_path / "elsewhere")
    finally:
        for process in (holder, waiter):
            if process is not None:
                process.kill()
                process.wait()


def _waiting() -> set[str]:
    """The PIDs that /proc/locks lists as blocked on a lock (`N: -> FLOCK ... <pid> ...`)."""
    rows = (line.split() for line in Path("/proc/locks").read_text().splitlines())
    return {f[5] for f in rows if len(f) > 5 and f[1] == "->"}
