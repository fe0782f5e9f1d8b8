"""The Celery app and its configuration, nothing else."""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from celery import Celery

from orchestrator.broker.transport import connection_args, tls_options
from orchestrator.config import environment
from orchestrator.config.broker_url import broker_url_problem, shown
from orchestrator.config.environment import GraphSettings
from orchestrator.coordination import leases
from orchestrator.coordination.heartbeat import HEARTBEAT_CONF_KEY
from orchestrator.errors import ConfigError
from workers import commit
from workers.settings import HarnessSettings, load

app = Celery("ticketgraph", include=["orchestrator.plan.tasks"])

LLM_CONF_KEY = "ticketgraph_llm"
OUTAGE_CONF_KEY = "ticketgraph_broker_outage_s"
# Celery reads these ahead of its own broker setting: left in the environment, one of them
# would send this process to another broker than the one it was given.
CELERY_BROKER_VARIABLES = ("CELERY_BROKER_URL", "CELERY_BROKER_READ_URL", "CELERY_BROKER_WRITE_URL")

log = logging.getLogger(__name__)


def restore_mutex_s(settings: GraphSettings) -> int:
    """How long the restore lock outlives a holder that died: two restore intervals, at
    least 5 s."""
    return max(5, 2 * settings.restore_interval_s)


def configure(broker_url: str, settings: GraphSettings, llm: HarnessSettings) -> Celery:
    """Point the app at a broker and set the delivery guarantees every run relies on;
    `ConfigError` (one sentence) for a URL that is not a Redis broker's."""
    if (problem := broker_url_problem(broker_url)) is not None:
        raise ConfigError(f"the broker URL {shown(broker_url)!r}: {problem}")
    for name in CELERY_BROKER_VARIABLES:
        if os.environ.pop(name, broker_url) != broker_url:
            log.warning("%s ignored: ticketgraph uses TICKETGRAPH_BROKER_URL or --broker", name)
    transport = {
        # Unacknowledged messages whose holder stopped beating come back after this long;
        # every worker looks for them each restore interval (no throttling on top).
        "visibility_timeout": settings.visibility_timeout_s,
        "unacked_restore_interval": settings.restore_interval_s,
        "unacked_restore_throttle": 1,
        # Each restore runs under a Redis lock (milliseconds of work). A worker killed while
        # holding it leaves it to expire: kombu's 300 s stalled every restore, so a killed
        # worker's ticket waited five minutes (the crash soak, 2026-12-01). A restore run
        # twice at once only brings a message back twice, which hold and fences absorb.
        "unacked_mutex_expire": restore_mutex_s(settings),
    }
    url, transport_class = connection_args(broker_url)
    conf: dict[str, Any] = {
        "broker_url": url,
        "broker_transport": transport_class,
        "broker_use_ssl": tls_options(broker_url),
        # Only references cross the broker, and only as JSON.
        "task_serializer": "json",
        "accept_content": ["json"],
        # Nothing waits on a task's result: each step sends the next one, and the waiting
        # CLI reads the run's events and records. Storing results would cost a Redis write
        # per task for nothing.
        "task_ignore_result": True,
        # A task is acknowledged after it ran, and redelivered if its worker died mid-task.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        # A worker process reserves no more messages than it has threads to run them: a busy
        # one never holds the next ticket while another process sits idle (with prefetch,
        # two tickets of a pool of 2 could queue in one process behind each other).
        "worker_disable_prefetch": True,
        # Task events only when a monitor asks for them: Flower turns them on in every
        # worker it reaches (Celery's enable_events, every 5 s while it runs), and from then
        # on each task shows from the moment a worker receives it. Sent to nobody they cost
        # three publishes a ticket; `ticketgraph worker --task-events` sends them from the
        # start. "sent" events would cost the sender one more publish per task.
        "worker_send_task_events": False,
        "task_send_sent_event": False,
        # Enforced by the tasks themselves (limits.py): the threads pool ignores them.
        "task_soft_time_limit": settings.soft_time_limit_s,
        "task_time_limit": settings.time_limit_s,
        "broker_transport_options": transport,
        "broker_connection_retry_on_startup": True,
        # A worker's consumer reconnects for as long as it takes; sends are retried by
        # outage.py around kombu's own short retries.
        "broker_connection_max_retries": None,
        OUTAGE_CONF_KEY: settings.broker_outage_s,
        HEARTBEAT_CONF_KEY: settings.heartbeat_s,
        "worker_hijack_root_logger": False,
        "worker_redirect_stdouts": False,
        LLM_CONF_KEY: llm.model_dump(mode="json"),
    }
    app.conf.update(conf)
    leases.configure(settings.lease_s)  # this process's holds and slots, and its children's
    commit.configure(settings.commit_window_ms)  # the same: its flushes to disk
    # Worker threads look tasks' app up through Celery's current/default app; make it ours.
    app.set_current()
    app.set_default()
    return app


def worker_llm() -> HarnessSettings:
    """The model endpoint this worker process was configured with (parsed once per config;
    every task asks, so the same configuration object answers without a look at its text)."""
    raw = app.conf.get(LLM_CONF_KEY)
    if _last_llm and _last_llm[0] is raw:
        return _last_llm[1]
    key = json.dumps(raw, sort_keys=True)
    if key not in _llm_cache:
        _llm_cache[key] = HarnessSettings.model_validate(raw) if raw else HarnessSettings()
    _last_llm[:] = [raw, _llm_cache[key]]
    return _llm_cache[key]


_llm_cache: dict[str, HarnessSettings] = {}
_last_llm: list[Any] = []  # [the configuration object, what it parsed to]


def connect(broker_url: str | None = None) -> Celery:
    """The app on the shared broker as every worker sees it: `broker_url` (a flag), else
    TICKETGRAPH_BROKER_URL, with the environment's settings; `ConfigError` or
    `SettingsError` (one sentence) if they cannot work."""
    return configure(
        environment.broker_url(broker_url), environment.settings(), load(HarnessSettings, "LLM_")
    )
