"""A workspace's declarations: the tools its workers name and the checks its gate names,
imported the way Celery imports task modules, and their fingerprint.

A worker's `tools` are built-in names (`read_file`, `list_files`, `search_files`,
`lookup_json`) or import paths (`my_tools:track_parcel`) of functions made tools with
`@workers.tool`; `[gate] checks` are import paths of functions called as
`check(draft_text, ticket)`; an approval rule may be the import path of a function too.
A module of the workspace's own folder is imported apart from any other workspace's
(`_Modules`); any other by its installed name.

Every process that runs a ticket must run the same code. A run records the fingerprint of
what it was started with (the tools' names and schemas, the checks' names, and the bytes of
every module they come from, hashed as each module was imported); a worker process compares
its own and refuses the run's tasks when they differ (another version of a tools module on
another machine), instead of drafting with other tools.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import json
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from orchestrator.config import policy
from orchestrator.errors import ConfigError
from orchestrator.run.records import RunConfig, WorkerSpec
from workers.builtin_tools import BUILTINS
from workers.tools import Tool

if TYPE_CHECKING:
    from orchestrator.config.workspace import Workspace

Check = Callable[[str, Any], list[str]]

_module_hashes: dict[str, str] = {}  # module (as imported) -> sha256 of its file
_loaded: dict[tuple[str, str], Declarations] = {}  # (workspace, names) -> what it declared
_lock = threading.Lock()
# (workspace, a run's fingerprint) this process's declarations matched: what it imported
# never changes while it lives (`_loaded`), so neither does the answer.
_matched: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Declarations:
    """What one workspace declares: every tool by the name its worker lists, every check by
    its import path, and the fingerprint of it all."""

    tools: dict[str, Tool]
    checks: dict[str, Check]
    fingerprint: str
    # An approval rule that is an import path -> the function it names.
    rule_functions: dict[str, Callable[[dict[str, Any]], Any]] = field(default_factory=dict)

    def tools_of(self, worker: WorkerSpec) -> list[Tool]:
        """A worker's catalog, in the order its `tools` list gives."""
        return [self.tools[name] for name in worker.tools]

    def gate_checks(self, paths: list[str]) -> list[tuple[str, Check]]:
        """The team's own checks, each with the name its failures carry in a gate report."""
        return [(getattr(self.checks[p], "__name__", p), self.checks[p]) for p in paths]


def load(workspace: Workspace, config: RunConfig) -> Declarations:
    """Import what a run's `config` declares (once per process and workspace); `ConfigError`,
    naming the table and the module, if something cannot be imported or is not a tool."""
    tools = {n: w.tools for n, w in config.workers.items()}
    rules = {n: w.approval for n, w in config.workers.items()}
    return declared(workspace, tools, config.checks, rules)


def preload(workspace: Workspace) -> Declarations:
    """Import what the workspace's ticketgraph.toml declares: a worker process does this for
    each workspace it serves as it starts, and stops (exit 78) if it cannot."""

    tables = workspace.config()
    tools = {name: worker.tools for name, worker in tables.workers.items()}
    rules = {name: worker.approval for name, worker in tables.workers.items()}
    return declared(workspace, tools, tables.gate.checks, rules)


def declared(
    workspace: Workspace,
    tools: dict[str, list[str]],
    checks: list[str],
    rules: dict[str, dict[str, str]] | None = None,
) -> Declarations:
    """What `tools` (worker -> its tools list), `checks` and the workers' approval `rules`
    (worker -> tool -> rule) name, imported and checked (cached)."""
    rules = rules or {}
    key = (
        str(workspace.root.resolve()),
        json.dumps([sorted(tools.items()), checks, rules], sort_keys=True),
    )
    with _lock:
        if key not in _loaded:
            _loaded[key] = _import(workspace, tools, checks, rules)
        return _loaded[key]


def mismatch(workspace: Workspace, config: RunConfig) -> str | None:
    """Why this process must not run a task of the run `config` belongs to (its own
    declarations differ from those the run was started with), or None."""
    if not config.fingerprint:  # a run from before fingerprints
        return None
    seen = (str(workspace.root), config.fingerprint)
    if seen in _matched:  # every ticket's task asks; a process imports its modules once
        return None
    try:
        mine = load(workspace, config).fingerprint
    except ConfigError as exc:
        return f"this worker cannot load the run's declarations: {exc}"
    if mine == config.fingerprint:
        _matched.add(seen)
        return None
    return (
        f"this worker's tools and checks differ from those the run was started with "
        f"(fingerprint {mine[:12]}, the run's {config.fingerprint[:12]}): run every worker "
        "with the same ticketgraph.toml and tools modules, then resume"
    )


def _import(
    workspace: Workspace,
    listed: dict[str, list[str]],
    paths: list[str],
    rules: dict[str, dict[str, str]],
) -> Declarations:
    modules = _Modules(workspace)
    tools: dict[str, Tool] = {}
    for category, names in listed.items():
        seen: set[str] = set()
        for name in names:
            tool = tools.get(name) or _tool(modules, category, name)
            if tool.name in seen:
                raise ConfigError(f"[workers.{category}] tools: two tools are named {tool.name!r}")
            seen.add(tool.name)
            tools[name] = tool
        _check_rules(category, [tools[n] for n in names], rules.get(category, {}))
    checks = {path: _check(modules, path) for path in paths}
    rule_paths = sorted({r for table in rules.values() for r in table.values() if ":" in r})
    functions = {
        path: modules.attribute("[workers] approval", path)
        for path in rule_paths
        if policy.is_import_path(path)
    }
    fingerprint = _fingerprint(modules, tools, checks, sorted(functions))
    return Declarations(tools, checks, fingerprint, functions)


