"""The agent harness: one loop, five exits, and the parts it needs; and the public tool API a
team writes its own tools with (`from workers import tool, ToolContext, ToolError`).

This package never imports `orchestrator` or Celery: the graph calls the harness, never the
reverse.
"""

import sys

# httpx imports its command-line client, and with it rich and pygments, whenever they are
# installed (rich is ours, for the live view): ~50 ms of every command that loads the harness, for a
# client the harness never runs. None in sys.modules makes that one import fail as httpx
# expects when they are missing (it falls back to a stub); nothing else of httpx changes.
sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]

from workers.errors import ToolError  # noqa: E402
from workers.tools import Tool, ToolContext, tool  # noqa: E402

__all__ = ["Tool", "ToolContext", "ToolError", "tool"]
