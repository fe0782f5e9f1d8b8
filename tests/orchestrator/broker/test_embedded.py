"""The embedded cluster: what it prepares before it forks its workers."""

from __future__ import annotations

from pathlib import Path

from bench.workload import build
from tests.conftest import Cli, settled
from workers.provider import running_provider

BUILT = "built the o200k_base tokenizer"
TICKETS = 300  # more than one routing call holds counted in bytes: the route step counts tokens


def _workload(root: Path) -> Path:
    """The bench's scaled workload: its scripted replies are counted by the provider."""
    build(root, TICKETS, latency_ms=0, pool_size=16)
    settled(*(root / "inbox").iterdir())  # claimable now, not after the inbox's settle time
    return root


def test_the_workers_of_an_embedded_run_share_the_tokenizer_its_provider_built(
    cli: Cli, tmp_path: Path
) -> None:
    """The provider counts this workload's replies, so the run builds the tokenizer before
    it forks its workers: the route step, which counts its tickets, builds none of its own
    (with the same workload served from elsewhere, it does: the log line is the worker's;
    the CLI's own build is not logged, its logging is not configured)."""
    embedded = cli("run", "--log-level", "INFO", cwd=_workload(tmp_path / "embedded"))
    assert embedded.returncode == 1, embedded.stderr[-2000:]
    assert BUILT not in embedded.stderr

    elsewhere = _workload(tmp_path / "elsewhere")
    with running_provider(elsewhere / "scenarios" / "demo.yaml") as url:
        served = cli("run", "--log-level", "INFO", cwd=elsewhere, env={"LLM_BASE_URL": url})
    assert served.returncode == 1, served.stderr[-2000:]
    assert served.stderr.count(BUILT) == 1, served.stderr[-2000:]
