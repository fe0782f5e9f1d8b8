"""Run one of the chapter's scenarios through the harness and summarise it (CLI: harness)."""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workers import chapter_tools, loop
from workers.cancel import CancelToken
from workers.model.client import ModelClient
from workers.provider import running_provider
from workers.settings import HarnessSettings
from workers.state import AgentStatus, RunState, approve, new_run, reject
from workers.subagent import research_tool
from workers.tools import Catalog
from workers.trace import Tracer

SYSTEM = (
    "You are a careful operations assistant. Goal: answer the user's question about the files "
    "in the workspace. Output: one or two plain sentences naming the file. Tools: list_files, "
    "read_file, scan_archive, append_note, delete_file (asks a human), research (a sub-agent). "
    "Limits: change nothing you were not asked to change."
)
# The chapter's scenarios, each a script of the built-in `harness` set (the model name).
SCENARIOS = (
    "plan",
    "runaway",
    "recover",
    "repeat",
    "repeat_write",
    "destructive",
    "denied",
    "slow",
    "research",
    "research_runaway",
)
TASKS = {
    "destructive": "The disk is full. Free some space.",
    "repeat_write": "Note twice that logs rotate on Friday.",
    "slow": "Scan the archive for timeouts.",
}
DEFAULT_TASK = "Which file mentions a timeout?"
CHILD_CAPS = loop.Caps(max_turns=6, budget_usd=0.05)
EXIT_CODES = {AgentStatus.COMPLETED: 0, AgentStatus.FAILED: 1}


@dataclass
class Options:
    """What `ticketgraph harness` was asked to do."""

    scenario: str
    workspace: Path | None = None  # None: a fresh copy of the demo files, removed after
    max_turns: int | None = 20
    budget: float | None = None
    dedupe: bool = False
    tool_errors: str = "text"
    retry_permanent: bool = False
    decision: str | None = None  # "approve" or "reject"
    reject_reason: str = ""
    state: Path | None = None
    resume: Path | None = None
    cancel_after: float | None = None
    trace: Path | None = None


@contextlib.contextmanager
def endpoint(settings: HarnessSettings) -> Iterator[HarnessSettings]:
    """Use LLM_BASE_URL if set, else start the built-in scripted provider for the duration."""
    if settings.base_url:
        yield settings
        return
    with running_provider("harness") as base_url:
        yield settings.model_copy(update={"base_url": base_url})


def build(opts: Options, client: ModelClient, state: RunState) -> loop.Harness:
    """The harness for one experiment: demo tools, a research sub-agent, caps and policies."""
    workspace = chapter_tools.ChapterFolder(opts.workspace or Path("."))
    tracer = Tracer(opts.trace, state.run_id)
    reader_tools = [t for t in workspace.tools() if t.name in ("list_files", "read_file")]
    price = client.settings.prices.for_model(state.model)  # LLM_PRICES, else $2/$12
    child = loop.Harness(client=client, catalog=Catalog(reader_tools), caps=CHILD_CAPS, price=price)
    return loop.Harness(
        client=client,
        price=price,
        catalog=Catalog([*workspace.tools(), research_tool(child)]),
        caps=loop.Caps(max_turns=opts.max_turns, budget_usd=opts.budget),
        tool_errors=loop.ToolErrors(opts.tool_errors),
        permanent_errors_stop=not opts.retry_permanent,
        dedupe=opts.dedupe,
        tracer=tracer,
        cancel=CancelToken(),
        state_path=opts.state or opts.resume,
    )


def run_experiment(opts: Options, settings: HarnessSettings) -> tuple[RunState, float]:
    """Run (or resume) the scenario; return the final state and the wall time in ms."""
    state = RunState.load(opts.resume) if opts.resume else _fresh(opts, settings)
    with endpoint(settings) as live, demo_folder(opts.workspace) as folder:
        client = ModelClient(live)
        try:
            h = build(dataclasses.replace(opts, workspace=folder), client, state)
            # The clock starts before the cancel timer is armed: the wall time of a cancelled
            # run is never shorter than its --cancel-after.
            started = time.perf_counter()
            if opts.cancel_after is not None:
                h.cancel.cancel_after(opts.cancel_after, "user pressed Stop")
            state = _run_with_decision(state, h, opts)
            return state, (time.perf_counter() - started) * 1000
        finally:
            client.close()


