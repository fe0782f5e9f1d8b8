"""What `run` and `resume` print while they wait and when they end: progress lines read back
from the run record (or the live view), the report, the verdict line, the JSON document."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Literal

from orchestrator.cli.progress import Tally, TraceTail, WaitPrinter
from orchestrator.config.environment import GraphSettings
from orchestrator.errors import BrokerUnavailable, RunStateError, RunStorageError
from orchestrator.exit_codes import ExitCode
from orchestrator.plan import tasks
from orchestrator.plan.progress import LIST_AT_MOST
from orchestrator.run import totals
from orchestrator.run.outline import DRAFT
from orchestrator.run.records import (
    Cancel,
    RunMeta,
    RunRecord,
    RunStatus,
)
from orchestrator.run.store import RunStore
from orchestrator.steps import report
from orchestrator.submission import status, submit
from orchestrator.submission.retry import Reopened
from workers.settings import HarnessSettings

Mode = Literal["live", "lines", "quiet"]


def claimed(store: RunStore) -> str:
    """The line printed when the inbox has been claimed (from the names of the run's files
    and run.json: parsing 10,000 tickets' run-state.json to count them took 206 ms before
    the run was sent, and grew the CLI by 77 MB, against 23 ms and 3 MB)."""
    tickets = store.ticket_ids()
    ids = ", ".join(tickets) or "none"
    if len(tickets) > LIST_AT_MOST:
        ids = f"{tickets[0]} … {tickets[-1]}"
    line = f"inbox/ received {plural(len(tickets), 'ticket')}: {ids}"
    if rejected := store.meta().rejected:
        line += f"; {plural(len(rejected), 'file')} quarantined (not tickets)"
    return line


def say(text: str) -> None:
    """Print `text` now; if stdout's reader went away (`| head`), print nothing more there:
    the run goes on, and its exit code still tells how it ended."""
    try:
        print(text, end="", flush=True)
    except BrokenPipeError:
        reader_left()


def reader_left() -> None:
    """stdout goes nowhere from now on (its reader left), so no later write or the flush at
    exit fails."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


class ProgressPrinter:
    """Prints each node's progress line (its step's row says which) once, as soon as the
    run shows the node done.

    It reads run-state.json only when the run says a node ended (the single-writer steps
    materialise it just before), never on a timer. Nodes done before this command began (a
    resumed run's) are not printed again, as if they had run now.
    """

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self.printed = {f"[{name}" for name, node in store.nodes().items() if node.done}

    def __call__(self, event: dict[str, Any]) -> None:
        """Print the lines of nodes finished since the last call, on a node's end."""
        if event.get("event") == "node_end":
            self.show(self.store.materialised())

    def show(self, record: RunRecord) -> None:
        """Print the lines of `record`'s finished nodes not printed yet."""
        for line in tasks.registered().progress_lines(record):
            node = line.split("]", 1)[0]
            if node not in self.printed:
                self.printed.add(node)
                print(line, flush=True)


class Follower:
    """What `run` and `resume` show while they wait, by `mode`: a live view (a terminal),
    one line per node (cron, pipes), or nothing (--quiet); with `json_logs`, every trace
    event also goes to stderr as one JSON line, as the workers write it.

    Called with each event the run publishes, and with None when a second passed without
    one (the trace is read then, so counts move between nodes).
    """

    def __init__(self, store: RunStore, mode: Mode, json_logs: bool = False) -> None:
        self.store = store
        self.json_logs = json_logs
        self.tail = TraceTail(store.trace_path)
        self.lines = ProgressPrinter(store) if mode == "lines" else None
        self.waits = WaitPrinter(store) if mode == "lines" else None
        self.live = None
        self.tally: Tally | None = None  # counted only for the views that read the trace
        if mode == "live" or json_logs:
            budget = store.meta().config.run_budget_usd
            plan, tickets = tasks.registered(), len(store.ticket_ids())
            self.tally = tally = Tally(
                tickets, plan.nodes, plan[DRAFT.name].node, run_budget_usd=budget
            )
            if mode == "live":
                from orchestrator.cli.live import LiveView

                self.live = LiveView(store.run_id, tally)

    def __call__(self, event: dict[str, Any] | None) -> None:
        """Take in what the trace gained; print a node's line when one ended. Output that
        cannot be written (a closed pipe) is dropped: showing progress never fails a run."""
        try:
            self._read()
            if self.lines is not None and event is not None:
                self.lines(event)
            if self.waits is not None:
                self.waits(self.tally.waits if self.tally is not None else None)
        except OSError:
            self.json_logs, self.lines, self.waits = False, None, None

    def _read(self) -> None:
        if self.tally is None:
            return  # only the live view counts events, only --log-format json shows them
        for event in self.tail.read():
            self.tally.add(event)
            if self.json_logs:
                print(json.dumps(event, ensure_ascii=False), file=sys.stderr, flush=True)
        if self.live is not None:
            self.live.update()

    def close(self, record: RunRecord | None) -> None:
        """The last of the trace, the last frame or the node lines not printed yet."""
        self(None)
        if self.live is not None:
            self.live.stop()
        if self.lines is not None and record is not None:
            self.lines.show(record)


