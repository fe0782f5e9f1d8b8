"""ticketgraph.toml's tables, strict: a misspelt key is an error naming the closest one, a
value out of range an error naming its key, both before anything is claimed."""

from __future__ import annotations

import difflib
import re
import tomllib
from pathlib import Path
from typing import Any, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from orchestrator.errors import ConfigError
from workers.pricing import PriceTable
from workers.sandbox import root_problem

# What an approval policy may say of a tool (a rule on the call's arguments is any other text,
# recorded now and enforced where approvals are).
APPROVAL_WORDS = ("always", "never")
# The review gate's checks (steps/gate.py) by name, as [gate] off may name them.
CHECKS = ("echo", "not_prose", "length", "unsupported_fact")
# An angle's name: part of its agent state's file name (agents/<ticket>.draft-<angle>.json).
ANGLE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")


class _Table(BaseModel):
    """A table of ticketgraph.toml: a misspelt key is an error, not a silent default."""

    model_config = ConfigDict(extra="forbid")


class GraphConfig(_Table):
    """How tickets are routed and fanned out."""

    # The router's choices, in this order (unset: every [workers.*] and [templates.*]).
    categories: list[str] | None = None
    pool_size: int = Field(default=2, ge=1)


class RunTable(_Table):
    """What one run may spend in all, across every worker (`[run]`; unset: no limit)."""

    budget_usd: float | None = Field(default=None, gt=0, le=1e6, description="the whole run")
    ticket_budget_usd: float | None = Field(default=None, gt=0, le=1e6, description="a ticket")


class InboxConfig(_Table):
    """What may be claimed from inbox/ and how much of it the router sees."""

    max_bytes: int = Field(default=64 * 1024, ge=1, description="bigger files are quarantined")
    route_chars: int = Field(default=2000, ge=100, description="ticket text in the routing prompt")
    settle_s: float = Field(default=1.0, ge=0, description="skip files modified this recently")
    id_header: str = Field(default="X-Ticket-Id", description=".eml header naming the ticket id")


def _a_workspace_file(name: str | None) -> str | None:
    """A file of the workspace a table names (a prompt, a template): inside it, no dotfile."""
    if name is not None and (problem := root_problem(name)) is not None:
        raise ValueError(f"{name!r} {problem}")
    return name


def _workspace_files(names: list[str]) -> list[str]:
    """Folders or files of the workspace a table names, each as `_a_workspace_file`."""
    for name in names:
        _a_workspace_file(name)
    return names


def _an_import_path_like(name: str, example: str) -> None:
    """`ValueError` unless `name` is an import path ("module:name") like `example`."""
    if not _an_import_path(name):
        raise ValueError(f"{name!r} is not an import path like {example!r}")


class GateConfig(_Table):
    """The deterministic gate and the review loop."""

    # The team's own checks, by import path ("module:function"): each is called as
    # check(draft_text, ticket) and returns the reasons the draft fails (none: it passes).
    checks: list[str] = []

    max_rounds: int = Field(default=3, ge=0, description="rewrites per ticket at most (0: none)")
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
        unknown = sorted(set(off) - set(CHECKS))
        if unknown:
            raise ValueError(f"unknown checks {unknown}; the checks are {', '.join(CHECKS)}")
        return off

    @field_validator("checks")
    @classmethod
    def _import_paths(cls, checks: list[str]) -> list[str]:
        for path in checks:
            _an_import_path_like(path, "my_checks:no_discounts")
        return checks


class RoleConfig(_Table):
    """One role's own request settings and caps; a key left unset falls back to
    `[harness]`."""

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    max_turns: int | None = Field(default=None, ge=1, description="per agent run")
    budget_usd: float | None = Field(default=None, gt=0, description="per agent run")


class RouterConfig(RoleConfig):
    """The routing call (`[harness.router]`): small and deterministic unless set otherwise."""

    max_tokens: int | None = Field(default=512, ge=1)
    temperature: float | None = Field(default=0.0, ge=0, le=2)
    # A workspace file whose text replaces the built-in routing prompt; it may say
    # {categories}, which becomes the categories with their descriptions.
    prompt_file: str | None = None
    # A run's tickets are routed in batches that fit the model (steps/batches.py): the
    # prompt within its context window, the expected reply within max_tokens.
    context_tokens: int = Field(default=8192, ge=256, description="the model's window")
    batch_tickets: int | None = Field(default=None, ge=1, description="at most, per call")

    _inside = field_validator("prompt_file")(_a_workspace_file)

    @model_validator(mode="after")
    def _reply_fits(self) -> RouterConfig:
        if self.max_tokens is not None and self.max_tokens >= self.context_tokens:
            raise ValueError(
                f"[harness.router] max_tokens ({self.max_tokens}) must be less than "
                f"context_tokens ({self.context_tokens}): the reply shares the model's window "
                "with the prompt"
            )
        return self


