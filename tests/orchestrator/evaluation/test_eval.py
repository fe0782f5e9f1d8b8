"""`ticketgraph eval` and record/replay, through the CLI and the files: real runs, a real
scripted provider over HTTP, `ticketgraph worker` processes for the distributed replay."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator.broker.redis_server import RedisServer
from orchestrator.evaluation import demo_cassette
from tests.conftest import (
    Cli,
    state,
    ticket_rows,
    worker_processes,
)
from workers.provider import running_provider

CASSETTE = "datasets/demo/cassette.json"


def files_of(folder: Path) -> dict[str, str]:
    """name -> sha256 of every file under `folder`."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def figures(document: dict[str, Any]) -> dict[str, Any]:
    """The document without what the clock measures (wall time, latency)."""
    kept = json.loads(json.dumps(document))
    for part in [kept, *kept["ablations"].values()]:
        part.pop("wall_s")
        part.pop("latency_s")
        for ticket in part.get("per_ticket", {}).values():
            ticket.pop("latency_s")
    return kept


def test_replayed_eval_gives_the_same_figures_twice_asks_no_provider_and_leaves_inbox_and_out(
    demo: Path, cli: Cli
) -> None:
    (demo / "out" / "kept.txt").write_text("a reply a person wrote\n")
    before = files_of(demo / "inbox"), files_of(demo / "out")
    with running_provider(demo / "scenarios" / "demo.yaml") as llm_url:
        env = {"LLM_BASE_URL": llm_url}
        args = ("eval", "datasets/demo", "--replay", CASSETTE, "--ablate", "review", "--json")
        first, second = cli(*args, cwd=demo, env=env), cli(*args, cwd=demo, env=env)
        requests = httpx.get(llm_url.removesuffix("/v1") + "/stats").json()["requests"]
    assert first.returncode == 0, first.stderr
    assert requests == 0
    assert (files_of(demo / "inbox"), files_of(demo / "out")) == before
    assert not (demo / "runs").exists()
    one, two = json.loads(first.stdout), json.loads(second.stdout)
    assert figures(one) == figures(two)
    assert one["tickets"] == 9 and one["routing_accuracy"] == pytest.approx(8 / 9)
    assert one["confusion"]["billing"] == {"billing": 3, "other": 1}
    assert one["per_ticket"]["T-1005"]["misses"] == []
    assert one["cost_per_ticket_usd"] > 0
    review = one["ablations"]["review"]
    assert list(review["changed"]) == ["T-1005"]
    assert "needs_human (expected pass, max_rounds)" in review["changed"]["T-1005"]["misses"]
    low, high = review["deltas"]["pass_rate"]["ci95"]
    assert review["deltas"]["pass_rate"]["delta"] == pytest.approx(-1 / 9)
    assert low < review["deltas"]["pass_rate"]["delta"] < high
    assert review["cost_delta_per_ticket_usd"] < 0  # the rewrite's cost is gone too


def test_repeat_2_runs_each_ticket_twice_and_a_replay_has_no_spread(demo: Path, cli: Cli) -> None:
    done = cli("eval", "datasets/demo", "--replay", CASSETTE, "--repeat", "2", "--json", cwd=demo)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert (doc["tickets"], doc["runs"]) == (9, 2)
    assert all(len(t["statuses"]) == 2 for t in doc["per_ticket"].values())
    assert {t: len(set(s["statuses"])) for t, s in doc["per_ticket"].items()} == dict.fromkeys(
        doc["per_ticket"], 1
    )  # the same status on both repeats, ticket by ticket
    passes = sum(t["statuses"][0] == "pass" for t in doc["per_ticket"].values())
    spread = doc["spread"]
    assert spread["unstable"] == []
    assert spread["pass_rate_min"] == spread["pass_rate_max"] == doc["pass_rate"] == passes / 9
    shown = cli("eval", "datasets/demo", "--replay", CASSETTE, "--repeat", "2", cwd=demo).stdout
    assert "9 tickets x 2 run(s)" in shown and "tickets that changed: none" in shown


def _agreement_by_hand(labels: list[dict[str, Any]], statuses: dict[str, str]) -> float:
    """Labels whose verdict the run's status matches: a draft sent or audited good asks for
    `pass`, one edited, closed or audited bad for `needs_human`."""
    agreed = sum(
        statuses[x["ticket"]]
        == ("pass" if x["verdict"] in ("sent", "audit_good") else "needs_human")
        for x in labels
    )
    return agreed / len(labels)


