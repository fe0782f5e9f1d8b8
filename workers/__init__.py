"""The agent harness: one loop, five exits, and the parts it needs; and the public tool API a
team writes its own tools with (`from workers import tool, ToolContext, ToolError`).

This package never imports `orchestrator` or Celery: the graph calls the harness, never the
reverse.
"""

from workers.errors import ToolError
from workers.tools import Tool, ToolContext, tool

__all__ = ["Tool", "ToolContext", "ToolError", "tool"]
