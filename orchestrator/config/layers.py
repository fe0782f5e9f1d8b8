"""A run's settings, in one model and one order: defaults < ticketgraph.toml < environment <
flags. The model is `WorkspaceConfig` (the tables of ticketgraph.toml, strict); the
environment and the flags are laid over the file's tables and the whole validated once more,
then fixed into the run's `RunConfig`, which every worker reads.

    setting                 ticketgraph.toml              environment                flag
    tickets in flight       [graph] pool_size             POOL_SIZE, TICKETGRAPH_…   --pool-size
    model of every role     [harness] model, [*.] model   LLM_MODEL
    tokens per reply        [harness] max_tokens, …       LLM_MAX_TOKENS
    temperature             [harness] temperature, …      LLM_TEMPERATURE
    prices                  [prices]                      LLM_PRICES (replaces it)
    where to stop early                                   STOP_AFTER, TICKETGRAPH_…  --stop-after

An environment value is checked where it is read (`workers.settings.load`: one sentence
naming the variable as written); a file value by `Workspace.config` (naming its key).
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from orchestrator.config.environment import GraphSettings
from orchestrator.config.tables import WORKER_CATEGORIES, WorkspaceConfig
from orchestrator.errors import ConfigError
from orchestrator.run.records import RoleSettings, RunConfig
from orchestrator.workspace import Workspace
from workers.settings import HarnessSettings

ROLES = ("router", *WORKER_CATEGORIES)


def load(workspace: Workspace, graph: GraphSettings, llm: HarnessSettings) -> WorkspaceConfig:
    """The workspace's settings with the environment and the flags laid over them
    (`graph` holds TICKETGRAPH_* and the flags, `llm` LLM_*)."""
    tables = workspace.config().model_dump(exclude_unset=True)
    try:
        return WorkspaceConfig.model_validate(_laid_over(tables, overrides(graph, llm)))
    except ValidationError as exc:  # each value passed on its own: only a combination fails
        raise ConfigError(
            f"the environment and {workspace.root / 'ticketgraph.toml'} "
            f"disagree: {exc.errors()[0]['msg']}"
        ) from None


def overrides(graph: GraphSettings, llm: HarnessSettings) -> dict[str, Any]:
    """What the environment and the flags set, shaped as ticketgraph.toml's tables.
    LLM_MODEL, LLM_MAX_TOKENS and LLM_TEMPERATURE are for every role: the workers', the
    router's, each category's and the evaluator's."""
    out: dict[str, Any] = {}
    if graph.pool_size is not None:
        out["graph"] = {"pool_size": graph.pool_size}
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
        out["harness"] = {**every_role, **{role: dict(every_role) for role in ROLES}}
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
        categories=config.graph.categories,
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
        max_turns=harness.max_turns,
        budget_usd=harness.budget_usd,
        roles=roles(workspace, config),
        stop_after=graph.stop_after,
        route_chars=config.inbox.route_chars,
        reads=config.tools.reads,
    )


def roles(workspace: Workspace, config: WorkspaceConfig) -> dict[str, RoleSettings]:
    """What `[harness.router]`, `[harness.billing]` and `[harness.bug]` set (or the
    environment set for every role), with each prompt_file read now, so every worker uses
    the same text; `ConfigError` naming the key if a prompt file cannot be used."""
    out = {}
    for name in ROLES:
        table = config.harness.role(name)
        role = RoleSettings(**table.model_dump(exclude={"prompt_file"}, exclude_unset=True))
        if table.prompt_file:
            role.prompt = _prompt_text(workspace, name, table.prompt_file)
        if role.model_dump(exclude_none=True):
            out[name] = role
    return out


def _prompt_text(workspace: Workspace, role: str, name: str) -> str:
    try:
        text = (workspace.root / name).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"[harness.{role}] prompt_file {name!r}: {exc}") from exc
    if not text:
        raise ConfigError(f"[harness.{role}] prompt_file {name!r} is empty")
    return text