def test_a_label_export_is_a_dataset_and_eval_reports_agreement_with_it(
    demo: Path, cli: Cli, tmp_path: Path
) -> None:
    done = cli("run", cwd=demo)
    assert done.returncode == 1, done.stderr
    run_id = str(state(demo)["run_id"])
    statuses = {t: r["status"] for t, r in state(demo)["tickets"].items()}
    reply = tmp_path / "reply.txt"
    reply.write_text("Ticket T-1004: finance reissues the invoice to your company this week.\n")
    handled = cli("handle", run_id, "T-1004", "--reply-file", str(reply), cwd=demo)
    assert handled.returncode == 0, handled.stderr
    assert cli("audit", run_id, "T-1001", "--good", cwd=demo).returncode == 0
    bad = cli("audit", run_id, "T-1002", "--bad", "--reason", "too curt", cwd=demo)
    assert bad.returncode == 0, bad.stderr
    exported = tmp_path / "labels.jsonl"
    assert cli("labels", "export", "--out", str(exported), cwd=demo).returncode == 0
    labels = [json.loads(line) for line in exported.read_text().splitlines()]
    assert [(x["ticket"], x["verdict"]) for x in labels] == [
        ("T-1004", "edited"), ("T-1001", "audit_good"), ("T-1002", "audit_bad"),
    ]  # fmt: skip
    # A person files T-1001 under bug: a routing miss, not a disagreement with their verdict.
    assert labels[1]["category"] == "billing"
    labels[1]["category"] = "bug"
    exported.write_text("".join(json.dumps(x) + "\n" for x in labels))
    # The router asks about every ticket at once, so the shipped cassette (the nine tickets)
    # holds no routing for these three: the run's own sentence says so.
    replayed = cli("eval", str(exported), "--replay", CASSETTE, cwd=demo)
    assert replayed.returncode == 3
    assert f"the cassette {demo / CASSETTE} holds no reply to this request" in replayed.stderr
    evaluated = cli("eval", str(exported), "--json", cwd=demo)  # the scripted provider
    assert evaluated.returncode == 0, evaluated.stderr
    doc = json.loads(evaluated.stdout)
    assert sorted(doc["per_ticket"]) == ["T-1001", "T-1002", "T-1004"]
    again = {t: s["statuses"][0] for t, s in doc["per_ticket"].items()}
    assert again == {t: statuses[t] for t in again}  # the eval's run did what the demo's did
    # T-1004 edited and needs_human, T-1001 good and a pass agree; T-1002 audited bad passes.
    # (Hand-counted on the demo run's statuses: the eval's own run must do the same.)
    assert doc["label_agreement"] == pytest.approx(_agreement_by_hand(labels, statuses))
    assert doc["label_agreement"] == pytest.approx(2 / 3)
    assert doc["per_ticket"]["T-1002"]["misses"] == ["pass (expected needs_human, gate_pass)"]
    assert doc["per_ticket"]["T-1001"]["misses"] == ["category billing (expected bug)"]
    assert doc["routing_accuracy"] == pytest.approx(2 / 3)
    assert doc["expectations_met"] == pytest.approx(1 / 3)  # T-1004 alone meets all of it
    assert "label agreement 67%" in cli("eval", str(exported), cwd=demo).stdout


def test_eval_text_names_the_layer_the_interval_and_the_ticket(demo: Path, cli: Cli) -> None:
    done = cli("eval", "datasets/demo", "--replay", CASSETTE, "--ablate", "review", cwd=demo)
    assert done.returncode == 0, done.stderr
    assert "--ablate review:" in done.stdout
    assert "paired delta pass_rate            -11.1 pts [" in done.stdout
    assert "T-1005: expectations met 100% -> 0%" in done.stdout
    assert "cost delta per ticket" in done.stdout


def test_a_missed_threshold_exits_1_naming_it(demo: Path, cli: Cli) -> None:
    done = cli("eval", "datasets/demo", "--replay", CASSETTE, "--min-accuracy", "0.95", cwd=demo)
    assert done.returncode == 1
    assert "routing accuracy 0.888" in done.stderr and "--min-accuracy 0.95" in done.stderr


