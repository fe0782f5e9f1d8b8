"""`python -m orchestrator.cli`: the `ticketgraph` command."""

import sys

from orchestrator.cli.main import main

sys.exit(main())
