"""Fencing: a task copy that lost its hold on a ticket (stalled past the visibility timeout,
redelivered and finished elsewhere) can no longer write to it.

Real processes: a private Redis, the scripted provider, two `ticketgraph worker` processes of
one thread each, `ticketgraph run` as a subprocess; the stall is a real SIGSTOP of the worker
process doing the ticket's step, held past the visibility timeout, then SIGCONT after the run
has ended.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from celery import Celery

from orchestrator.broker.redis_server import RedisServer
from orchestrator.run.fence import EpochFence
from tests.conftest import (
    REFERENCE_TICKETS,
    Cli,
    clean_env,
    demo_scripts,
    descriptors_on,
    state,
    ticket_rows,
    wait_for,
    worker_processes,
    write_scenarios,
)
from workers.errors import Superseded
from workers.provider import running_provider


def test_a_copy_whose_epoch_was_taken_over_writes_nothing(tmp_path: Path) -> None:
    file, target = tmp_path / "fences" / "T-1", tmp_path / "record.json"
    stale = EpochFence.take(file)
    stale.write(target, "stale 1")
    fresh = EpochFence.take(file)
    assert (stale.epoch, fresh.epoch) == (1, 2)
    with pytest.raises(Superseded) as caught:
        stale.write(target, "stale 2")
    assert (caught.value.epoch, caught.value.newest) == (1, 2)
    with pytest.raises(Superseded):
        stale.check()
    fresh.check()
    fresh.write(target, "fresh")
    assert target.read_text() == "fresh"


def test_nothing_is_taken_when_the_work_is_no_longer_there(tmp_path: Path) -> None:
    file = tmp_path / "fences" / "T-1"
    live = EpochFence.take(file)
    assert EpochFence.take_if(file, lambda: False) is None
    live.check()  # still the newest: a late copy that found nothing to do changed nothing


def test_takeovers_from_many_threads_leave_exactly_one_writer(tmp_path: Path) -> None:
    """Every thread takes, then writes its own name under its fence: the writes that land
    are exactly those made before the next takeover, and the last one is the newest's."""
    import threading

    file, target = tmp_path / "fences" / "T-1", tmp_path / "out.txt"
    landed: list[int] = []
    lock = threading.Lock()

    def worker() -> None:
        fence = EpochFence.take(file)
        for _ in range(20):
            try:
                with fence.held():
                    target.write_text(str(fence.epoch))
                    with lock:
                        landed.append(fence.epoch)
            except Superseded:
                return

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    newest = EpochFence.take(file).epoch - 1
    assert newest == 8
    # Once an epoch was superseded, no write of it landed after a newer one did.
    assert landed == sorted(landed)
    assert target.read_text() == str(landed[-1])


def test_a_copy_keeps_one_descriptor_until_it_lets_go_and_is_fenced_either_way(
    tmp_path: Path,
) -> None:
    """From its take to its release a copy's writes and checks go through one descriptor;
    after the release they open the file each time, and still stop once superseded."""
    file, target = tmp_path / "fences" / "T-1", tmp_path / "record.json"
    held = EpochFence.take(file)
    for i in range(3):
        held.write(target, f"v{i}")
        held.check()
        assert descriptors_on(file) == 1
    held.release()
    held.release()  # twice: nothing more to close
    assert descriptors_on(file) == 0
    held.write(target, "after release")
    assert descriptors_on(file) == 0
    newer = EpochFence.take(file)
    with pytest.raises(Superseded):
        held.write(target, "stale")
    with pytest.raises(Superseded):
        held.check()
    assert target.read_text() == "after release"
    assert descriptors_on(file) == 1  # the newer copy's
    del newer
    assert descriptors_on(file) == 0  # a copy dropped without release closes it


