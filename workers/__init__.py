"""The agent harness: one loop, five exits, and the parts it needs.

This package never imports `orchestrator` or Celery: the graph calls the harness, never the
reverse.
"""
