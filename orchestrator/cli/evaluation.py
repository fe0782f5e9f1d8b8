"""`ticketgraph eval`: is it any good? The workspace's graph on a dataset, its figures, and
what each layer earns (orchestrator/evaluation/)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from orchestrator.cli.options import cassette_option, count_option, json_option, workspace_option
from orchestrator.exit_codes import ExitCode

if TYPE_CHECKING:
    from orchestrator.config.workspace import Workspace

EPILOG = """\b
Exit codes:
  0   every threshold met (or none given)
  1   a threshold missed (--min-accuracy, --min-pass, --max-cost-per-ticket)
  3   a run of the evaluation did not finish (its sentence on stderr)
  64  usage error (no such dataset, layer or flag)
  78  configuration error (the cassette or the workspace)"""


@click.command("eval", epilog=EPILOG)
@click.argument("dataset", type=click.Path(path_type=Path, exists=True))
@workspace_option
@cassette_option(
    "--replay",
    "Answer every model request from CASSETTE: offline, free, the same every time.",
    exists=True,
)
@cassette_option(
    "--record",
    "Keep every model exchange of the evaluation's runs (ablations too) in CASSETTE.",
)
@count_option(
    "--repeat",
    default=1,
    help="Run each configuration K times; figures are averaged and their spread shown.",
)
@click.option(
    "--ablate",
    "layers",
    multiple=True,
    metavar="LAYER",
    help="Also run without LAYER (route, review, evaluator, voting, gate:CHECK; repeatable) "
    "and print paired deltas with 95% intervals and the cost delta.",
)
@json_option("Print one JSON document.")
@click.option(
    "--min-accuracy", type=click.FloatRange(0, 1), help="Exit 1 below this routing accuracy."
)
@click.option("--min-pass", type=click.FloatRange(0, 1), help="Exit 1 below this pass rate.")
@click.option(
    "--max-cost-per-ticket",
    type=click.FloatRange(min=0),
    metavar="USD",
    help="Exit 1 above this cost per ticket.",
)
def command(
    dataset: Path,
    workspace: Workspace,
    min_accuracy: float | None,
    min_pass: float | None,
    max_cost_per_ticket: float | None,
    **asked: Any,
) -> int:
    """Evaluate the workspace on DATASET, and what each layer earns.

    Run the workspace's graph on DATASET (a folder with tickets/ and expectations.yaml, or
    a label export .jsonl) in a temporary copy of the workspace, embedded, with the
    configured model or, with --replay, a cassette (`ticketgraph run --record` makes one);
    nothing in the workspace's inbox/ or out/ is touched. Print routing accuracy and its
    confusion, pass and needs-a-person rates, expectations met per ticket and in total,
    agreement with labels, cost and latency per ticket (median, p95). --ablate LAYER runs
    the same tickets without a layer and prints the paired differences.
    """
    return _evaluate(dataset, workspace, (min_accuracy, min_pass, max_cost_per_ticket), **asked)


def _evaluate(
    dataset: Path,
    workspace: Workspace,
    thresholds: tuple[float | None, float | None, float | None],
    replay: Path | None,
    record: Path | None,
    repeat: int,
    layers: tuple[str, ...],
    as_json: bool,
) -> int:
    from orchestrator.errors import UsageError
    from orchestrator.evaluation import dataset as datasets
    from orchestrator.evaluation import report
    from orchestrator.evaluation.evaluate import evaluate, thresholds_missed
    from orchestrator.evaluation.runner import Model

    if replay is not None and record is not None:
        raise UsageError("--replay and --record go one at a time")
    place = workspace.require()
    loaded = datasets.load(dataset, place)
    document = evaluate(place, loaded, Model(replay, record), repeat, layers)
    missed = thresholds_missed(document, *thresholds)
    document["thresholds_missed"] = missed
    print(
        json.dumps(document, indent=2) if as_json else report.text(document),
        end="\n" if as_json else "",
    )
    for line in missed:
        click.echo(f"ticketgraph eval: missed: {line}", err=True)
    return ExitCode.NEEDS_HUMAN if missed else ExitCode.ALL_PASS


COMMANDS = (command,)
