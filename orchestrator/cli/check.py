"""`ticketgraph check`: what a workspace would run, checked the way `run` checks it before it
claims anything (ticketgraph.toml, its prompts and templates, the tools and checks it
imports, the model endpoint or scripted replies, the routing prompt), and shown category by
category, without claiming a ticket or paying for a model call."""

from __future__ import annotations

from orchestrator.config import declarations, endpoint, layers, prompt_lint
from orchestrator.config.environment import GraphSettings
from orchestrator.config.workspace import CONFIG_FILE, Workspace
from orchestrator.run.records import RunConfig, WorkerSpec
from orchestrator.steps import agent, prompts
from workers.settings import HarnessSettings


def check(workspace: Workspace, settings: GraphSettings, llm: HarnessSettings) -> str:
    """What each category would run, as text; `ConfigError` (or `UsageError`) naming the
    first problem, the same one `run` would stop on."""
    workspace.require().check_folders()
    effective = layers.load(workspace, settings, llm)
    config = layers.run_config(workspace, effective, settings, llm)
    found = declarations.load(workspace, config)
    model = endpoint.require(workspace, settings, llm)
    agent.role_of(config, "router")  # the router's settings resolve
    routing = prompts.ROUTER.format(categories=agent.categories_text(config))
    lines = [f"{workspace.root / CONFIG_FILE}: ok, nothing claimed or paid"]
    lines.append(f"  router: {len(routing)} characters of prompt; categories, in order:")
    for name in config.categories:
        if name in config.workers:
            lines += _worker(name, config.workers[name], config, found)
        else:
            lines.append(f"  {name}: template, {len(config.templates[name])} characters")
    checks = ", ".join(config.checks) or "none of your own"
    lines.append(f"  gate: {len(config.filler_phrases)} filler phrases; checks: {checks}")
    lines.append(f"  model endpoint: {model}")
    lines.append(f"  {_budget(config, llm)}")
    lines.append(f"  fingerprint: {found.fingerprint[:16]} (every worker must load the same)")
    return "\n".join(lines) + "\n"


def _worker(
    name: str, spec: WorkerSpec, config: RunConfig, found: declarations.Declarations
) -> list[str]:
    role = agent.role_of(config, name)
    tools = [f"{t.name}{'' if t.read_only else ' (write)'}" for t in found.tools_of(spec)]
    caps = f"model {role.model}, {role.max_turns} turns, budget ${role.budget_usd or 0:g}"
    lines = [
        f"  {name}: worker — {spec.description or 'no description'}",
        f"    {_prompts(spec)}; {caps}",
        f"    tools: {', '.join(tools) or 'none'}; reads: {', '.join(spec.reads) or 'nothing'}",
    ]
    prompts = {f"angle {a} of worker {name}": p for a, p in spec.angles.items()}
    for who, prompt in (prompts or {f"worker {name}": spec.prompt}).items():
        if (lint := prompt_lint.warning(who, prompt)) is not None:
            lines.append(f"    {lint}")
    for tool in found.tools_of(spec):
        rule = spec.approval.get(tool.name)
        if not tool.read_only and spec.angles:
            lines.append(
                f"    note: {tool.name} writes, and each angle runs its own calls: it may "
                "write once per angle"
            )
        if rule is not None:
            lines.append(f"    approval: {tool.name} waits for a person when {rule!r}")
        elif not tool.read_only and not tool.needs_approval:
            lines.append(
                f"    note: {tool.name} writes and runs without a person: add "
                f'approval = {{ {tool.name} = "always" }} (or a rule) if it should not'
            )
    return lines


def _prompts(spec: WorkerSpec) -> str:
    """`prompt: 612 characters`, or each angle's (a draft from each, voted between)."""
    if not spec.angles:
        return f"prompt: {len(spec.prompt)} characters"
    sizes = ", ".join(f"{a} {len(p)}" for a, p in spec.angles.items())
    return f"angles, voted between: {sizes} characters"


def _budget(config: RunConfig, llm: HarnessSettings) -> str:
    """What a run may spend, and the endpoint's caps."""
    if config.run_budget_usd is None:
        spend = "run budget: none ([run] budget_usd or --budget sets one)"
    else:
        spend = f"run budget: ${config.run_budget_usd:.4f}"
        if config.ticket_budget_usd is not None:
            spend += f", ${config.ticket_budget_usd:.4f} per ticket"
    caps = [
        f"{name} {value}"
        for name, value in (("LLM_MAX_INFLIGHT", llm.max_inflight), ("LLM_MAX_TPM", llm.max_tpm))
        if value is not None
    ]
    return f"{spend}; endpoint caps: {', '.join(caps) or 'none'}"