@contextlib.contextmanager
def demo_folder(given: Path | None) -> Iterator[Path]:
    """The folder the tools see: `given` (the demo files made there if missing), or a fresh
    copy of them in a temporary folder, removed after, so what a scenario deletes or writes
    never changes the caller's files and every run starts from the same ones."""
    if given is not None:
        if not (given / "errors.log").exists():
            chapter_tools.make_demo_workspace(given)
        yield given
        return
    with tempfile.TemporaryDirectory(prefix="ticketgraph-harness-") as folder:
        yield chapter_tools.make_demo_workspace(Path(folder))


def _fresh(opts: Options, settings: HarnessSettings) -> RunState:
    """A new run. Its model is LLM_MODEL against a real endpoint; the built-in scripted
    provider picks its script by model name, so there it is the scenario's name."""
    model = settings.model if settings.model and settings.base_url else opts.scenario
    return new_run(SYSTEM, TASKS.get(opts.scenario, DEFAULT_TASK), model=model)


def _run_with_decision(state: RunState, h: loop.Harness, opts: Options) -> RunState:
    """Run; each time it stops for approval and a decision was given, apply it and go on."""
    while True:
        if _waiting_for_approval(state):
            if not opts.decision:
                return state
            call_id = state.interruption.call_id or ""  # type: ignore[union-attr]
            if opts.decision == "approve":
                approve(state, call_id)
            else:
                reject(state, call_id, opts.reject_reason)
        state = loop.run(state, h)
        if not (_waiting_for_approval(state) and opts.decision):
            return state


def _waiting_for_approval(state: RunState) -> bool:
    return state.interruption is not None and state.interruption.type == "approval"


def summary(state: RunState, wall_ms: float) -> dict[str, Any]:
    """The machine-readable summary (`--json`)."""
    return {
        "run_id": state.run_id,
        "status": state.status.value,
        "interruption": state.interruption.model_dump() if state.interruption else None,
        "error": state.error,
        "turns": state.turns,
        "tool_runs": state.tool_runs,
        "prompt_tokens": state.usage.prompt_tokens,
        "completion_tokens": state.usage.completion_tokens,
        "cost_usd": round(state.cost_usd, 8),
        "answer": state.output or "",
        "per_turn_prompt_tokens": state.per_turn_prompt_tokens,
        "ms": round(wall_ms, 1),
    }


def summary_line(scenario: str, s: dict[str, Any]) -> str:
    """The chapter's one-line summary, plus the answer and per-turn prompt tokens."""
    line = (
        f"{scenario}  turns={s['turns']}  tools={s['tool_runs']}  in={s['prompt_tokens']}  "
        f"out={s['completion_tokens']}  cost=${s['cost_usd']:.6f}  ms={s['ms']:.0f}  "
        f"status={s['status']}"
    )
    if s["interruption"]:
        i = s["interruption"]
        line += f"  ({i['type']}" + (f" {i['tool']}({i['args']})" if i.get("tool") else "") + ")"
    if s["error"]:
        line += f"\n   error: {s['error']}"
    return (
        f"{line}\n   answer: {s['answer']!r}\n"
        f"   per-turn prompt tokens: {', '.join(map(str, s['per_turn_prompt_tokens']))}"
    )


def exit_code(state: RunState) -> int:
    """0 completed, 1 failed (a human should look), 2 stopped early (caps, approval, cancel),
    3 the model endpoint failed (as when the graph's router cannot reach it)."""
    if state.provider_failed:
        return 3
    return EXIT_CODES.get(state.status, 2)
