"""`ticketgraph harness`: one scenario of the agent-harness chapter against the scripted
provider (workers/chapter.py), its summary line and the exit code of its outcome."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from orchestrator.cli.options import json_option

if TYPE_CHECKING:
    from workers.chapter import Options


@click.command()
@click.argument("scenario")
@click.option(
    "--max-turns",
    type=click.IntRange(min=0),
    default=20,
    show_default=True,
    help="Turn cap; 0 means none.",
)
@click.option(
    "--budget",
    type=click.FloatRange(min=0, min_open=True),
    help="USD budget, checked before every model call.",
)
@click.option("--dedupe", is_flag=True, help="Reuse results of repeated read-only calls.")
@click.option(
    "--tool-errors",
    type=click.Choice(["text", "bare", "fatal"]),
    default="text",
    show_default=True,
    help="What the model hears when a tool fails: the error text, a bare 'Error', or nothing "
    "because the run fails.",
)
@click.option(
    "--retry-permanent",
    is_flag=True,
    help="Treat permanent tool errors (permission denied) like any other, instead of stopping "
    "the run failed.",
)
@click.option("--approve", is_flag=True, help="Approve calls that need approval.")
@click.option("--reject", metavar="REASON", help="Decline them, with a reason ('' for none).")
@click.option(
    "--state",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Save the run state here after every step.",
)
@click.option(
    "--resume",
    "resume_from",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Resume the run saved in this state file.",
)
@click.option(
    "--cancel-after", type=click.FloatRange(min=0), metavar="SECONDS", help="Press Stop after this."
)
@click.option(
    "--trace",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Append the JSONL trace to this file.",
)
@click.option(
    "--workspace",
    type=click.Path(path_type=Path, file_okay=False),
    help="Folder the file tools see, created with the demo files if missing (what a "
    "scenario deletes or writes there stays so). Default: a fresh copy of the demo files, "
    "removed after.",
)
@json_option("Print one JSON object instead.")
def harness(scenario: str, as_json: bool, **asked: Any) -> int:
    """Run one agent-harness scenario against the scripted provider.

    Run one scenario of the agent-harness chapter (plan, runaway, recover, repeat,
    repeat_write, destructive, denied, slow, research, research_runaway) and print its
    summary. Uses LLM_BASE_URL if set, else starts the built-in scripted provider. Exit code:
    0 completed, 1 failed, 2 stopped early (cap, budget, approval, cancel), 3 crashed or the
    model endpoint failed.
    """
    from workers import chapter
    from workers.settings import HarnessSettings, load

    opts = _options(scenario, **asked)
    agent, wall_ms = chapter.run_experiment(opts, load(HarnessSettings, "LLM_"))
    result = chapter.summary(agent, wall_ms)
    print(json.dumps(result) if as_json else chapter.summary_line(scenario, result))
    if agent.error:
        print(f"ticketgraph harness: {agent.error}", file=sys.stderr)
    return chapter.exit_code(agent)


def _options(
    scenario: str,
    max_turns: int,
    approve: bool,
    reject: str | None,
    resume_from: Path | None,
    **rest: Any,
) -> Options:
    """What the flags ask, as the chapter's `Options` (the rest of the flags are its fields
    by name); a usage error for a scenario that does not exist or flags that do not go
    together."""
    from workers import chapter

    if scenario not in chapter.SCENARIOS:
        known = ", ".join(chapter.SCENARIOS)
        raise click.BadParameter(
            f"no scenario {scenario!r}; the scenarios: {known}", param_hint="SCENARIO"
        )
    if approve and reject is not None:
        raise click.UsageError("--approve and --reject go one at a time")
    if resume_from and not resume_from.exists():
        raise click.UsageError(f"no state file at {resume_from}")
    return chapter.Options(
        scenario=scenario,
        max_turns=max_turns or None,
        decision="approve" if approve else ("reject" if reject is not None else None),
        reject_reason=reject or "",
        resume=resume_from,
        **rest,
    )


COMMANDS = (harness,)
