"""The peers run the reference workload and reproduce the seed's numbers."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bench.peers import seed_script
from bench.peers.result import NEEDS_HUMAN, PASS, NodeUsage, PeerResult, PeerStatus
from orchestrator.config.workspace import init_demo
from workers.provider import running_provider

# DESIGN.md's reference run (seed 003): calls, tokens and review rounds per node.
REFERENCE_NODES = {
    "route": NodeUsage(1, 720),
    "fanout": NodeUsage(8, 8903),
    "merge": NodeUsage(0, 0),
    "review": NodeUsage(2, 3033, 2),
}

needs_node = pytest.mark.skipif(
    shutil.which("node") is None, reason="node is not on PATH: the seed's script cannot run"
)
needs_seed = pytest.mark.skipif(
    not seed_script.SEED.is_file(), reason=f"the seed is not at {seed_script.SEED}"
)


def assert_reference_outcomes(result: PeerResult, ids: list[str]) -> None:
    """The six demo tickets end as in the seed's table (ids: the run's ids for T-1001..6)."""
    outcomes = [result.outcomes[i] for i in ids]
    assert [o.handler for o in outcomes] == [
        "worker:billing",
        "worker:bug",
        "template",
        "worker:billing",
        "worker:bug",
        "template",
    ]
    assert [(o.gate_rounds, o.stop, o.status) for o in outcomes] == [
        (0, "gate_pass", PASS),
        (0, "gate_pass", PASS),
        (0, "gate_pass", PASS),
        (1, "no_progress", NEEDS_HUMAN),
        (1, "gate_pass", PASS),
        (0, "gate_pass", PASS),
    ]
    assert outcomes[5].category == "other"  # the router's "complaint" was clamped


@pytest.fixture
def demo_workspace(tmp_path: Path) -> Path:
    """A fresh `ticketgraph init` demo workspace."""
    root = tmp_path / "demo"
    init_demo(root)
    return root


@pytest.mark.parametrize(("pool", "in_flight"), [(16, 4), (2, 2)])
def test_langgraph_peer_reproduces_the_reference_run(
    demo_workspace: Path, pool: int, in_flight: int
) -> None:
    pytest.importorskip("langgraph")
    from bench.peers import langgraph_peer

    with running_provider(demo_workspace / "scenarios" / "demo.yaml") as base_url:
        result = langgraph_peer.run(demo_workspace, base_url, pool)

    assert result.nodes == REFERENCE_NODES
    assert_reference_outcomes(result, [f"T-100{k}" for k in range(1, 7)])
    # Four tickets have a worker: pool 16 runs them all at once, pool 2 never more than two.
    assert result.extra["provider"] == {"requests": 11, "max_in_flight": in_flight}
    assert 0 < result.wall_s <= result.total_s
    published = (demo_workspace / "out" / "T-1005.txt").read_text(encoding="utf-8")
    assert published.startswith("Ticket T-1005:")
    assert (demo_workspace / langgraph_peer.REPORT_FILE).is_file()


@needs_node
@needs_seed
@pytest.mark.parametrize(
    ("tickets", "ids"),
    [(None, [f"T-100{k}" for k in range(1, 7)]), (6, [f"T-10000{k}" for k in range(1, 7)])],
)
def test_seed_script_reproduces_the_seed_table(tickets: int | None, ids: list[str]) -> None:
    result = seed_script.run(tickets=tickets, pool=2, latency_ms=60)

    assert result.status is PeerStatus.OK, result.reason
    assert result.nodes == REFERENCE_NODES
    assert_reference_outcomes(result, ids)
    assert result.exit_code == 1  # one ticket needs a human
    assert result.tickets == 6


@needs_node
@needs_seed
def test_seed_script_clones_scale_every_count() -> None:
    result = seed_script.run(tickets=13, pool=4, latency_ms=0)

    # 13 tickets: clones of T-1001..T-1006 three, two, two, two, two, two times.
    assert result.nodes == {
        "route": NodeUsage(1, 720),
        "fanout": NodeUsage(2 * 9, 2165 * 3 + 2339 * 2 + 2105 * 2 + 2294 * 2),
        "merge": NodeUsage(0, 0),
        "review": NodeUsage(4, 1395 * 2 + 1638 * 2, 4),
    }
    assert (result.count(PASS), result.count(NEEDS_HUMAN)) == (11, 2)
    assert result.outcomes["T-100013"].handler == "worker:billing"


def test_seed_script_without_node_is_skipped_with_the_reason() -> None:
    result = seed_script.run(node="no-such-node-binary")

    assert result.status is PeerStatus.SKIPPED
    assert result.to_json() == {
        "peer": "seed_script",
        "status": "skipped",
        "reason": "'no-such-node-binary' is not on PATH",
    }


@needs_seed
def test_the_extracted_script_is_the_lessons_whole_block() -> None:
    text = seed_script.SEED.read_text(encoding="utf-8")
    script = seed_script.extract_script(text)

    assert script.startswith(seed_script.SCRIPT_START)
    assert script.splitlines()[-1].startswith(seed_script.SCRIPT_END)
    patched = seed_script.patch_script(script)
    assert "process.env.STUB_LATENCY_MS" in patched
    assert "BENCH_TICKETS" in patched


def test_a_seed_without_the_script_is_an_error() -> None:
    with pytest.raises(seed_script.SeedError, match=r"orchestrate\.mjs"):
        seed_script.extract_script("A lesson with no code in it.\n")


def test_the_durable_langgraph_peer_reproduces_the_reference_run_and_saves_each_step(
    demo_workspace: Path,
) -> None:
    pytest.importorskip("langgraph.checkpoint.sqlite")
    import sqlite3

    from bench.peers import langgraph_peer

    with running_provider(demo_workspace / "scenarios" / "demo.yaml") as base_url:
        result = langgraph_peer.run(demo_workspace, base_url, 16, durable=True)

    assert result.peer == langgraph_peer.DURABLE_PEER
    assert result.nodes == REFERENCE_NODES
    assert_reference_outcomes(result, [f"T-100{k}" for k in range(1, 7)])
    assert result.extra["provider"]["requests"] == 11
    with sqlite3.connect(demo_workspace / langgraph_peer.CHECKPOINTS) as db:
        (saved,) = db.execute("select count(*) from checkpoints").fetchone()
    assert saved >= 6  # input, route, drafts, merge, reviews, report: one per step at least


def test_langgraph_peer_runs_the_scaled_workload(tmp_path: Path) -> None:
    pytest.importorskip("langgraph")
    workload_module = pytest.importorskip("bench.workload")
    from bench.peers import langgraph_peer

    workload = workload_module.build(tmp_path / "n12", 12, latency_ms=0, pool_size=16)
    with running_provider(workload.root / "scenarios" / "demo.yaml") as base_url:
        result = langgraph_peer.run(workload.root, base_url, 16)

    assert {name: result.nodes[name].calls for name in workload.calls} == workload.calls
    assert (result.calls, result.tokens) == (workload.peer_calls, workload.peer_tokens)
    assert (result.count(PASS), result.count(NEEDS_HUMAN)) == (10, 2)
    assert result.outcomes["T-100011"].stop == "gate_pass"  # a clone of T-1005


def test_the_peer_as_a_process_reports_its_result_and_its_own_cpu(tmp_path: Path) -> None:
    """`run_langgraph` runs the peer as a child and takes its CPU from wait4: the CPU the
    suite sets beside ours per ticket (section c), with the provider's apart."""
    pytest.importorskip("langgraph")
    workload_module = pytest.importorskip("bench.workload")
    from bench.runs import run_langgraph
    from bench.scaling import cpu_ms_with_provider
    from bench.services import ProviderCost

    workload = workload_module.build(tmp_path / "n12", 12, latency_ms=0, pool_size=16)
    with running_provider(workload.root / "scenarios" / "demo.yaml") as base_url:
        peer = run_langgraph(workload.root, base_url, 16, timeout_s=120)

    peer.check(workload.peer_calls, workload.peer_tokens)
    assert peer.problem == "" and peer.returncode == 0
    # Importing langgraph alone takes a tenth of a second of CPU or more on any machine; a
    # figure taken from the wrong process (this one, or none) would not be the child's.
    assert 0.1 < peer.cpu_s < peer.process_wall_s * (os.cpu_count() or 1)
    assert peer.to_json()["cpu_s"] == round(peer.cpu_s, 3)
    provider = ProviderCost(requests=20, cpu_s=0.5, max_in_flight=16)
    assert cpu_ms_with_provider(peer.cpu_s, provider, 12) == 1000 * (peer.cpu_s + 0.5) / 12


