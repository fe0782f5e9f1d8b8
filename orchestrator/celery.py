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

from orchestrator.broker.app import connect
from orchestrator.errors import ConfigError
from orchestrator.plan import tasks  # noqa: F401 — registers the graph's tasks on the app
from workers.settings import SettingsError

try:
    app = connect(os.environ.get("CELERY_BROKER_URL"))
except (ConfigError, SettingsError) as exc:
    raise SystemExit(f"celery -A orchestrator: {exc}") from None
