"""The scripted provider: a real HTTP server speaking OpenAI chat completions from scripts.

Tests and demos point the harness's model client at it; `harness` is the built-in scenario
set of the agent-harness chapter. See `scenario.py` for the file format.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from workers.provider.app import ProviderState, Stats, create_app
from workers.provider.scenario import (
    TOKENS_PER_MESSAGE,
    TOKENS_REPLY_PRIMING,
    ChatRequest,
    ConversationView,
    Fault,
    FixedUsage,
    RenderedReply,
    Reply,
    Scenario,
    Script,
    ToolCallSpec,
    When,
    builtin_names,
    load_scenario,
    prompt_tokens,
    render_reply,
)

if TYPE_CHECKING:
    from workers.provider.server import main, running_provider, serve

__all__ = [
    "TOKENS_PER_MESSAGE",
    "TOKENS_REPLY_PRIMING",
    "ChatRequest",
    "ConversationView",
    "Fault",
    "FixedUsage",
    "ProviderState",
    "RenderedReply",
    "Reply",
    "Scenario",
    "Script",
    "Stats",
    "ToolCallSpec",
    "When",
    "builtin_names",
    "create_app",
    "load_scenario",
    "main",
    "prompt_tokens",
    "render_reply",
    "running_provider",
    "serve",
]

_SERVER_NAMES = ("main", "running_provider", "serve")


def __getattr__(name: str) -> Any:
    """Import the server names on first use."""
    # Importing `server` eagerly here would make `python -m workers.provider.server` find the
    # module already in sys.modules and warn that it may run twice.
    if name in _SERVER_NAMES:
        from workers.provider import server

        return getattr(server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
