"""A sub-agent is a tool: its own transcript and limits, the parent's cancel token, a budget
never above what the parent has left, and only its final text handed back.
"""

from __future__ import annotations

from dataclasses import replace

from pydantic import BaseModel, Field

from workers import loop
from workers.state import AgentStatus, new_run
from workers.tools import Tool, ToolContext

RESEARCH_SYSTEM = (
    "You are a research assistant. Goal: answer one question about the workspace files. "
    "Output: two sentences at most, naming the file you relied on. Tools: list_files and "
    "read_file only. Limits: do not change anything; stop as soon as you can answer."
)


class ResearchArgs(BaseModel):
    """One question for the sub-agent."""

    question: str = Field(description="the question to investigate")


def research_tool(child: loop.Harness) -> Tool:
    """A `research` tool that runs `child` (its client, catalog and caps) per question."""

    def run(args: ResearchArgs, ctx: ToolContext) -> str:
        caps = _child_caps(child.caps, ctx.budget_left)
        harness = replace(child, caps=caps, cancel=ctx.cancel, state_path=None)
        state = new_run(RESEARCH_SYSTEM, args.question, model=ctx.model)
        harness.tracer = ctx.tracer.bind(sub_agent="research", agent_run_id=state.run_id)
        result = loop.run(state, harness)
        ctx.charge(result.cost_usd)
        ctx.cancel.check()
        if result.status is AgentStatus.COMPLETED:
            return result.output or ""
        return f"no result: the research sub-agent stopped ({result.status.value})"

    return Tool(
        "research",
        "Investigate one question with a sub-agent and return a short summary.",
        run,
        ResearchArgs,
    )


def _child_caps(caps: loop.Caps, parent_left: float | None) -> loop.Caps:
    if parent_left is None:
        return caps
    budget = parent_left if caps.budget_usd is None else min(caps.budget_usd, parent_left)
    return loop.Caps(max_turns=caps.max_turns, budget_usd=budget)
