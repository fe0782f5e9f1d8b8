"""A run's settings, in one model and one order: defaults < ticketgraph.toml < environment <
flags. The model is `WorkspaceConfig` (the tables of ticketgraph.toml, strict); the
environment and the flags are laid over the file's tables and the whole validated once more,
then fixed into the run's `RunConfig`, which every worker reads.

    setting                 ticketgraph.toml              environment                flag
    tickets in flight       [graph] pool_size             POOL_SIZE, TICKETGRAPH_…   --pool-size
    model of every role     [harness] model, [workers.*]  LLM_MODEL
    tokens per reply        [harness] max_tokens, …       LLM_MAX_TOKENS
    temperature             [harness] temperature, …      LLM_TEMPERATURE
    prices                  [prices]                      LLM_PRICES (replaces it)
    what a run may spend    [run] budget_usd              TICKETGRAPH_BUDGET_USD     --budget
    where to stop early                                   STOP_AFTER, TICKETGRAPH_…  --stop-after

An environment value is checked where it is read (`workers.settings.load`: one sentence
naming the variable as written); a file value by `Workspace.config` (naming its key).
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from orchestrator.config.environment import GraphSettings
from orchestrator.config.tables import AngleConfig, WorkerConfig, WorkspaceConfig
from orchestrator.config.workspace import Workspace
from orchestrator.errors import ConfigError
from orchestrator.run.records import RoleSettings, RunConfig, WorkerSpec
from workers.settings import HarnessSettings

ROLE_KEYS = ("model", "max_tokens", "temperature", "max_turns", "budget_usd")
TEMPLATE_FIELDS = ("ticket_id", "category", "subject", "sender")


def load(workspace: Workspace, graph: GraphSettings, llm: HarnessSettings) -> WorkspaceConfig:
    """The workspace's settings with the environment and the flags laid over them
    (`graph` holds TICKETGRAPH_* and the flags, `llm` LLM_*)."""
    tables = workspace.config().model_dump(exclude_unset=True)
    workers = list(tables.get("workers", {}))
    try:
        return WorkspaceConfig.model_validate(_laid_over(tables, overrides(graph, llm, workers)))
    except ValidationError as exc:  # each value passed on its own: only a combination fails
        raise ConfigError(
            f"the environment and {workspace.root / 'ticketgraph.toml'} "
            f"disagree: {exc.errors()[0]['msg']}"
        ) from None


def overrides(
    graph: GraphSettings, llm: HarnessSettings, workers: list[str] | None = None
) -> dict[str, Any]:
    """What the environment and the flags set, shaped as ticketgraph.toml's tables.
    LLM_MODEL, LLM_MAX_TOKENS and LLM_TEMPERATURE are for every role: [harness]'s, the
    router's, each of `workers` and the evaluator's."""
    out: dict[str, Any] = {}
    if graph.pool_size is not None:
        out["graph"] = {"pool_size": graph.pool_size}
    if graph.budget_usd is not None:
        out["run"] = {"budget_usd": graph.budget_usd}
    every_role = {
        key: value
        for key, value in (
            ("model", llm.model),
            ("max_tokens", llm.max_tokens),
            ("temperature", llm.temperature),
        )
        if value is not None
    }
    if every_role:
        out["harness"] = {**every_role, "router": dict(every_role)}
        out["workers"] = {name: dict(every_role) for name in workers or []}
        out["evaluator"] = dict(every_role)
    if "prices" in llm.model_fields_set:
        out["prices"] = llm.prices.model_dump()
    return out


def _laid_over(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """`base` with `top`'s tables merged in key by key; prices are replaced whole."""
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict) and key != "prices":
            merged[key] = _laid_over(merged[key], value)
        else:
            merged[key] = value
    return merged


