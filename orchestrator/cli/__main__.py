"""`python -m orchestrator.cli`: the `ticketgraph` command."""

from orchestrator.cli.main import entry

entry()
