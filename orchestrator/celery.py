"""The Celery app for Celery's own tools: `celery -A orchestrator inspect ping`, `events`,
`flower`, `report`. Celery's `-A orchestrator` looks for this module by name.

It reads the same environment as `ticketgraph worker` (TICKETGRAPH_BROKER_URL, LLM_*), so
those tools talk to the broker the workers use, never to a default one (amqp://localhost,
which on a machine with a RabbitMQ is someone else's broker). Without a broker URL it
refuses to load.
"""

from __future__ import annotations

from orchestrator import tasks  # noqa: F401 — registers the graph's tasks on the app
from orchestrator.app import configure
from orchestrator.settings import GraphSettings
from workers.settings import HarnessSettings, load

_settings = load(GraphSettings, "TICKETGRAPH_")
if not _settings.broker_url:
    raise SystemExit(
        "set TICKETGRAPH_BROKER_URL (the broker your `ticketgraph worker` processes use) "
        "before `celery -A orchestrator ...`"
    )

app = configure(_settings.broker_url, _settings, load(HarnessSettings, "LLM_"))