def test_an_unknown_layer_is_a_usage_error_before_any_run(demo: Path, cli: Cli) -> None:
    done = cli("eval", "datasets/demo", "--replay", CASSETTE, "--ablate", "gate:tone", cwd=demo)
    assert done.returncode == 64
    assert "no such gate check" in done.stderr and "unsupported_fact" in done.stderr


@pytest.fixture
def recorded(demo: Path, cli: Cli) -> tuple[Path, dict[str, Any]]:
    """The demo run once embedded, recorded into a cassette; its ticket rows."""
    cassette = demo.parent / "run.cassette.json"
    done = cli("run", "--record", str(cassette), cwd=demo)
    assert done.returncode == 1, done.stderr
    return cassette, ticket_rows(state(demo))


def test_a_prompt_edited_after_recording_fails_exactly_its_tickets_with_the_sentence(
    demo: Path, cli: Cli, recorded: tuple[Path, dict[str, Any]]
) -> None:
    cassette, _ = recorded
    run_id = state(demo)["run_id"]
    assert cli("requeue", run_id, cwd=demo).returncode == 0
    bug = demo / "prompts" / "bug.md"
    bug.write_text(bug.read_text().replace("one ticket at a time", "one ticket at a time, calmly"))
    done = cli("run", "--replay", str(cassette), cwd=demo)
    assert done.returncode == 1, done.stderr
    rows = ticket_rows(state(demo))
    failed = {t for t, row in rows.items() if row[3] == "worker_failed"}
    assert failed == {"T-1002", "T-1005"}  # the bug worker's tickets, and only they
    assert rows["T-1001"][4] == "pass" and rows["T-1004"][3] == "no_progress"
    for ticket in failed:
        assert (
            f"ticket {ticket}, step draft: the cassette {cassette} holds no reply to "
            "this request (the system prompt differs" in done.stdout
        )


def test_a_cassette_recorded_embedded_replays_on_two_workers_with_identical_records(
    tmp_path: Path, recorded: tuple[Path, dict[str, Any]], cli: Cli
) -> None:
    cassette, rows = recorded
    from orchestrator.config.workspace import init_demo

    again = tmp_path / "again"
    init_demo(again)
    (again / "scenarios" / "demo.yaml").unlink()  # nothing scripted: the cassette answers
    with RedisServer(tcp=True) as redis, running_provider(cassette) as llm_url:
        env = {"TICKETGRAPH_BROKER_URL": redis.url, "LLM_BASE_URL": llm_url}
        with worker_processes(env, tmp_path, ["w1", "w2"]):
            done = cli("run", cwd=again, env=env)
        served = httpx.get(llm_url.removesuffix("/v1") + "/stats").json()["scripts"]
    assert done.returncode == 1, done.stderr
    assert ticket_rows(state(again)) == rows
    assert served.get("cassette-miss", 0) == 0 and served["cassette"] == 11


def test_replay_on_a_shared_broker_says_to_serve_the_cassette(demo: Path, cli: Cli) -> None:
    with RedisServer(tcp=True) as redis:
        done = cli("run", "--replay", CASSETTE, "--broker", redis.url, cwd=demo)
    assert done.returncode == 78
    assert "ticketgraph provider --scenarios CASSETTE" in done.stderr
    assert len(list((demo / "inbox").iterdir())) == 6  # nothing claimed


def test_the_shipped_demo_cassette_is_what_the_scripted_provider_records_now(
    tmp_path: Path,
) -> None:
    fresh = tmp_path / "cassette.json"
    demo_cassette.record(fresh)
    assert demo_cassette.answers(fresh) == demo_cassette.answers(demo_cassette.shipped()), (
        "datasets/demo/cassette.json is stale: run "
        "`python -m orchestrator.evaluation.demo_cassette` and commit it"
    )


def test_check_warns_naming_what_a_worker_prompt_lacks(demo: Path, cli: Cli) -> None:
    (demo / "prompts" / "bug.md").write_text("Goal: fix the customer's day. Reply in English.\n")
    done = cli("check", cwd=demo)
    assert done.returncode == 0, done.stderr
    assert "warning: worker bug's prompt states no tool guidance, no task limits" in done.stdout
    assert "worker billing's prompt" not in done.stdout