def verdict(record: RunRecord) -> str:
    """The run's outcome in one line: exit code, meaning, counts, cost and duration."""
    by_status = Counter(t.status for t in record.tickets.values())
    counts = ", ".join(f"{n} {s.value}" for s, n in sorted(by_status.items()))
    cost = report.cost(record)
    meaning = {
        ExitCode.ALL_PASS: "all pass",
        ExitCode.NEEDS_HUMAN: "some need a human",
        ExitCode.STOPPED: f"stopped early; resume with: {resume_command(record)}",
        ExitCode.CRASHED: "crashed",
    }.get(record.exit_code, record.status.value)  # type: ignore[arg-type]
    code = "still running" if record.exit_code is None else f"exit {record.exit_code}"
    why = f" ({record.error})" if record.error else ""
    back = f"; {way_back(record)}" if record.exit_code == ExitCode.CRASHED else ""
    return (
        f"run {record.run_id}: {code}, {meaning}{why}; {plural(len(record.tickets), 'ticket')}"
        f"{': ' + counts if counts else ''}; {report.usd(cost)}{back}\n"
    )


def way_back(run: RunMeta | RunStore) -> str:
    """Where a crashed run's tickets are, and the commands that finish the run or put them
    back in inbox/ (the last words of a crash: nothing else says where inbox/ went)."""
    workspace, where = _workspace_of(run)
    claimed = Path(workspace if where else ".") / "runs" / run.run_id / "claimed"
    return (
        f"its tickets are in {claimed}/: `{resume_command(run)}` once fixed, or "
        f"`ticketgraph requeue {run.run_id}{where}` puts them back in inbox/"
    )


def outcome(store: RunStore, record: RunRecord) -> str:
    """The report, the stop notice, or the crash, whichever ended the run."""
    if record.status is RunStatus.DONE and store.report_path.exists():
        return _from_here(store.report_path.read_text(encoding="utf-8"), record)
    if record.status is RunStatus.STOPPED:
        stop = record.config.stop_after
        why = record.error or (f"stopped after {stop}" if stop else "stopped early")
        counts = Counter(t.status.value for t in record.tickets.values())
        where = ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "no tickets"
        return (
            f"[stop] {why}: {where}; no verdict in this run.\n"
            f"Resume with: {resume_command(record)}\n"
        )
    if record.status is RunStatus.RUNNING:
        return (
            f"[wait] stopped waiting; run {record.run_id} goes on in the workers. "
            f"Its state: {_here(record)}/runs/{record.run_id}/run-state.json\n"
        )
    if record.status is RunStatus.CRASHED:
        return ""  # the verdict line says it, with the error: one sentence, not two
    return (
        f"run {record.run_id}: {record.status.value}"
        + (f" ({record.error})" if record.error else "")
        + "\n"
    )


def _here(record: RunRecord) -> str:
    """The run's workspace as a path from the current folder (`.` when it is that)."""
    return os.path.relpath(record.workspace, Path.cwd())


def _from_here(report_text: str, record: RunRecord) -> str:
    """The report with its trace line's paths given from the current folder (the report
    file gives them from the workspace)."""
    where = _here(record)
    if where == ".":
        return report_text
    lines = report_text.splitlines(keepends=True)
    return "".join(
        report.trace_line(record.run_id, where) + "\n" if line.startswith(report.TRACE) else line
        for line in lines
    )


def mode(quiet: bool, as_json: bool, log_format: str) -> Mode:
    """What to show while waiting: nothing for --quiet or --json, a live view on a
    terminal, else one line per node (cron, pipes, --log-format json)."""
    if quiet or as_json:
        return "quiet"
    if log_format == "text" and sys.stdout.isatty():
        return "live"
    return "lines"


