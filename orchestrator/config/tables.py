"""ticketgraph.toml's tables, strict: a misspelt key is an error naming the closest one, a
value out of range an error naming its key, both before anything is claimed."""

from __future__ import annotations

import difflib
import tomllib
from pathlib import Path
from typing import Any, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from orchestrator.errors import ConfigError
from orchestrator.steps import gate
from orchestrator.steps.sandbox import root_problem
from workers.pricing import PriceTable

# Categories a worker (an agent with its own prompt and tools) can draft; any other
# category gets the template reply.
WORKER_CATEGORIES = ("billing", "bug")


class _Table(BaseModel):
    """A table of ticketgraph.toml: a misspelt key is an error, not a silent default."""

    model_config = ConfigDict(extra="forbid")


class GraphConfig(_Table):
    """How tickets are routed and fanned out."""

    categories: list[str] = ["billing", "bug", "other"]
    pool_size: int = Field(default=2, ge=1)

    @field_validator("categories")
    @classmethod
    def _one_with_a_worker(cls, categories: list[str]) -> list[str]:
        if not set(categories) & set(WORKER_CATEGORIES):
            raise ValueError(
                f"needs at least one category with a worker ({', '.join(WORKER_CATEGORIES)}); "
                "with none, every ticket would get the template reply"
            )
        return categories


class InboxConfig(_Table):
    """What may be claimed from inbox/ and how much of it the router sees."""

    max_bytes: int = Field(default=64 * 1024, ge=1, description="bigger files are quarantined")
    route_chars: int = Field(default=2000, ge=100, description="ticket text in the routing prompt")
    settle_s: float = Field(default=1.0, ge=0, description="skip files modified this recently")
    id_header: str = Field(default="X-Ticket-Id", description=".eml header naming the ticket id")


class GateConfig(_Table):
    """The deterministic gate and the review loop."""

    max_rounds: int = Field(default=3, ge=1, description="rewrites per ticket at most")
    filler_phrases: list[str] = [
        "please wait a moment",
        "thank you for your patience",
        "we will resolve this soon",
    ]
    off: list[str] = Field(default_factory=list, description="gate checks turned off")
    min_chars: int = Field(default=40, ge=0)
    max_chars: int = Field(default=4000, ge=1)

    @field_validator("off")
    @classmethod
    def _known_checks(cls, off: list[str]) -> list[str]:
        unknown = sorted(set(off) - set(gate.CHECKS))
        if unknown:
            raise ValueError(f"unknown checks {unknown}; the checks are {', '.join(gate.CHECKS)}")
        return off


class RoleConfig(_Table):
    """One role's own settings (`[harness.router]`, `[harness.billing]`, `[harness.bug]`);
    a key left unset falls back to `[harness]`."""

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    max_turns: int | None = Field(default=None, ge=1, description="per agent run")
    budget_usd: float | None = Field(default=None, gt=0, description="per agent run")
    # A file of the workspace whose text replaces the role's built-in system prompt (the
    # router's may say {categories}, which becomes the configured list).
    prompt_file: str | None = None

    @field_validator("prompt_file")
    @classmethod
    def _inside(cls, prompt_file: str | None) -> str | None:
        if prompt_file is not None and (problem := root_problem(prompt_file)) is not None:
            raise ValueError(f"{prompt_file!r} {problem}")
        return prompt_file


class RouterConfig(RoleConfig):
    """The routing call: small and deterministic unless set otherwise."""

    max_tokens: int | None = Field(default=512, ge=1)
    temperature: float | None = Field(default=0.0, ge=0, le=2)


class HarnessConfig(_Table):
    """Limits and request settings of each agent run inside the graph."""

    model: str = "demo"
    max_turns: int = Field(default=6, ge=1)
    budget_usd: float | None = Field(default=0.05, gt=0)
    max_tokens: int | None = Field(default=1024, ge=1, description="per reply")
    temperature: float | None = Field(default=0.2, ge=0, le=2)
    # A reply whose text is a tool call (bare JSON, <tool_call>, a fenced block) runs it.
    tool_call_text_fallback: bool = True
    router: RouterConfig = RouterConfig()
    billing: RoleConfig = RoleConfig()
    bug: RoleConfig = RoleConfig()

    def role(self, name: str) -> RoleConfig:
        """The table of `name` (router or a worker category)."""
        return getattr(self, name)


class EvaluatorConfig(_Table):
    """An optional model-based check after the deterministic gate (`[evaluator]`, off by
    default): it sees drafts the gate passed and answers PASS or FAIL: <why>, strictly."""

    enabled: bool = False
    model: str | None = None  # unset: the workers' model
    max_tokens: int | None = Field(default=200, ge=1)
    temperature: float | None = Field(default=0.0, ge=0, le=2)
    budget_usd: float | None = Field(default=0.01, gt=0, description="per evaluation")


DEFAULT_READS = {"bug": ["kb"], "billing": ["data/orders.json"]}


class ToolsConfig(_Table):
    """What each worker's tools may read: folders or files of the workspace, per category."""

    reads: dict[str, list[str]] = Field(default_factory=lambda: dict(DEFAULT_READS))

    @field_validator("reads")
    @classmethod
    def _safe_roots(cls, reads: dict[str, list[str]]) -> dict[str, list[str]]:
        for category, roots in reads.items():
            if category not in WORKER_CATEGORIES:
                raise ValueError(f"{category!r} has no worker ({', '.join(WORKER_CATEGORIES)})")
            for root in roots:
                if (problem := root_problem(root)) is not None:
                    raise ValueError(f"{category}: {root!r} {problem}")
        return reads


class WorkspaceConfig(BaseModel):
    """The whole `ticketgraph.toml`."""

    model_config = {"extra": "forbid"}

    graph: GraphConfig = GraphConfig()
    inbox: InboxConfig = InboxConfig()
    gate: GateConfig = GateConfig()
    harness: HarnessConfig = HarnessConfig()
    tools: ToolsConfig = ToolsConfig()
    evaluator: EvaluatorConfig = EvaluatorConfig()
    # USD per million tokens, by model; LLM_PRICES (the same shape, as JSON) overrides it.
    prices: PriceTable = PriceTable()


def _first_problem(exc: ValidationError) -> str:
    """The first validation error as `[table] key: message`."""
    error = exc.errors()[0]
    where = [str(part) for part in error["loc"]]
    key = f"[{where[0]}] {'.'.join(where[1:])}" if len(where) > 1 else where[0] if where else ""
    message = error["msg"]
    if error["type"] == "extra_forbidden":
        message = "unknown key"
        close = difflib.get_close_matches(where[-1], _known_keys(where[:-1]), n=1, cutoff=0.5)
        if close:
            message += f"; did you mean {close[0]!r}?"
    more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    return f"{key}: {message}{more}"


def _known_keys(path: list[str]) -> list[str]:
    """The keys the table at `path` (e.g. ["harness", "router"]) accepts."""
    model: Any = WorkspaceConfig
    for part in path:
        if get_origin(model) is dict:  # [prices.models."name"]: every value is one type
            model = get_args(model)[1]
            continue
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        model = field.annotation
    return list(getattr(model, "model_fields", {}))


def read(path: Path) -> WorkspaceConfig:
    """The tables of the ticketgraph.toml at `path` (defaults when there is none);
    `ConfigError` naming the key when a value is unknown or out of range."""
    if not path.exists():
        return WorkspaceConfig()
    try:
        return WorkspaceConfig.model_validate(tomllib.loads(path.read_text(encoding="utf-8")))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    except ValidationError as exc:
        raise ConfigError(f"{path}: {_first_problem(exc)}") from exc