class AngleConfig(_Table):
    """One angle of a worker (`[workers.<category>.angles.<name>]`): another system prompt
    for the same task, with the same tools and caps. A worker with two or more drafts each
    ticket once from each; the gate and then the length choose (steps/voting.py)."""

    prompt: str | None = None  # inline
    prompt_file: str | None = None  # ... or a workspace file

    _inside = field_validator("prompt_file")(_a_workspace_file)

    @model_validator(mode="after")
    def _one_prompt(self) -> AngleConfig:
        if (self.prompt is None) == (self.prompt_file is None):
            raise ValueError("give the angle's system prompt: prompt (inline) or prompt_file")
        return self


class WorkerConfig(RoleConfig):
    """One category's worker (`[workers.<category>]`): an agent with its own prompt (or two
    or more `angles`, voted between), tools, readable files and caps."""

    description: str = Field(default="", description="one line, used in the routing prompt")
    prompt: str | None = None  # its system prompt, inline
    prompt_file: str | None = None  # ... or a workspace file
    # Two or more prompts for the same task, by name, in the order declared (ties go to
    # the first); instead of `prompt`.
    angles: dict[str, AngleConfig] = {}
    tools: list[str] = []  # built-in names (read_file, ...) or import paths (module:name)
    reads: list[str] = []  # folders or files of the workspace its tools may read
    # tool name -> "always", "never" or a rule on the call's arguments
    approval: dict[str, str] = {}

    _inside = field_validator("prompt_file")(_a_workspace_file)

    _safe_roots = field_validator("reads")(_workspace_files)

    @field_validator("tools")
    @classmethod
    def _tool_names(cls, tools: list[str]) -> list[str]:
        for name in tools:
            if ":" in name:  # else a built-in tool's name
                _an_import_path_like(name, "my_tools:track_parcel")
        return tools

    @field_validator("angles")
    @classmethod
    def _angle_names(cls, angles: dict[str, AngleConfig]) -> dict[str, AngleConfig]:
        for name in angles:
            if not ANGLE_NAME.match(name):
                raise ValueError(
                    f"angle {name!r}: an angle's name is 1-32 letters, digits, '-' or '_', "
                    "starting with a letter or digit (it names the angle's agent state file)"
                )
        if len(angles) == 1:
            raise ValueError(
                "one angle is no vote: declare two or more, or give the worker's prompt instead"
            )
        return angles

    @model_validator(mode="after")
    def _one_prompt(self) -> WorkerConfig:
        given = self.prompt is not None or self.prompt_file is not None
        if self.angles and given:
            raise ValueError(
                "a worker with angles takes its prompts from them: remove its prompt "
                "(or prompt_file), or its angles"
            )
        if not self.angles and (self.prompt is None) == (self.prompt_file is None):
            raise ValueError("give the worker's system prompt: prompt (inline) or prompt_file")
        return self


class TemplateConfig(_Table):
    """The reply of a category without a worker (`[templates.<category>]`): a workspace
    file whose text may say {ticket_id}, {category}, {subject}, {sender}."""

    file: str

    _inside = field_validator("file")(_a_workspace_file)


class HarnessConfig(_Table):
    """The defaults of every agent run inside the graph (a worker's own table wins)."""

    model: str = "demo"
    max_turns: int = Field(default=6, ge=1)
    budget_usd: float | None = Field(default=0.05, gt=0)
    max_tokens: int | None = Field(default=1024, ge=1, description="per reply")
    temperature: float | None = Field(default=0.2, ge=0, le=2)
    # A reply whose text is a tool call (bare JSON, <tool_call>, a fenced block) runs it.
    tool_call_text_fallback: bool = True
    router: RouterConfig = RouterConfig()


class ApprovalsConfig(_Table):
    """Tool calls that wait for a person (a worker's `approval` says which)."""

    expire_h: float = Field(
        default=72, gt=0, description="a call undecided this long ends needs_human"
    )


