"""The person's half of the loop through the real CLI on real demo runs (embedded: its own
Redis and workers, the scripted provider): the queue across runs, handling a ticket,
auditing a sampled pass, the labels those leave, `gate replay` against a hand count, and
requeue asking for --force before anything would run again. `queue`, `handle`, `audit`,
`labels` and `gate replay` run with no broker and no worker: they read the run folders."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from orchestrator.config.workspace import CONFIG_FILE
from orchestrator.run import waitlist
from orchestrator.run.store import RunStore
from tests.conftest import Cli, settled, state
from workers import versions

FILLER = "please wait a moment"
LABEL_KEYS = {
    "run",
    "ticket",
    "category",
    "draft",
    "draft_sha256",
    "gate",
    "verdict",
    "final",
    "by",
    "at",
    "reason",
}


def _run(cli: Cli, demo: Path, *examples: str) -> str:
    """One demo run (with `examples/` tickets added); its run id."""
    for name in examples:
        (demo / "inbox" / name).write_bytes((demo / "examples" / name).read_bytes())
        settled(demo / "inbox" / name)
    done = cli("run", cwd=demo)
    assert done.returncode == 1, done.stdout + done.stderr
    return str(state(demo)["run_id"])


def _queue(cli: Cli, demo: Path, *args: str) -> dict[str, Any]:
    listed = cli("queue", "--json", *args, cwd=demo)
    assert listed.returncode == 0, listed.stderr
    return json.loads(listed.stdout)  # type: ignore[no-any-return]


def _labels(demo: Path) -> list[dict[str, Any]]:
    text = (demo / "labels" / "labels.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def _audit_share(demo: Path, share: float) -> None:
    config = demo / CONFIG_FILE
    text = config.read_text()
    assert text.count("audit_share = 0.0") == 1  # the demo's own [review] table
    config.write_text(text.replace("audit_share = 0.0", f"audit_share = {share}"))


def _stamp(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_the_queue_lists_the_needs_human_ticket_and_the_waiting_refunds_in_words(
    demo: Path, cli: Cli
) -> None:
    run_id = _run(cli, demo, "T-1007.txt", "T-1008.txt")
    found = _queue(cli, demo)
    assert found["counts"] == {"call": 2, "ticket": 1, "audit": 0}
    items = {i["ticket"]: i for i in found["items"]}
    ticket = items["T-1004"]
    assert (ticket["kind"], ticket["run_id"], ticket["reason"]) == ("ticket", run_id, "no_progress")
    assert "the same report twice" in ticket["why"] and FILLER in ticket["why"]
    assert ticket["age_s"] >= 0
    refund = items["T-1008"]
    assert (refund["kind"], refund["tool"], refund["state"]) == (
        "call",
        "request_refund",
        "waiting",
    )
    assert "amount 1,280.00" in refund["arguments"] and "128000" not in refund["arguments"]
    assert refund["rule"] == "amount_cents > 5000"
    asked = _stamp(refund["since"])
    assert _stamp(refund["expires_at"]) - asked.replace(microsecond=0) == timedelta(hours=72)
    shown = cli("queue", cwd=demo).stdout
    assert "amount 89.00" in shown and "rule 'amount_cents > 5000'" in shown
    assert f"ticketgraph handle {run_id} T-1004 --send" in shown
    # Filters, and a decided call shown as such until resume finishes it.
    assert [i["ticket"] for i in _queue(cli, demo, "--kind", "ticket")["items"]] == ["T-1004"]
    assert _queue(cli, demo, "--category", "bug")["items"] == []
    assert _queue(cli, demo, "--older-than", "1")["items"] == []
    assert cli("approve", run_id, "T-1007", "--by", "dana", cwd=demo).returncode == 0
    decided = {i["ticket"]: i for i in _queue(cli, demo, "--kind", "call")["items"]}
    assert (
        decided["T-1007"]["state"] == "decided" and "approved by dana" in decided["T-1007"]["why"]
    )
    assert decided["T-1007"]["commands"] == [f"ticketgraph resume {run_id}"]
    assert decided["T-1008"]["state"] == "waiting"


def _ageless(found: dict[str, Any]) -> dict[str, Any]:
    """The queue without its ages (they grow between two reads)."""
    items = [{k: v for k, v in i.items() if k != "age_s"} for i in found["items"]]
    return {"counts": found["counts"], "items": items}


def test_the_queue_reads_an_ended_runs_waitlist_only_while_its_records_are_unchanged(
    demo: Path, cli: Cli
) -> None:
    run_id = _run(cli, demo, "T-1007.txt", "T-1008.txt")
    listed = demo / "runs" / run_id / waitlist.FILE
    assert not listed.exists()  # a run this small ends without one: its records are few
    waitlist.materialise(RunStore(demo / "runs" / run_id), smallest=0)  # a big run's end
    assert listed.is_file()
    from_list = _queue(cli, demo)
    listed.unlink()
    from_records = _queue(cli, demo)
    assert _ageless(from_list) == _ageless(from_records)
    assert from_records["counts"] == {"call": 2, "ticket": 1, "audit": 0}
    assert cli("queue", cwd=demo).stdout.splitlines()[0] == "3 waiting for a person " + (
        "(2 calls, 1 ticket):"
    )
    # What the list says is what the queue shows while records/ is as it was read...
    waitlist.write(RunStore(demo / "runs" / run_id), smallest=0)
    kept = json.loads(listed.read_text())
    for entry in kept["entries"]:
        entry[3] = "max_rounds" if entry[0] == "T-1004" else entry[3]
    listed.write_text(json.dumps(kept))
    assert {i["ticket"]: i["reason"] for i in _queue(cli, demo, "--kind", "ticket")["items"]} == {
        "T-1004": "max_rounds"
    }
    # ...and a record written since (by a rename, as every record is) makes it read records/.
    record = demo / "runs" / run_id / "records" / "T-1004.json"
    (record.parent / ".T-1004.tmp").write_bytes(record.read_bytes())
    (record.parent / ".T-1004.tmp").replace(record)
    assert {i["ticket"]: i["reason"] for i in _queue(cli, demo, "--kind", "ticket")["items"]} == {
        "T-1004": "no_progress"
    }


def test_handle_with_a_reply_file_publishes_it_keeps_the_runs_draft_and_drains_the_queue(
    demo: Path, cli: Cli, tmp_path: Path
) -> None:
    run_id = _run(cli, demo)
    run_dir = demo / "runs" / run_id
    kept = {p: p.read_bytes() for p in (run_dir / "drafts").iterdir()}
    kept |= {p: p.read_bytes() for p in (run_dir / "agents").glob("T-1004.*")}
    draft = versions.read_json(run_dir / "agents" / "T-1004.review-1.json")["output"]
    reply = tmp_path / "reply.txt"
    reply.write_text("Ticket T-1004: finance reissues the invoice to your company this week.\n")
    done = cli(
        "handle", run_id, "T-1004", "--reply-file", str(reply), "--by", "dana",
        "--reason", "a filler phrase", cwd=demo,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (demo / "out" / "T-1004.txt").read_text() == reply.read_text()
    assert not [p for p in (demo / "out").iterdir() if p.name.startswith(".")]
    assert {p: p.read_bytes() for p in kept} == kept  # the run's own drafts untouched
    assert _queue(cli, demo)["items"] == []
    [label] = _labels(demo)
    assert set(label) >= LABEL_KEYS
    assert (label["run"], label["ticket"], label["category"]) == (run_id, "T-1004", "billing")
    assert label["draft"] == draft.strip()
    assert label["draft_sha256"] == hashlib.sha256(label["draft"].encode()).hexdigest()
    assert label["gate"]["verdict"] == "needs_human"
    assert [(r["round"], r["passed"]) for r in label["gate"]["rounds"]] == [(0, False), (1, False)]
    assert label["gate"]["rounds"][1]["reports"] == [f"filler_word:{FILLER}"]
    assert (label["verdict"], label["final"]) == ("edited", reply.read_text().strip())
    assert (label["by"], label["reason"]) == ("dana", "a filler phrase")
    assert _stamp(label["at"]).utcoffset() == timedelta(0)
    handled = json.loads((run_dir / "handled" / "T-1004.json").read_text())
    assert handled["final_sha256"] == hashlib.sha256(reply.read_text().strip().encode()).hexdigest()
    again = cli("handle", run_id, "T-1004", "--send", cwd=demo)
    assert again.returncode == 64 and "handled already (edited by dana" in again.stderr
    assert cli("handle", run_id, "T-1001", "--send", cwd=demo).returncode == 64  # a pass
    # Handled is shown apart from what still waits.
    status = cli("status", cwd=demo).stdout
    assert "need a human" not in status and "handled by a person: 1" in status
    assert "T-1004: edited by dana" in status
    [row] = json.loads(cli("runs", "--json", cwd=demo).stdout)
    assert (row["need_a_human"], row["handled"]) == (0, 1)
    doc = json.loads(cli("status", "--json", cwd=demo).stdout)
    assert [h["ticket"] for h in doc["handled"]] == ["T-1004"]
    report = (run_dir / "report.txt").read_text()
    assert "need a human: 1 ticket (1 handled)" in report and "handled by a person: 1" in report
    assert "(no_progress)" not in report


def test_handle_send_publishes_the_runs_own_reply_not_what_out_holds_now(
    demo: Path, cli: Cli
) -> None:
    run_id = _run(cli, demo)
    (demo / "out" / "T-1004.txt").write_text("a later run's reply\n")
    done = cli("handle", run_id, "T-1004", "--send", "--by", "ana", cwd=demo)
    assert done.returncode == 0, done.stderr
    [label] = _labels(demo)
    assert (label["verdict"], label["final"]) == ("sent", label["draft"])
    assert (demo / "out" / "T-1004.txt").read_text() == label["draft"] + "\n"
    assert label["draft"].startswith("Ticket T-1004") and FILLER in label["draft"]


def _sampled(run_id: str, ticket: str, share: float) -> bool:
    """docs/people.md's rule, computed here by hand."""
    digest = hashlib.sha256(f"{run_id}/{ticket}".encode()).digest()
    return int.from_bytes(digest[:8], "big") < share * 2**64