def test_section_c_runs_ours_again_on_tmpfs_and_tells_the_filesystems_share(
    tmp_path: Path,
) -> None:
    """Section c's provider runs add ours with its workspace on tmpfs, on the same provider:
    its CPU a ticket, the share of ours' on disk the filesystem took, and its ratios to the
    peers; its workspace is gone from tmpfs after."""
    pytest.importorskip("langgraph")
    from bench import scaling
    from bench.suite import Context, Options

    if problem := scaling._tmpfs_problem(12, tmp_path):
        pytest.skip(f"no tmpfs run here: {problem}")
    before = set(os.listdir(scaling.TMPFS))
    raw: dict[str, Any] = {}
    figures = {f.key: f for f in scaling._provider_runs(Context(Options(), tmp_path), 12, raw)}

    on_disk = figures["cpu_with_provider.ours"].value
    on_tmpfs = figures["cpu_with_provider.ours_tmpfs"].value
    assert raw["provider_runs"]["ours_tmpfs"]["folder"] == scaling.TMPFS
    assert on_disk and on_tmpfs and figures["cpu_with_provider.ours_tmpfs"].note == ""
    share = figures["cpu_with_provider.filesystem_share"].value
    assert share == pytest.approx(1 - on_tmpfs / on_disk, abs=0.01)
    for name in ("langgraph", "langgraph_sqlite"):
        peer = figures[f"cpu_with_provider.{name}"].value
        ratio = figures[f"cpu_with_provider.ours_tmpfs_over_{name}"].value
        assert ratio == pytest.approx(on_tmpfs / peer, rel=0.01)
        assert figures[f"cpu_with_provider.ours_tmpfs_over_{name}"].target is None
    made = {p for p in set(os.listdir(scaling.TMPFS)) - before if p.startswith("tg-bench-c-")}
    assert made == set()


