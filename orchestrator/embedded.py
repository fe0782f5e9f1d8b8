"""The embedded default: a private Redis, an in-process worker and, if no model endpoint is
configured, the workspace's scripted provider; all started for one command and stopped after.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator

from celery import Celery
from celery.worker import WorkController

from orchestrator.errors import BrokerError
from orchestrator.redis_server import RedisServer
from orchestrator.workspace import Workspace
from workers.provider import running_provider
from workers.settings import HarnessSettings

WORKER_STOP_TIMEOUT_S = 30.0


@contextlib.contextmanager
def redis() -> Iterator[str]:
    """A private redis-server for the duration; yields its broker URL."""
    with RedisServer() as server:
        yield server.url


@contextlib.contextmanager
def model_endpoint(workspace: Workspace, llm: HarnessSettings) -> Iterator[HarnessSettings]:
    """LLM_BASE_URL if set; else serve the workspace's scenarios/demo.yaml for the duration."""
    if llm.base_url:
        yield llm
        return
    if not workspace.scenarios.exists():
        raise BrokerError(
            "no model endpoint: set LLM_BASE_URL, or add scripted scenarios at "
            f"{workspace.scenarios}"
        )
    with running_provider(workspace.scenarios) as url:
        yield llm.model_copy(update={"base_url": url})


class _ReadyWorker(WorkController):
    """A worker that tells when its consumer is ready to take tasks."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.ready = threading.Event()
        super().__init__(*args, **kwargs)

    def on_consumer_ready(self, consumer: object) -> None:
        """Called by Celery once the consumer is connected."""
        super().on_consumer_ready(consumer)
        self.ready.set()


@contextlib.contextmanager
def worker(app: Celery, concurrency: int) -> Iterator[WorkController]:
    """An in-process worker (threads pool) for the duration, stopped cleanly after."""
    controller = _ReadyWorker(
        app=app,
        hostname=f"embedded-{os.getpid()}@{socket.gethostname()}",
        concurrency=concurrency,
        pool="threads",
        loglevel="WARNING",
        without_heartbeat=False,  # Flower shows a worker as online only with heartbeats
        without_mingle=True,
        without_gossip=True,
    )
    thread = threading.Thread(target=controller.start, name="embedded-worker", daemon=True)
    thread.start()
    try:
        if not controller.ready.wait(WORKER_STOP_TIMEOUT_S):
            raise BrokerError("the embedded worker did not become ready")
        yield controller
    finally:
        controller.stop(in_sighandler=False)
        thread.join(WORKER_STOP_TIMEOUT_S)