def test_audit_share_samples_passes_deterministically_and_an_audit_drains_it(
    demo: Path, cli: Cli
) -> None:
    _audit_share(demo, 0.5)
    run_id = _run(cli, demo)
    passes = [t for t, r in state(demo)["tickets"].items() if r["status"] == "pass"]
    sampled = [i["ticket"] for i in _queue(cli, demo, "--kind", "audit")["items"]]
    assert [i["ticket"] for i in _queue(cli, demo, "--kind", "audit")["items"]] == sampled
    assert sampled == sorted(t for t in passes if _sampled(run_id, t, 0.5))
    chosen = sampled[0] if sampled else passes[0]
    bad = cli("audit", run_id, chosen, "--bad", cwd=demo)
    assert bad.returncode == 64 and "--reason" in bad.stderr
    done = cli("audit", run_id, chosen, "--bad", "--by", "eve", "--reason", "too curt", cwd=demo)
    assert done.returncode == 0, done.stderr
    assert chosen not in [i["ticket"] for i in _queue(cli, demo, "--kind", "audit")["items"]]
    [label] = _labels(demo)
    assert (label["verdict"], label["final"], label["reason"]) == ("audit_bad", None, "too curt")
    assert label["gate"]["verdict"] == "pass" and label["gate"]["rounds"][-1]["passed"]
    assert cli("audit", run_id, "T-1004", "--good", cwd=demo).returncode == 64  # not a pass


