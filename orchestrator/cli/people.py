"""The person's commands: `queue` (what waits for a person, across runs), `handle` (send,
edit or close a ticket that needs a person), `audit` (judge a sampled pass), `labels export`
(every verdict as a dataset) and `gate replay` (the gate against those verdicts, offline).
Each reads and writes the workspace's files alone: no Redis, no workers. The work is
orchestrator/people/'s; this module parses and prints."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from orchestrator.cli.options import by_option, json_option, reason_option, workspace_option
from orchestrator.exit_codes import ExitCode

if TYPE_CHECKING:
    from orchestrator.config.workspace import Workspace

QUEUE_NOTES = """\b
Kinds:
  call    a tool call that waits for approve/reject (or, decided, for resume)
  ticket  a needs_human ticket nobody handled yet (ticketgraph handle)
  audit   a pass sampled by [review] audit_share (ticketgraph audit)"""


def _by(by: str | None) -> str:
    from orchestrator.run import signing

    return by or signing.user_name()


@click.command("queue", epilog=QUEUE_NOTES)
@workspace_option
@click.option("--kind", type=click.Choice(["call", "ticket", "audit"]), help="Only this kind.")
@click.option("--reason", help="Only this reason (a stop such as no_progress, approval, audit).")
@click.option("--category", help="Only tickets of this category.")
@click.option("--run", "run_id", metavar="RUN_ID", help="Only this run.")
@click.option(
    "--older-than",
    type=click.FloatRange(min=0),
    metavar="HOURS",
    help="Only what has waited at least this long.",
)
@click.option("--newest", is_flag=True, help="Newest first (default: oldest first).")
@json_option("Print {counts, items} as JSON.")
def queue(
    workspace: Workspace,
    kind: str | None,
    reason: str | None,
    category: str | None,
    run_id: str | None,
    older_than: float | None,
    newest: bool,
    as_json: bool,
) -> int:
    """List what waits for a person, in every run of the workspace.

    Every tool call that waits for a decision (and every decided one that waits for
    `resume`), every needs_human ticket nobody handled yet, and every sampled pass nobody
    audited: the run, the ticket, why in words, how long it has waited, and the commands
    that move it on; for a call, the tool, its arguments (amounts as money), the rule that
    made it wait and when it expires. Read from the run folders: no Redis, no workers.
    """
    from orchestrator.people import queue as waiting

    root = workspace.require()
    older = None if older_than is None else older_than * 3600
    filters = waiting.Filters(kind, reason, category, run_id, older, newest)
    found = waiting.items(root, filters)
    if as_json:
        shown = {"counts": waiting.counts(found), "items": [i.model_dump() for i in found]}
        print(json.dumps(shown, indent=2))
    else:
        print(_queue_text(found), end="")
    return ExitCode.ALL_PASS


def _queue_text(found: list[Any]) -> str:
    from orchestrator.people import queue as waiting

    if not found:
        return "nothing waits for a person\n"
    counts = waiting.counts(found)
    said = ", ".join(f"{n} {kind}{'s' if n != 1 else ''}" for kind, n in counts.items() if n)
    lines = [f"{len(found)} waiting for a person ({said}):"]
    for item in found:
        head = f"{item.kind:<7}{item.run_id} {item.ticket}"
        if item.category:
            head += f" ({item.category})"
        lines.append(f"{head}, waiting {waiting.age_words(item.age_s)}")
        if item.kind == "call":
            lines.append(f"    {item.tool}: {item.arguments}")
            rule = f"rule {item.rule!r}" if item.rule else "its tool's approval policy"
            lines.append(f"    waits by {rule}; expires {item.expires_at}; {item.state}")
        lines.append(f"    why: {item.why}")
        lines += [f"    {command}" for command in item.commands]
    return "\n".join(lines) + "\n"


@click.command("handle")
@click.argument("run_id")
@click.argument("ticket")
@workspace_option
@click.option("--send", "send", is_flag=True, help="Send the run's own reply as it is.")
@click.option(
    "--reply-file",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="Send this file's text instead (the run's own reply is kept).",
)
@click.option("--close", "close", is_flag=True, help="Close the ticket without a reply.")
@by_option("handles it")
@reason_option("Why (kept in the record and the label).")
def handle(
    run_id: str,
    ticket: str,
    workspace: Workspace,
    send: bool,
    reply_file: Path | None,
    close: bool,
    by: str | None,
    reason: str | None,
) -> int:
    """Handle a ticket of RUN_ID that needs a person: send, edit or close.

    --send publishes the run's own reply (the text the run ended with, not whatever
    out/TICKET.txt holds now); --reply-file publishes yours, written to out/TICKET.txt
    atomically; --close sends nothing. Recorded once in runs/RUN_ID/handled/TICKET.json (who,
    when, why, the hashes of the run's reply and of what went out), traced, and kept as a
    label (ticketgraph labels export). The ticket leaves the queue. A ticket that does not
    need a person, or was handled already, is refused (exit 64).
    """
    from orchestrator.people import handling

    chosen = [name for name, on in (("send", send), ("edit", reply_file), ("close", close)) if on]
    if len(chosen) != 1:
        raise click.UsageError("give one of --send, --reply-file FILE or --close")
    edited = None
    if reply_file is not None:
        try:
            edited = reply_file.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise click.UsageError(f"{reply_file} is not UTF-8 text") from None
    done = handling.handle(workspace, run_id, ticket, chosen[0], _by(by), reason, edited)  # type: ignore[arg-type]
    made = done.made
    where = f", {made.out_file} written" if made.out_file else ", nothing sent"
    print(f"{made.verdict}: {run_id} {ticket} by {made.by}{where}; label kept")
    return ExitCode.ALL_PASS


@click.command("audit")
@click.argument("run_id")
@click.argument("ticket")
@workspace_option
@click.option("--good", "good", flag_value=True, default=None, help="The reply was right.")
@click.option("--bad", "good", flag_value=False, help="It was not (say why: --reason).")
@by_option("audits")
@reason_option("Why (needed with --bad).")
def audit(
    run_id: str,
    ticket: str,
    workspace: Workspace,
    good: bool | None,
    by: str | None,
    reason: str | None,
) -> int:
    """Judge a reply the gate passed (a sampled one: `ticketgraph queue --kind audit`).

    Recorded once in runs/RUN_ID/audits/TICKET.json and kept as a label (audit_good or
    audit_bad); nothing is sent or changed: the reply went out as the run published it.
    """
    from orchestrator.people import audit as auditing

    if good is None:
        raise click.UsageError("give --good or --bad")
    made = auditing.audit(workspace, run_id, ticket, good, _by(by), reason)
    print(f"{made.verdict}: {run_id} {ticket} by {made.by}; label kept")
    return ExitCode.ALL_PASS


@click.group("labels")
def labels() -> None:
    """The labels people's verdicts left (labels/labels.jsonl of the workspace)."""


@labels.command("export")
@workspace_option
@click.option(
    "--out",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Write to this file (atomically) instead of stdout.",
)
def labels_export(workspace: Workspace, out: Path | None) -> int:
    """Write every label as JSONL: one person's verdict on one run's reply a line.

    The dataset format `ticketgraph eval` reads (docs/people.md): run, ticket, category,
    draft, draft_sha256, gate {verdict, rounds}, verdict, final, by, at, reason.
    """
    from orchestrator.people import labels as store
    from workers import atomic

    text = store.export(workspace.require())
    if out is None:
        sys.stdout.write(text)
        return ExitCode.ALL_PASS
    atomic.write_text(out, text)
    print(f"{text.count(chr(10))} labels written to {out}", file=sys.stderr)
    return ExitCode.ALL_PASS


@click.group("gate")
def gate() -> None:
    """The deterministic gate, offline."""


@gate.command("replay")
@workspace_option
@click.option(
    "--config",
    "candidate",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    metavar="CANDIDATE.toml",
    help="Also count a candidate ticketgraph.toml's [gate] rules, side by side.",
)
@json_option("Print {current, candidate} as JSON.")
def gate_replay(workspace: Workspace, candidate: Path | None, as_json: bool) -> int:
    """Run the gate over every labelled reply and count false alarms and misses.

    The gate's checks and the workspace's own ([gate] checks) run again over each label's
    reply, with no model call. A false alarm is a reply a person sent unchanged (sent,
    audit_good) that the gate fails; a miss is one the gate passes that a person edited,
    closed or marked bad. Totals and each check, for today's rules and, with --config, a
    candidate's.
    """
    from orchestrator.people import replay

    root = workspace.require()
    result = replay.replay(root, candidate)
    if as_json:
        print(json.dumps({side: c.as_dict() for side, c in result.items()}, indent=2))
    else:
        print(replay.text(result), end="")
    return ExitCode.ALL_PASS


COMMANDS = (queue, handle, audit, labels, gate)
