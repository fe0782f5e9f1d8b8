"""The scripted provider: a real HTTP server speaking OpenAI chat completions from scripts.

Tests and demos point the harness's model client at it; `harness` is the built-in scenario
set of the agent-harness chapter. See `scenario.py` for the file format.

Names load on first use, so importing `workers.provider.options` (the CLI does, for --help)
does not import the server, and `python -m workers.provider.server` does not warn that the
module was already imported.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOME = {
    "app": ("ProviderState", "Stats", "create_app"),
    "scenario": (
        "Fault",
        "FixedUsage",
        "Reply",
        "Scenario",
        "Script",
        "ScriptMatch",
        "ToolCallSpec",
        "When",
        "builtin_names",
        "load_scenario",
    ),
    "request": ("ChatRequest", "ConversationView"),
    "server": ("main", "running_provider", "serve"),
    "wire": (
        "TOKENS_PER_MESSAGE",
        "TOKENS_REPLY_PRIMING",
        "RenderedReply",
        "prompt_tokens",
        "render_reply",
    ),
}
_MODULE_OF = {name: module for module, names in _HOME.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    """Import a public name from its module on first use."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"workers.provider.{module}"), name)