def _hand_count(found: list[dict[str, Any]], fillers: list[str]) -> tuple[int, int]:
    """False alarms and misses of a gate that checks the ticket id and `fillers` alone (the
    demo's replies fail no other check), counted by hand."""
    alarms = misses = 0
    for label in found:
        failed = label["ticket"] not in label["draft"] or any(
            f in label["draft"].lower() for f in fillers
        )
        alarms += failed and label["verdict"] in ("sent", "audit_good")
        misses += not failed and label["verdict"] in ("edited", "closed", "audit_bad")
    return alarms, misses


def test_gate_replay_equals_a_hand_count_and_a_candidate_without_a_filler_changes_it(
    demo: Path, cli: Cli, tmp_path: Path
) -> None:
    _audit_share(demo, 1.0)
    first = _run(cli, demo)
    audits = [i["ticket"] for i in _queue(cli, demo, "--kind", "audit")["items"]]
    assert audits == ["T-1001", "T-1002", "T-1003", "T-1005", "T-1006"]  # every pass
    assert cli("handle", first, "T-1004", "--send", cwd=demo).returncode == 0  # a false alarm
    assert cli("audit", first, "T-1001", "--bad", "--reason", "wrong", cwd=demo).returncode == 0
    assert cli("audit", first, "T-1002", "--good", cwd=demo).returncode == 0
    assert cli("requeue", first, "T-1004", cwd=demo).returncode == 0
    second = _run(cli, demo)
    reply = tmp_path / "reply.txt"
    reply.write_text("Ticket T-1004: finance reissues the invoice to your company.\n")
    edited = cli("handle", second, "T-1004", "--reply-file", str(reply), cwd=demo)
    assert edited.returncode == 0, edited.stderr
    found = _labels(demo)
    assert [(x["run"], x["verdict"]) for x in found] == [
        (first, "sent"), (first, "audit_bad"), (first, "audit_good"), (second, "edited"),
    ]  # fmt: skip
    fillers = ["please wait a moment", "thank you for your patience", "we will resolve this soon"]
    candidate = tmp_path / "candidate.toml"
    config = (demo / CONFIG_FILE).read_text()
    assert f'"{FILLER}", ' in config
    candidate.write_text(config.replace(f'"{FILLER}", ', ""))
    replayed = cli("gate", "replay", "--config", str(candidate), "--json", cwd=demo)
    assert replayed.returncode == 0, replayed.stderr
    result = json.loads(replayed.stdout)
    current, changed = result["current"], result["candidate"]
    assert (current["false_alarms"], current["misses"]) == _hand_count(found, fillers)
    assert (changed["false_alarms"], changed["misses"]) == _hand_count(found, fillers[1:])
    assert (current["labelled"], current["false_alarms"], current["misses"]) == (4, 1, 1)
    # Without the phrase: the sent T-1004 is no false alarm, the edited one becomes a miss.
    assert (changed["labelled"], changed["false_alarms"], changed["misses"]) == (4, 0, 2)
    assert current["by_check"] == {"filler_word": {"failed": 2, "false_alarms": 1, "caught": 1}}
    assert changed["by_check"] == {}
    assert "candidate" not in json.loads(cli("gate", "replay", "--json", cwd=demo).stdout)
    shown = cli("gate", "replay", "--config", str(candidate), cwd=demo).stdout
    assert "false alarms" in shown and "filler_word" in shown
    exported = tmp_path / "labels.jsonl"
    assert cli("labels", "export", "--out", str(exported), cwd=demo).returncode == 0
    assert [json.loads(line) for line in exported.read_text().splitlines()] == found
    assert cli("labels", "export", cwd=demo).stdout == exported.read_text()


