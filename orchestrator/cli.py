"""The `ticketgraph` command: one subcommand per job, each with its own --help."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

EXIT_CRASHED = 3


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    parser = _parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ticketgraph",
        description="Route support tickets, draft replies with LLM agent workers on Celery, "
        "review every draft, and report with an exit code cron can check.",
    )
    sub = parser.add_subparsers(required=True, metavar="COMMAND")
    _add_harness(sub)
    _add_provider(sub)
    return parser


def _add_provider(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "provider",
        help="serve the scripted OpenAI-compatible model over HTTP",
        description="Serve the scripted provider: POST /v1/chat/completions answered from a "
        "scenario file, GET /stats, POST /stats/reset. Pass the remaining options through.",
        add_help=False,
    )
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(handler=_provider)


def _provider(args: argparse.Namespace) -> int:
    from workers.provider.server import main as provider_main

    return provider_main(args.rest) or 0


def _add_harness(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "harness",
        help="run one agent-harness scenario against the scripted provider",
        description="Run one scenario of the agent-harness chapter (plan, runaway, recover, "
        "repeat, repeat_write, destructive, denied, slow, research, research_runaway) and "
        "print its summary. Uses LLM_BASE_URL if set, else starts the built-in scripted "
        "provider. Exit code: 0 completed, 1 failed, 2 stopped early (cap, budget, "
        "approval, cancel), 3 crashed.",
    )
    p.add_argument("scenario", help="scenario name (the model name sent to the provider)")
    p.add_argument("--max-turns", type=int, default=20, help="turn cap; 0 means none (default 20)")
    p.add_argument("--budget", type=float, help="USD budget, checked before every model call")
    p.add_argument(
        "--dedupe", action="store_true", help="reuse results of repeated read-only calls"
    )
    p.add_argument(
        "--tool-errors",
        choices=["text", "bare", "fatal"],
        default="text",
        help="what the model hears when a tool fails: the error text (default), a bare "
        "'Error', or nothing because the run fails",
    )
    p.add_argument(
        "--retry-permanent",
        action="store_true",
        help="treat permanent tool errors (permission denied) like any other, instead of "
        "stopping the run failed",
    )
    decision = p.add_mutually_exclusive_group()
    decision.add_argument("--approve", action="store_true", help="approve calls that need approval")
    decision.add_argument(
        "--reject", nargs="?", const="", metavar="REASON", help="decline them, with a reason"
    )
    p.add_argument("--state", type=Path, help="save the run state here after every step")
    p.add_argument("--resume", type=Path, help="resume the run saved in this state file")
    p.add_argument("--cancel-after", type=float, metavar="SECONDS", help="press Stop after this")
    p.add_argument("--trace", type=Path, help="append the JSONL trace to this file")
    p.add_argument(
        "--workspace",
        type=Path,
        default=Path("harness-workspace"),
        help="folder the file tools see; created with the demo files if missing "
        "(default ./harness-workspace)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead")
    p.set_defaults(handler=_harness)


def _harness(args: argparse.Namespace) -> int:
    from workers import experiment
    from workers.errors import HarnessError
    from workers.settings import HarnessSettings

    if args.resume and not args.resume.exists():
        print(f"ticketgraph harness: no state file at {args.resume}", file=sys.stderr)
        return 2
    opts = experiment.Options(
        scenario=args.scenario,
        workspace=args.workspace,
        max_turns=args.max_turns or None,
        budget=args.budget,
        dedupe=args.dedupe,
        tool_errors=args.tool_errors,
        retry_permanent=args.retry_permanent,
        decision="approve" if args.approve else ("reject" if args.reject is not None else None),
        reject_reason=args.reject or "",
        state=args.state,
        resume=args.resume,
        cancel_after=args.cancel_after,
        trace=args.trace,
    )
    try:
        state, wall_ms = experiment.run_experiment(opts, HarnessSettings())
    except HarnessError as exc:
        print(f"ticketgraph harness: {exc}", file=sys.stderr)
        return EXIT_CRASHED
    result = experiment.summary(state, wall_ms)
    print(json.dumps(result) if args.json else experiment.summary_line(args.scenario, result))
    return experiment.exit_code(state)


if __name__ == "__main__":
    sys.exit(main())
