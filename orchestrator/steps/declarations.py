"""A workspace's declarations: the tools its workers name and the checks its gate names,
imported the way Celery imports task modules, and their fingerprint.

A worker's `tools` are built-in names (`read_file`, `list_files`, `search_files`,
`lookup_json`) or import paths (`my_tools:track_parcel`) of functions made tools with
`@workers.tool`; `[gate] checks` are import paths of functions called as
`check(draft_text, ticket)`. Modules are imported with the workspace's folder on the import
path (after everything else: a workspace module never shadows an installed one).

Every process that runs a ticket must run the same code. A run records the fingerprint of
what it was started with (the tools' names and schemas, the checks' names, and the bytes of
every module they come from, hashed as each module was imported); a worker process compares
its own and refuses the run's tasks when they differ (another version of a tools module on
another machine), instead of drafting with other tools.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from orchestrator.errors import ConfigError
from orchestrator.run.records import RunConfig, WorkerSpec
from workers.builtin_tools import BUILTINS
from workers.tools import Tool

Check = Callable[[str, Any], list[str]]

_module_hashes: dict[str, str] = {}  # module name -> sha256 of its file, as imported
_loaded: dict[tuple[str, str], Declarations] = {}  # (workspace, names) -> what it declared
_lock = threading.Lock()


@dataclass(frozen=True)
class Declarations:
    """What one workspace declares: every tool by the name its worker lists, every check by
    its import path, and the fingerprint of it all."""

    tools: dict[str, Tool]
    checks: dict[str, Check]
    fingerprint: str

    def tools_of(self, worker: WorkerSpec) -> list[Tool]:
        """A worker's catalog, in the order its `tools` list gives."""
        return [self.tools[name] for name in worker.tools]

    def gate_checks(self, paths: list[str]) -> list[tuple[str, Check]]:
        """The team's own checks, each with the name its failures carry in a gate report."""
        return [(getattr(self.checks[p], "__name__", p), self.checks[p]) for p in paths]


def load(workspace: Path, config: RunConfig) -> Declarations:
    """Import what a run's `config` declares (once per process and workspace); `ConfigError`,
    naming the table and the module, if something cannot be imported or is not a tool."""
    return declared(workspace, {n: w.tools for n, w in config.workers.items()}, config.checks)


def preload(workspace: Path) -> Declarations:
    """Import what the workspace's ticketgraph.toml declares: a worker process does this for
    each workspace it serves as it starts, and stops (exit 78) if it cannot."""
    from orchestrator.workspace import Workspace  # the workspace reads its tables (config/)

    tables = Workspace(workspace).config()
    tools = {name: worker.tools for name, worker in tables.workers.items()}
    return declared(workspace, tools, tables.gate.checks)


def declared(workspace: Path, tools: dict[str, list[str]], checks: list[str]) -> Declarations:
    """What `tools` (worker -> its tools list) and `checks` name, imported (cached)."""
    key = (str(workspace.resolve()), json.dumps([sorted(tools.items()), checks]))
    with _lock:
        if key not in _loaded:
            _loaded[key] = _import(workspace, tools, checks)
        return _loaded[key]


def mismatch(workspace: Path, config: RunConfig) -> str | None:
    """Why this process must not run a task of the run `config` belongs to (its own
    declarations differ from those the run was started with), or None."""
    if not config.fingerprint:  # a run from before fingerprints
        return None
    try:
        mine = load(workspace, config).fingerprint
    except ConfigError as exc:
        return f"this worker cannot load the run's declarations: {exc}"
    if mine == config.fingerprint:
        return None
    return (
        f"this worker's tools and checks differ from those the run was started with "
        f"(fingerprint {mine[:12]}, the run's {config.fingerprint[:12]}): run every worker "
        "with the same ticketgraph.toml and tools modules, then resume"
    )


def _import(workspace: Path, listed: dict[str, list[str]], paths: list[str]) -> Declarations:
    root = str(workspace.resolve())
    if root not in sys.path:
        sys.path.append(root)  # after everything installed: a workspace module shadows none
    tools: dict[str, Tool] = {}
    for category, names in listed.items():
        seen: set[str] = set()
        for name in names:
            tool = tools.get(name) or _tool(category, name)
            if tool.name in seen:
                raise ConfigError(f"[workers.{category}] tools: two tools are named {tool.name!r}")
            seen.add(tool.name)
            tools[name] = tool
    checks = {path: _check(path) for path in paths}
    return Declarations(tools, checks, _fingerprint(tools, checks))


def _tool(category: str, name: str) -> Tool:
    if ":" not in name:
        if name not in BUILTINS:
            known = ", ".join(BUILTINS)
            raise ConfigError(
                f"[workers.{category}] tools: {name!r} is no built-in tool ({known}); name "
                "your own as 'module:function'"
            )
        return BUILTINS[name]
    found = _attribute(f"[workers.{category}] tools", name)
    if not isinstance(found, Tool):
        raise ConfigError(
            f"[workers.{category}] tools: {name} is not a tool: decorate it with @tool "
            "(from workers import tool)"
        )
    return found


def _check(path: str) -> Check:
    found = _attribute("[gate] checks", path)
    if not callable(found):
        raise ConfigError(f"[gate] checks: {path} is not a function")
    return found  # type: ignore[no-any-return]


def _attribute(key: str, path: str) -> Any:
    module_name, _, attribute = path.partition(":")
    module = _module(key, module_name)
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ConfigError(f"{key}: module {module_name!r} has no {attribute!r}") from None


def _module(key: str, name: str) -> ModuleType:
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name.split(".")[0] and exc.name != name:
            raise ConfigError(f"{key}: module {name!r} failed to import: {exc}") from exc
        raise ConfigError(
            f"{key}: no module {name!r}: it must be in the workspace folder or on every "
            "worker's import path (pip install it, or PYTHONPATH)"
        ) from exc
    except Exception as exc:  # a team's module can raise anything while it imports
        raise ConfigError(
            f"{key}: module {name!r} failed to import ({type(exc).__name__}: {exc})"
        ) from exc
    if name not in _module_hashes:
        file = getattr(module, "__file__", None)
        data = Path(file).read_bytes() if file else name.encode()
        _module_hashes[name] = hashlib.sha256(data).hexdigest()
    return module


def _fingerprint(tools: dict[str, Tool], checks: dict[str, Check]) -> str:
    """One hash of every tool (name, schema, module) and check (path, module)."""
    parts: list[Any] = []
    for listed, tool in sorted(tools.items()):
        module = listed.partition(":")[0] if ":" in listed else "workers.builtin_tools"
        parts.append([listed, tool.schema(), tool.read_only, _hash_of(module)])
    parts += [[path, _hash_of(path.partition(":")[0])] for path in sorted(checks)]
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _hash_of(module_name: str) -> str:
    if module_name not in _module_hashes:
        _module("", module_name)
    return _module_hashes[module_name]