def test_requeue_of_a_ticket_whose_refund_ran_or_that_waits_needs_force(
    demo: Path, cli: Cli
) -> None:
    run_id = _run(cli, demo, "T-1007.txt", "T-1008.txt")
    assert cli("approve", run_id, "T-1007", "--by", "dana", cwd=demo).returncode == 0
    assert cli("resume", run_id, cwd=demo).returncode == 1
    actions = (demo / "runs" / run_id / "actions.jsonl").read_text().splitlines()
    assert [json.loads(a)["ticket"] for a in actions] == ["T-1007"]
    claimed = demo / "runs" / run_id / "claimed"
    refused = cli("requeue", run_id, "T-1007", cwd=demo)
    assert refused.returncode == 64, refused.stdout + refused.stderr
    assert "T-1007: its tool wrote: refund" in refused.stderr and "amount 89.00" in refused.stderr
    assert "--force" in refused.stderr and "Traceback" not in refused.stderr
    assert (claimed / "T-1007.txt").exists() and not (demo / "inbox" / "T-1007.txt").exists()
    waiting = cli("requeue", run_id, cwd=demo)  # the whole run: T-1007 and T-1008 named
    assert waiting.returncode == 64 and "T-1008: waits for a decision" in waiting.stderr
    assert not list((demo / "inbox").iterdir())
    assert cli("requeue", run_id, "T-1004", cwd=demo).returncode == 0  # no write, no wait
    forced = cli("requeue", run_id, "T-1007", "--force", cwd=demo)
    assert forced.returncode == 0, forced.stderr
    assert (demo / "inbox" / "T-1007.txt").exists()