def test_a_release_asked_during_a_write_waits_for_the_write_to_end(tmp_path: Path) -> None:
    """Closing the descriptor would drop the lock under the write: the release is made
    when the write ends, and the lock held until then (a takeover from another descriptor
    cannot get in)."""
    import fcntl

    file, target = tmp_path / "fences" / "T-1", tmp_path / "record.json"
    fence = EpochFence.take(file)
    with fence.held():
        fence.release()
        other = os.open(file, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # still locked
        finally:
            os.close(other)
        fence.write(target, "inside")
        assert descriptors_on(file) == 1
    assert descriptors_on(file) == 0
    fence.write(target, "after")  # released: the file is opened for the write
    assert target.read_text() == "after"


def test_a_takeover_by_another_process_reaches_a_kept_descriptor(tmp_path: Path) -> None:
    """The newer copy is a real process: the kept descriptor's check and write see it."""
    file, target = tmp_path / "fences" / "T-1", tmp_path / "record.json"
    stale = EpochFence.take(file)
    stale.write(target, "mine")
    took = (
        "import sys; from pathlib import Path; from orchestrator.run.fence import EpochFence;"
        "print(EpochFence.take(Path(sys.argv[1])).epoch)"
    )
    newer = subprocess.run(
        [sys.executable, "-c", took, str(file)], capture_output=True, text=True, check=True
    )
    assert int(newer.stdout) == stale.epoch + 1
    with pytest.raises(Superseded):
        stale.check()
    with pytest.raises(Superseded):
        stale.write(target, "stale")
    assert target.read_text() == "mine"


def test_threads_of_one_copy_take_turns_and_a_write_inside_a_write_goes_through(
    tmp_path: Path,
) -> None:
    """One copy's threads share its descriptor, where one flock cannot keep them apart: a
    second thread's write waits for the first's to end, and a check from inside a write
    (the same thread) does not wait on itself."""
    import threading

    file, target = tmp_path / "fences" / "T-1", tmp_path / "record.json"
    fence = EpochFence.take(file)
    inside, order = threading.Event(), []

    def second() -> None:
        inside.wait()
        with fence.held():
            order.append("second")

    thread = threading.Thread(target=second)
    thread.start()
    with fence.held():
        inside.set()
        thread.join(timeout=0.5)
        assert thread.is_alive()  # waiting for this write to end
        fence.check()
        fence.write(target, "inside")  # a write inside a write
        order.append("first")
    thread.join(timeout=10)
    assert order == ["first", "second"]
    assert target.read_text() == "inside"
    fence.release()


VISIBILITY_S = 4
SLOW_MS = 1500


def _slow(scripts: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    for script in scripts:
        if script["name"] == name:
            script["latency_ms"] = SLOW_MS
    return scripts


@contextlib.contextmanager
def _cluster(tmp: Path, slow: str) -> Iterator[tuple[dict[str, str], str]]:
    scenario = write_scenarios(tmp / "scenarios.yaml", _slow(demo_scripts(), slow))
    with RedisServer(tcp=True) as redis, running_provider(scenario) as llm_url:
        env = {
            "TICKETGRAPH_BROKER_URL": redis.url,
            "LLM_BASE_URL": llm_url,
            "TICKETGRAPH_VISIBILITY_TIMEOUT_S": str(VISIBILITY_S),
            "TICKETGRAPH_RESTORE_INTERVAL_S": "1",
        }
        with worker_processes(env, tmp, ["w1", "w2"], processes=1, threads=1):
            yield env, llm_url.replace("/v1", "/stats")


def _events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "run.jsonl"
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [json.loads(line) for line in lines if line.endswith("}")]


def _active(broker: str) -> list[dict[str, Any]]:
    """Every task running on a worker of `broker` (Celery's inspect)."""
    control = Celery(broker=broker)
    try:
        active = control.control.inspect(timeout=0.5).active() or {}
    finally:
        control.close()
    return [t for tasks in active.values() for t in tasks]


def _taken_by(events: list[dict[str, Any]], node: str, ticket: str) -> int | None:
    """The PID of the worker process that took `ticket` in `node` (its `taken` event): a
    ticket run in a row shares its task message with others, so Celery's own view of the
    task's arguments does not name it."""
    taken = [
        e
        for e in events
        if e["event"] == "taken" and e.get("node") == node and e.get("ticket") == ticket
    ]
    return int(taken[0]["pid"]) if taken else None


def _snapshot(paths: list[Path]) -> dict[str, tuple[int, int, bytes]]:
    """Each file's inode, mtime and bytes: an atomic rewrite with the same text still shows."""
    out = {}
    for path in paths:
        info = path.stat()
        out[str(path)] = (info.st_ino, info.st_mtime_ns, path.read_bytes())
    return out


def _ticket_files(workspace: Path, run_dir: Path, ticket: str) -> list[Path]:
    files = [run_dir / "records" / f"{ticket}.json", workspace / "out" / f"{ticket}.txt"]
    files += sorted((run_dir / "agents").glob(f"{ticket}.*.json"))
    draft = run_dir / "drafts" / f"{ticket}.txt"
    return [*files, draft] if draft.exists() else files


def _stall_until_the_run_ends(
    demo: Path, env: dict[str, str], find_pid: Callable[[Path], int | None], ticket: str
) -> tuple[Path, int, dict[str, tuple[int, int, bytes]]]:
    """Start the run, SIGSTOP the process `find_pid` names, let the run finish elsewhere;
    return the run folder, the stopped PID and a snapshot of the ticket's files."""
    run = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "run", "--quiet"],
        cwd=demo,
        env={**clean_env(), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    pid = None
    try:
        run_dir = wait_for("the run folder", lambda: next((demo / "runs").glob("run-*"), None))
        pid = wait_for("the ticket's worker process", lambda: find_pid(run_dir))
        os.kill(pid, signal.SIGSTOP)
        out, err = run.communicate(timeout=120)
        assert run.returncode == 1, out + err
        assert ticket_rows(state(demo)) == REFERENCE_TICKETS
        return run_dir, pid, _snapshot(_ticket_files(demo, run_dir, ticket))
    except BaseException:
        if pid is not None:
            os.kill(pid, signal.SIGCONT)
        run.kill()
        raise


def _superseded(run_dir: Path, ticket: str) -> dict[str, Any] | None:
    return next(
        (e for e in _events(run_dir) if e["event"] == "superseded" and e.get("ticket") == ticket),
        None,
    )


def _after_the_stale_copy_wakes(
    demo: Path, cli: Cli, env: dict[str, str], run_dir: Path, pid: int, ticket: str
) -> dict[str, Any]:
    """SIGCONT the stopped process, wait for the stale copy to trace `superseded` and to
    have no task left, and check the run still reads as it ended; return that event.

    The trace is waited for first: a process just woken from SIGSTOP may miss the half
    second Celery's inspect waits for replies, and then reads as idle before its task ran."""
    record_before = state(demo)
    os.kill(pid, signal.SIGCONT)
    broker = env["TICKETGRAPH_BROKER_URL"]
    event = wait_for("the stale copy's `superseded`", lambda: _superseded(run_dir, ticket))
    wait_for(
        "the stale copy to end",
        lambda: not any(t["worker_pid"] == pid for t in _active(broker)),
        timeout=60,
    )
    status = cli("status", "--json", cwd=demo, env=env)
    assert status.returncode == 0, status.stderr
    document = json.loads(status.stdout)
    assert document["status"] == "done"
    assert document["by_status"] == {"pass": 5, "needs_human": 1}
    assert document["record"]["tickets"] == record_before["tickets"]
    assert state(demo)["tickets"] == record_before["tickets"]
    return event


@pytest.mark.slow
def test_a_draft_stalled_past_the_visibility_timeout_never_rewrites_its_finished_ticket(
    tmp_path: Path, demo: Path, cli: Cli
) -> None:
    """SIGSTOP the process drafting T-1002 (in its second, slow model call) for longer than
    the visibility timeout: the draft is redelivered and finished elsewhere, the run ends with
    the reference verdicts; SIGCONT afterwards: T-1002's record, draft, reply and agent state
    are untouched, the trace says `superseded`, and the provider served at most one extra
    request (the one in flight when the process stopped)."""

    def drafting_t1002(run_dir: Path) -> int | None:
        return next(
            (
                e["pid"]
                for e in _events(run_dir)
                if e["event"] == "tool_start" and e.get("ticket") == "T-1002"
            ),
            None,
        )

    with _cluster(tmp_path, "T-1002#1") as (env, stats):
        run_dir, pid, files = _stall_until_the_run_ends(demo, env, drafting_t1002, "T-1002")
        event = _after_the_stale_copy_wakes(demo, cli, env, run_dir, pid, "T-1002")
        assert _snapshot(list(map(Path, files))) == files
        assert event["node"] == "fanout"
        assert httpx.get(stats).json()["requests"] <= 12  # the reference's 11, +1 in flight


@pytest.mark.slow
def test_a_review_stalled_past_the_visibility_timeout_never_rewrites_its_finished_ticket(
    tmp_path: Path, demo: Path, cli: Cli
) -> None:
    """The same for a stall in review: the process rewriting T-1005's draft (its slow
    rewrite call) is stopped past the visibility timeout and woken after the run ended."""

    def reviewing_t1005(run_dir: Path) -> int | None:
        events = _events(run_dir)
        gated = any(
            e["event"] == "gate" and e.get("node") == "review" and e.get("ticket") == "T-1005"
            for e in events
        )  # its first gate failed: its slow rewrite call starts now
        return _taken_by(events, "review", "T-1005") if gated else None

    with _cluster(tmp_path, "T-1005#2") as (env, stats):
        run_dir, pid, files = _stall_until_the_run_ends(demo, env, reviewing_t1005, "T-1005")
        event = _after_the_stale_copy_wakes(demo, cli, env, run_dir, pid, "T-1005")
        assert _snapshot(list(map(Path, files))) == files
        assert event["node"] == "review"
        assert httpx.get(stats).json()["requests"] <= 12
