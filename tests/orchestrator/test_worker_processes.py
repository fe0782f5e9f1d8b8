"""Worker processes forked from a configured app: what each child sets up for itself."""

from __future__ import annotations

import gc
import json
import time
from pathlib import Path

from orchestrator.broker import worker_processes
from orchestrator.broker.app import configure
from orchestrator.config.environment import GraphSettings
from workers.settings import HarnessSettings


def test_a_forked_worker_runs_young_collections_less_often_than_python(
    broker: str, tmp_path: Path
) -> None:
    """A real forked worker, on a real Redis, reports its collection thresholds from a task:
    young collections every YOUNG_COLLECTION_AFTER allocations, the older ones as Python's;
    the parent's own thresholds are untouched."""
    # No request is made: the workers only build their model client before the fork.
    app = configure(broker, GraphSettings(), HarnessSettings(base_url="http://127.0.0.1:9/v1"))
    seen = tmp_path / "thresholds.json"

    @app.task(name="tests.thresholds")
    def thresholds(path: str) -> None:
        Path(path).write_text(json.dumps(gc.get_threshold()), encoding="utf-8")

    parent = gc.get_threshold()
    fleet = worker_processes.spawn(app, "gc-probe", processes=1, threads=1)
    try:
        fleet.wait_ready()
        thresholds.delay(str(seen))
        deadline = time.monotonic() + 30
        while not seen.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        fleet.stop(graceful=False)
    young, *older = json.loads(seen.read_text(encoding="utf-8"))
    assert young == worker_processes.YOUNG_COLLECTION_AFTER != parent[0]
    assert tuple(older) == parent[1:]
    assert gc.get_threshold() == parent