def wait_for_verdict(
    store: RunStore, settings: GraphSettings, shown: Mode, log_format: str, as_json: bool
) -> int:
    """Execute the run while showing its progress as asked, then print how it ended: the
    JSON document, the verdict line, or the report and the verdict line; its exit code."""
    follow = Follower(store, shown, json_logs=log_format == "json")
    try:
        try:
            code = submit.execute(store, settings, HarnessSettings(), follow)
        finally:
            follow.close(None)
    except BrokerUnavailable as exc:
        # Not a crash: the run is still `running`, and its workers finish it if they
        # reach the broker. Cron should try again later (75), not page anyone.
        print(f"ticketgraph: {exc}", file=sys.stderr)
        store.materialise()
        _conclude(store, store.materialised(), ExitCode.TEMPFAIL, shown, as_json)
        return ExitCode.TEMPFAIL
    except RunStorageError as exc:
        return _unwritable(store, exc)
    try:
        record = ended_record(store)
    except OSError as exc:
        return _unwritable(store, exc)
    try:
        if follow.lines is not None:
            follow.lines.show(record)
        _conclude(store, record, code, shown, as_json)
    except BrokenPipeError:  # stdout went away (`| head`): the run's outcome stands
        reader_left()
    return code


def ended_record(store: RunStore) -> RunRecord:
    """run-state.json as the run's end wrote it, if the run is done and the file is the one
    its end materialised (no record changes after a verdict); else materialised again (a
    run that stopped or was cut off may have tickets still finishing), and a stopped or
    crashed run counted again with what they recorded since (run/totals.py)."""
    meta = store.meta()
    if meta.status is RunStatus.DONE:
        try:
            record = store.materialised()
        except RunStateError:
            record = None
        if record is not None and record.updated_at == meta.updated_at:
            return record
    if meta.status in (RunStatus.STOPPED, RunStatus.CRASHED):
        totals.recount(store)  # and materialised
    else:
        store.materialise()
    return store.materialised()


def _conclude(store: RunStore, record: RunRecord, code: int, shown: Mode, as_json: bool) -> None:
    """The end of `run`/`resume` on stdout: the JSON document, the verdict line, or the
    report (or stop or crash notice) followed by the verdict line."""
    if as_json:
        print(json.dumps(status.document(record, exit_code=code), indent=2))
        return
    failed = code in (ExitCode.CRASHED, ExitCode.TEMPFAIL)
    out = sys.stderr if failed else sys.stdout
    if shown != "quiet":
        print(outcome(store, record), end="", file=out)
    print(verdict(record), end="", file=out)


def _unwritable(store: RunStore, exc: Exception) -> int:
    """The run's files could not be written: say what and where, and how to go on (exit 3)."""
    print(
        f"run {store.run_id}: crashed ({exc})\n"
        f"Once it can be written again, finish it with: {resume_command(store)}\n"
        f"run {store.run_id}: exit 3, crashed; {way_back(store)}",
        file=sys.stderr,
    )
    return ExitCode.CRASHED


def resume_command(run: RunMeta | RunStore) -> str:
    """The command that resumes this run from where the user stands (with --workspace when
    that is not the current folder)."""
    return f"ticketgraph resume {run.run_id}{_workspace_of(run)[1]}"


def _workspace_of(run: RunMeta | RunStore) -> tuple[Path, str]:
    """The run's workspace, and the `--workspace` a command needs to name it from here."""
    workspace = Path(run.workspace) if isinstance(run, RunMeta) else run.workspace.root
    here = Path.cwd().resolve()
    return workspace, "" if workspace.resolve() == here else f" --workspace {workspace}"


def plural(count: int, noun: str) -> str:
    """`1 ticket`, `2 tickets`."""
    return report.counted(count, noun)


def _cancel_of(cancel: Cancel) -> str:
    what = f"cancel of {cancel.ticket}" if cancel.ticket else "run's cancel"
    return f"{what} ({cancel.why}, at {cancel.at})"


def reopened(taken: Reopened) -> str:
    """What `resume` takes up again, in a line each (nothing if nothing)."""
    lines = [f"lifting the {_cancel_of(c)}" for c in taken.cancels]
    if taken.retried:
        kind = "failed or cancelled ticket" if taken.cancels else "failed ticket"
        tickets = plural(len(taken.retried), kind)
        lines.append(f"retrying {tickets}: {', '.join(taken.retried)}")
    if taken.decided:
        tickets = plural(len(taken.decided), "decided ticket")
        lines.append(f"taking up {tickets}: {', '.join(taken.decided)}")
    if taken.expired:
        lines.append(f"expired undecided: {', '.join(taken.expired)} (they need a human)")
    if taken.still_waiting:
        waiting = plural(taken.still_waiting, "ticket")
        verb = "waits" if taken.still_waiting == 1 else "wait"
        lines.append(f"{waiting} still {verb} for a decision (ticketgraph pending)")
    return "".join(f"{line}\n" for line in lines)
