"""The Celery app for Celery's own tools: `celery -A orchestrator inspect ping`, `events`,
`flower`, `report`. Celery's `-A orchestrator` looks for this module by name.

It reads the same environment as `ticketgraph worker` (TICKETGRAPH_BROKER_URL, LLM_*), so
those tools talk to the broker the workers use, never to a default one (amqp://localhost,
which on a machine with a RabbitMQ is someone else's broker). Celery's own `--broker` flag
(which Celery passes on as CELERY_BROKER_URL) wins, as in any Celery tool. Without a broker
URL it refuses to load.
"""

from __future__ import annotations

import os

from orchestrator import tasks  # noqa: F401 — registers the graph's tasks on the app
from orchestrator.app import configure
from orchestrator.settings import GraphSettings
from workers.settings import HarnessSettings, load

_settings = load(GraphSettings, "TICKETGRAPH_")
_broker = os.environ.get("CELERY_BROKER_URL") or _settings.broker_url
if not _broker:
    raise SystemExit(
        "set TICKETGRAPH_BROKER_URL (the broker your `ticketgraph worker` processes use) "
        "before `celery -A orchestrator ...`"
    )

app = configure(_broker, _settings, load(HarnessSettings, "LLM_"))