def _check_rules(category: str, tools: list[Tool], table: dict[str, str]) -> None:
    """`ConfigError` for an approval entry of a tool the worker lacks, or a bad rule."""
    by_name = {t.name: t for t in tools}
    for name, rule in table.items():
        if name not in by_name:
            known = ", ".join(by_name) or "none"
            raise ConfigError(f"[workers.{category}] approval: it has no tool {name!r} ({known})")
        try:
            policy.check(rule, set(by_name[name].args.model_fields))
        except ConfigError as exc:
            raise ConfigError(f"[workers.{category}] approval {name}: {exc}") from None


def _tool(modules: _Modules, category: str, name: str) -> Tool:
    if ":" not in name:
        if name not in BUILTINS:
            known = ", ".join(BUILTINS)
            raise ConfigError(
                f"[workers.{category}] tools: {name!r} is no built-in tool ({known}); name "
                "your own as 'module:function'"
            )
        return BUILTINS[name]
    found = modules.attribute(f"[workers.{category}] tools", name)
    if not isinstance(found, Tool):
        raise ConfigError(
            f"[workers.{category}] tools: {name} is not a tool: decorate it with @tool "
            "(from workers import tool)"
        )
    return found


def _check(modules: _Modules, path: str) -> Check:
    found = modules.attribute("[gate] checks", path)
    if not callable(found):
        raise ConfigError(f"[gate] checks: {path} is not a function")
    return found  # type: ignore[no-any-return]


class _Modules:
    """The modules one workspace names, imported apart from every other workspace's.

    A module of the workspace's own folder (`my_tools.py`, or a package `my_tools/`) is
    imported as a submodule of a package made for that folder, so a worker that serves two
    workspaces with a `my_tools.py` each runs each one's own (it imports siblings with
    `from . import helpers`). Any other module is imported by its name, as installed. The
    folder is also on the import path, after everything installed, for a module that
    imports a sibling by its plain name.
    """

    def __init__(self, workspace: Workspace) -> None:
        self.root = workspace.root.resolve()
        if str(self.root) not in sys.path:
            sys.path.append(str(self.root))  # after everything installed: shadows nothing
        self.package = "_tg_workspace_" + hashlib.sha1(str(self.root).encode()).hexdigest()[:12]

    def qualified(self, name: str) -> str:
        """The name `name` is imported under (its workspace package's, if it is the
        workspace's own)."""
        top = name.split(".")[0]
        if not ((self.root / f"{top}.py").is_file() or (self.root / top / "__init__.py").is_file()):
            return name
        if self.package not in sys.modules:
            spec = importlib.machinery.ModuleSpec(self.package, None, is_package=True)
            spec.submodule_search_locations = [str(self.root)]
            package = importlib.util.module_from_spec(spec)
            sys.modules[self.package] = package
        return f"{self.package}.{name}"

    def attribute(self, key: str, path: str) -> Any:
        module_name, _, attribute = path.partition(":")
        module = self.module(key, module_name)
        try:
            return getattr(module, attribute)
        except AttributeError:
            raise ConfigError(f"{key}: module {module_name!r} has no {attribute!r}") from None

    def module(self, key: str, name: str) -> ModuleType:
        qualified = self.qualified(name)
        try:
            module = importlib.import_module(qualified)
        except ModuleNotFoundError as exc:
            missing = {name, name.split(".")[0], qualified, qualified.rsplit(".", 1)[0]}
            if exc.name not in missing:
                raise ConfigError(f"{key}: module {name!r} failed to import: {exc}") from exc
            raise ConfigError(
                f"{key}: no module {name!r}: it must be in the workspace folder or on every "
                "worker's import path (pip install it, or PYTHONPATH)"
            ) from exc
        except Exception as exc:  # a team's module can raise anything while it imports
            raise ConfigError(
                f"{key}: module {name!r} failed to import ({type(exc).__name__}: {exc})"
            ) from exc
        if qualified not in _module_hashes:
            file = getattr(module, "__file__", None)
            data = Path(file).read_bytes() if file else name.encode()
            _module_hashes[qualified] = hashlib.sha256(data).hexdigest()
        return module

    def hash_of(self, name: str) -> str:
        """The sha256 of the module's file, as it was imported."""
        qualified = self.qualified(name)
        if qualified not in _module_hashes:
            self.module("", name)
        return _module_hashes[qualified]


def _fingerprint(
    modules: _Modules, tools: dict[str, Tool], checks: dict[str, Check], rules: list[str]
) -> str:
    """One hash of every tool (name, schema, module), check (path, module) and function an
    approval rule names (path, module)."""
    parts: list[Any] = [[r, modules.hash_of(r.partition(":")[0])] for r in rules]
    for listed, tool in sorted(tools.items()):
        module = listed.partition(":")[0] if ":" in listed else "workers.builtin_tools"
        parts.append([listed, tool.schema(), tool.read_only, modules.hash_of(module)])
    parts += [[path, modules.hash_of(path.partition(":")[0])] for path in sorted(checks)]
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