def test_section_c_makes_a_tmpfs_run_only_beside_a_run_on_another_filesystem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No tmpfs run where there is no tmpfs, where the run "on disk" is on one too, or where
    the tmpfs is too small; each says why."""
    from bench import scaling

    assert scaling._tmpfs_problem(12, tmp_path, "/proc/self") == "/proc/self is not a tmpfs"
    if scaling.machine.filesystem(scaling.TMPFS).get("type") == "tmpfs":
        inside = Path(scaling.TMPFS) / "workspace"
        assert "on a tmpfs too" in scaling._tmpfs_problem(12, inside)
    # A tmpfs of a few MiB (Docker's /dev/shm is 64 MiB) cannot be made here without root.
    tmpfs = {"type": "tmpfs", "mount": "/small"}
    monkeypatch.setattr(scaling.machine, "filesystem", lambda f: tmpfs if "small" in str(f) else {})
    monkeypatch.setattr(scaling.shutil, "disk_usage", lambda _: SimpleNamespace(free=64 * 2**20))
    assert scaling._tmpfs_problem(1_000, tmp_path, "/small") == (
        "/small has 64 MiB free; 1,000 tickets ask 125"
    )
    assert scaling._tmpfs_problem(100, tmp_path, "/small") == ""


def test_section_c_says_why_a_tmpfs_figure_has_no_value() -> None:
    """A tmpfs run not made, or gone wrong, gives no number and a note on every figure."""
    from bench import scaling
    from bench.runs import OurRun, PeerRun
    from bench.services import ProviderCost
    from bench.watch import Watched

    cost = ProviderCost(requests=20, cpu_s=0.5, max_in_flight=16)
    watched = Watched([], 0, 1.0, 0, 0, 0, [], Path("out"), Path("err"), cpu_s=2.0)
    ours = OurRun(watched, None, tickets=12)
    peers = {"langgraph": (PeerRun(1.0, 0, {"wall_s": 1.0}, "", cpu_s=1.5), cost)}
    for tmpfs, why in (
        (scaling.TmpfsRun(problem="not run: /dev/shm is not a tmpfs"), "not run"),
        (scaling.TmpfsRun(OurRun(watched, None, problem="exit 3"), cost), "exit 3"),
    ):
        figures = scaling._tmpfs_figures(12, ours, cost, tmpfs, peers)
        assert [f.value for f in figures] == [None, None, None]
        assert all(why in f.note for f in figures)
    # The same run on both sides: the filesystem took nothing, and the ratio is the peer's.
    same = scaling._tmpfs_figures(12, ours, cost, scaling.TmpfsRun(ours, cost), peers)
    assert same[0].value == pytest.approx(1000 * 2.5 / 12, rel=0.01) and same[1].value == 0
    assert same[2].value == pytest.approx(2.5 / 2.0, rel=0.01)
    assert all(f.note == "" for f in same)