def run_config(
    workspace: Workspace, config: WorkspaceConfig, graph: GraphSettings, llm: HarnessSettings
) -> RunConfig:
    """The run's effective configuration, fixed at submit time so every worker agrees."""
    harness, router, evaluator = config.harness, config.harness.router, config.evaluator
    return RunConfig(
        categories=config.categories,
        pool_size=config.graph.pool_size,
        max_rounds=config.gate.max_rounds,
        filler_phrases=config.gate.filler_phrases,
        gate_off=config.gate.off,
        min_chars=config.gate.min_chars,
        max_chars=config.gate.max_chars,
        model=harness.model,
        max_tokens=harness.max_tokens,
        temperature=harness.temperature,
        token_param=llm.token_param,
        tool_call_text_fallback=harness.tool_call_text_fallback,
        evaluator=evaluator.enabled,
        evaluator_model=evaluator.model or harness.model,
        evaluator_max_tokens=evaluator.max_tokens,
        evaluator_temperature=evaluator.temperature,
        evaluator_budget_usd=evaluator.budget_usd,
        prices=config.prices,
        router_model=router.model or harness.model,
        router_max_tokens=router.max_tokens,
        router_temperature=router.temperature,
        router_context_tokens=router.context_tokens,
        router_batch_tickets=router.batch_tickets,
        max_turns=harness.max_turns,
        budget_usd=harness.budget_usd,  # its stored name: RunConfig.agent_budget_usd
        run_budget_usd=config.run.budget_usd,
        ticket_budget_usd=config.run.ticket_budget_usd,
        roles=roles(workspace, config),
        workers={name: _worker(workspace, name, w) for name, w in config.workers.items()},
        templates={
            name: _template(workspace, name, t.file) for name, t in config.templates.items()
        },
        checks=config.gate.checks,
        approval_expire_h=config.approvals.expire_h,
        audit_share=config.review.audit_share,
        stop_after=graph.stop_after,
        route_chars=config.inbox.route_chars,
        scripted=not llm.base_url,
    )


def declared(workspace: Workspace) -> RunConfig:
    """The run configuration the workspace alone gives (its tables over the defaults, no
    environment, no flags): what a peer or a tool reading the workspace needs."""
    graph, llm = GraphSettings(), HarnessSettings()
    return run_config(workspace, workspace.config(), graph, llm)


def roles(workspace: Workspace, config: WorkspaceConfig) -> dict[str, RoleSettings]:
    """What `[harness.router]` sets (or the environment sets for every role), with its
    prompt_file read now, so every worker uses the same text."""
    table = config.harness.router
    batching = {"prompt_file", "context_tokens", "batch_tickets"}  # not a role's setting
    router = RoleSettings(**table.model_dump(exclude=batching, exclude_unset=True))
    if table.prompt_file:
        router.prompt = _text(workspace, "[harness.router] prompt_file", table.prompt_file)
    return {"router": router} if router.model_dump(exclude_none=True) else {}


def _worker(workspace: Workspace, name: str, table: WorkerConfig) -> WorkerSpec:
    """A worker as the run fixes it: its prompt's (or each angle's) text read now, its caps
    as set."""
    angles = {
        angle: _prompt(workspace, f"[workers.{name}.angles.{angle}]", given)
        for angle, given in table.angles.items()
    }
    prompt = (
        next(iter(angles.values())) if angles else _prompt(workspace, f"[workers.{name}]", table)
    )
    own = table.model_dump(include=set(ROLE_KEYS), exclude_unset=True)
    return WorkerSpec(
        **own,
        description=table.description,
        prompt=prompt,
        angles=angles,
        tools=table.tools,
        reads=table.reads,
        approval=table.approval,
    )


def _prompt(workspace: Workspace, table: str, given: WorkerConfig | AngleConfig) -> str:
    """The text of a system prompt a table gives inline or as a workspace file."""
    if given.prompt_file is not None:
        return _text(workspace, f"{table} prompt_file", given.prompt_file)
    return (given.prompt or "").strip()


def _template(workspace: Workspace, name: str, file: str) -> str:
    """A template's text, read now; `ConfigError` if it names a field a ticket lacks."""
    text = _text(workspace, f"[templates.{name}] file", file)
    try:
        text.format_map(dict.fromkeys(TEMPLATE_FIELDS, ""))
    except (KeyError, ValueError, IndexError) as exc:
        fields = ", ".join("{" + f + "}" for f in TEMPLATE_FIELDS)
        raise ConfigError(
            f"[templates.{name}] file {file!r} says {exc}, which is not one of {fields} "
            "(write a literal brace as {{ or }})"
        ) from None
    return text


def _text(workspace: Workspace, key: str, name: str) -> str:
    """The text of a workspace file a table names; `ConfigError` naming the key."""
    try:
        text = (workspace.root / name).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{key} {name!r}: {exc}") from exc
    if not text:
        raise ConfigError(f"{key} {name!r} is empty")
    return text