class ReviewConfig(_Table):
    """What a person sees of the replies the gate passed (`[review]`)."""

    # A deterministic sample of this share of the passes enters the queue as "audit"
    # (orchestrator/people/audit.py); nothing waits on it.
    audit_share: float = Field(default=0.0, ge=0, le=1, description="of the passes, audited")


class EvaluatorConfig(_Table):
    """An optional model-based check after the deterministic gate (`[evaluator]`, off by
    default): it sees drafts the gate passed and answers PASS or FAIL: <why>, strictly."""

    enabled: bool = False
    model: str | None = None  # unset: the workers' model
    max_tokens: int | None = Field(default=200, ge=1)
    temperature: float | None = Field(default=0.0, ge=0, le=2)
    budget_usd: float | None = Field(default=0.01, gt=0, description="per evaluation")


class WorkspaceConfig(BaseModel):
    """The whole `ticketgraph.toml`."""

    model_config = {"extra": "forbid"}

    graph: GraphConfig = GraphConfig()
    run: RunTable = RunTable()
    inbox: InboxConfig = InboxConfig()
    gate: GateConfig = GateConfig()
    harness: HarnessConfig = HarnessConfig()
    workers: dict[str, WorkerConfig] = {}
    templates: dict[str, TemplateConfig] = {}
    approvals: ApprovalsConfig = ApprovalsConfig()
    review: ReviewConfig = ReviewConfig()
    evaluator: EvaluatorConfig = EvaluatorConfig()
    # USD per million tokens, by model; LLM_PRICES (the same shape, as JSON) overrides it.
    prices: PriceTable = PriceTable()

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, tables: Any) -> Any:
        """Tables of earlier versions say where they went, instead of `unknown key`."""
        if not isinstance(tables, dict):
            return tables
        harness = tables.get("harness") or {}
        for name, value in harness.items():
            if isinstance(value, dict) and name != "router":
                raise ValueError(
                    f"[harness.{name}] is now [workers.{name}] (the same keys, with the "
                    "worker's description, prompt, tools and reads)"
                )
        if "tools" in tables:
            raise ValueError(
                "[tools] is gone: a worker's readable files are `reads` in its "
                "[workers.<category>] table, and its tools are `tools` there"
            )
        return tables

    @model_validator(mode="after")
    def _every_category_answered(self) -> WorkspaceConfig:
        categories = self.categories
        if not self.workers:
            raise ValueError(
                "no [workers.<category>] table: declare at least one worker (`ticketgraph "
                "init DIR --template minimal` writes an example)"
            )
        for table, names in (("workers", self.workers), ("templates", self.templates)):
            if stray := [n for n in names if n not in categories]:
                raise ValueError(f"[{table}.{stray[0]}] is not in [graph] categories")
        for name in categories:
            if name not in self.workers and name not in self.templates:
                raise ValueError(
                    f"category {name!r} has neither a [workers.{name}] nor a "
                    f"[templates.{name}] table: its tickets would get no reply"
                )
            if name in self.workers and name in self.templates:
                raise ValueError(f"category {name!r} has a worker and a template: keep one")
        return self

    @property
    def categories(self) -> list[str]:
        """The router's choices: [graph] categories, or every worker and template."""
        if self.graph.categories is not None:
            return self.graph.categories
        return [*self.workers, *self.templates]


def _first_problem(exc: ValidationError) -> str:
    """The first validation error as `[table] key: message`."""
    error = exc.errors()[0]
    where = [str(part) for part in error["loc"]]
    message = str(error["msg"]).removeprefix("Value error, ")
    if not where:  # a rule across tables: its message names them
        return message
    key = f"[{'.'.join(where[:-1])}] {where[-1]}" if len(where) > 1 else where[0]
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


def _an_import_path(path: str) -> bool:
    """`package.module:name`."""
    module, _, name = path.partition(":")
    dotted = all(part.isidentifier() for part in module.split("."))
    return bool(module) and dotted and name.isidentifier()


def read(path: Path) -> WorkspaceConfig:
    """The tables of the ticketgraph.toml at `path`; `ConfigError` naming the key when a value
    is unknown or out of range, or the file when it is missing."""
    if not path.exists():
        raise ConfigError(
            f"no {path.name} at {path.parent}: a workspace declares its workers there "
            f"(`ticketgraph init {path.parent}` makes one)"
        )
    try:
        return WorkspaceConfig.model_validate(tomllib.loads(path.read_text(encoding="utf-8")))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    except ValidationError as exc:
        raise ConfigError(f"{path}: {_first_problem(exc)}") from exc
