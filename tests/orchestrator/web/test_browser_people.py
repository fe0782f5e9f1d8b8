"""The person's loop in a real headless browser (Debian's chromium through Playwright) against
`ticketgraph web` as a real process, over folders written by real `ticketgraph run`
processes: the queue across runs, handling a ticket, auditing a pass, approving refunds at
once and resuming from the page, requeue asking first, a ticket page true to its run, and a
live page that keeps what a person types.

Set TICKETGRAPH_SCREENSHOTS=docs to write docs/web-queue.png and docs/web-handled.png.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config.workspace import CONFIG_FILE, init_demo
from tests.conftest import demo_scripts, settled, variant, write_scenarios
from tests.orchestrator.web.conftest import USER, run_cli, run_id_of, web_server
from tests.orchestrator.web.test_browser import live_page, shots, signed_in
from workers import versions

pytestmark = pytest.mark.slow
BY = f"{USER} (web)"
EDITED = "Ticket T-1004: finance reissues the invoice to your company this week."


def _demo(root: Path, *examples: str, audit_share: float = 0.0) -> Path:
    """A demo workspace with `examples/` tickets added to its inbox and `audit_share` set."""
    init_demo(root)
    for name in examples:
        (root / "inbox" / name).write_bytes((root / "examples" / name).read_bytes())
        settled(root / "inbox" / name)
    config = root / CONFIG_FILE
    config.write_text(
        config.read_text().replace("audit_share = 0.0", f"audit_share = {audit_share}")
    )
    return root


def _ran(workspace: Path) -> str:
    done = run_cli("run", "--quiet", cwd=workspace)
    assert done.returncode == 1, done.stdout + done.stderr  # something needs a person
    return run_id_of(workspace)


def _rows(page: Any) -> list[tuple[str, str]]:
    """The queue's rows as (kind, ticket)."""
    rows = page.locator("table.queue tr.item")
    return [
        (rows.nth(k).get_attribute("data-kind"), rows.nth(k).get_attribute("data-ticket"))
        for k in range(rows.count())
    ]


def _count(page: Any, kind: str) -> int:
    return int(page.inner_text(f".queue-counts span[data-kind={kind}]"))


def test_an_operator_handles_audits_approves_and_resumes_from_the_queue(
    tmp_path: Path, browser: Any
) -> None:
    workspace = _demo(tmp_path / "ops", "T-1007.txt", audit_share=1.0)
    run_id = _ran(workspace)
    run_dir = workspace / "runs" / run_id
    folder = shots(tmp_path)
    with web_server(workspace) as url:
        page = signed_in(browser).new_page()
        page.goto(f"{url}/runs/{run_id}")
        page.click("header a.queue-link")  # the queue is linked from every page
        page.wait_for_url("**/queue")
        assert ("ticket", "T-1004") in _rows(page) and ("call", "T-1007") in _rows(page)
        assert (_count(page, "call"), _count(page, "ticket")) == (1, 1)
        audits = _count(page, "audit")
        assert audits == 5  # every pass, with audit_share 1
        card = page.inner_text("tr.item[data-ticket='T-1007'] .card")
        assert "amount 89.00" in card and "8900" not in card  # amounts as money
        assert "amount_cents > 5000" in card and "expires" in card
        page.screenshot(path=str(folder / "web-queue.png"), full_page=True)

        # T-1004: found in the queue, its reply edited and sent.
        page.click("tr.item[data-ticket='T-1004'] a.go")
        page.wait_for_selector("form.handle textarea")
        assert "please wait a moment" in page.input_value("form.handle textarea")
        page.fill("form.handle textarea", EDITED)
        page.fill("form.handle input[name=reason]", "a filler phrase")
        page.click("form.handle button[value=edit]")
        page.wait_for_url("**/queue?note=*")
        assert f"edited: {run_id} T-1004 by {BY}" in page.inner_text("pre.note")
        assert ("ticket", "T-1004") not in _rows(page) and _count(page, "ticket") == 0

        # A sampled pass audited as bad: first without a reason (the form stays), then with.
        page.goto(f"{url}/runs/{run_id}/tickets/T-1002#audit")
        page.click("form.audit button[value=bad]")
        page.wait_for_selector("p.form-error")
        assert "say why the reply is bad" in page.inner_text("p.form-error")
        assert page.locator("form.audit").count() == 1  # the form is still there
        page.fill("form.audit input[name=reason]", "names the wrong known issue")
        page.click("form.audit button[value=bad]")
        page.wait_for_url("**/queue?note=*")
        assert f"audit_bad: {run_id} T-1002 by {BY}" in page.inner_text("pre.note")
        assert _count(page, "audit") == audits - 1

        # The waiting refund: ticked, approved with one confirmation, then resumed.
        page.check("tr.item[data-ticket='T-1007'] input[name=call]")
        page.click("div.batch button[value=approve]")
        page.wait_for_selector("form.confirm")
        assert "amount 89.00" in page.inner_text(".confirm-card")
        assert not (run_dir / "decisions").exists()  # nothing decided before the confirmation
        page.click("form.confirm button[value=approve]")
        page.wait_for_url("**/queue?note=*")
        assert f"approved: {run_id} T-1007 request_refund" in page.inner_text("pre.note")
        decided = page.inner_text("tr.item[data-ticket='T-1007']")
        assert "decided, not resumed" in decided and f"approved by {BY}" in decided
        page.click("tr.item[data-ticket='T-1007'] a.go")
        page.wait_for_url(f"**/runs/{run_id}#resume")
        before_resume = _updated(workspace, run_id)
        page.click("form.resume button[name=resume]")
        page.wait_for_selector("pre.note")
        assert f"resume of {run_id}" in page.inner_text("pre.note")
        _finished(workspace, run_id, before_resume)
        page.goto(f"{url}/runs/{run_id}/tickets/T-1007")  # its page: the refund, once
        written = page.locator("ul.actions-recorded li").all_inner_texts()
        assert len(written) == 1 and "refund (order_id A-77533, amount 89.00" in written[0]
        page.goto(f"{url}/queue")
        # Drained: no call, no ticket; the refund ticket's pass is now sampled for audit.
        assert {kind for kind, _ in _rows(page)} == {"audit"} and _count(page, "call") == 0
        assert ("audit", "T-1007") in _rows(page) and len(_rows(page)) == audits
        page.goto(f"{url}/")  # the runs list counts the handled ticket apart
        row = f"tr[data-run='{run_id}']"
        assert (page.inner_text(f"{row} td.human"), page.inner_text(f"{row} td.handled-count")) == (
            "0",
            "1",
        )
        page.goto(f"{url}/runs/{run_id}/tickets/T-1004")
        assert "handled: edited" in page.inner_text("h1")
        assert f"edited by {BY}" in page.inner_text(".handled-by")
        assert page.inner_text("#out-now").strip() == EDITED  # what went out, beside its own
        assert "please wait a moment" in page.inner_text("#reply")
        page.screenshot(path=str(folder / "web-handled.png"), full_page=True)
    record = versions.read_json(run_dir / "records" / "T-1007.json")
    assert record["status"] == "pass"
    refunds = [json.loads(line) for line in (run_dir / "actions.jsonl").read_text().splitlines()]
    assert [(r["ticket"], r["order_id"]) for r in refunds] == [("T-1007", "A-77533")]
    assert (workspace / "out" / "T-1004.txt").read_text().strip() == EDITED
    handled = json.loads((run_dir / "handled" / "T-1004.json").read_text())
    assert (handled["verdict"], handled["by"]) == ("edited", BY)
    labels = [
        json.loads(x) for x in (workspace / "labels" / "labels.jsonl").read_text().splitlines()
    ]
    assert sorted((x["ticket"], x["verdict"]) for x in labels) == [
        ("T-1002", "audit_bad"),
        ("T-1004", "edited"),
    ]


def _updated(workspace: Path, run_id: str) -> str:
    """When run.json was last written, as it says."""
    return str(json.loads((workspace / "runs" / run_id / "run.json").read_text())["updated_at"])


def _finished(workspace: Path, run_id: str, since: str, timeout: float = 120) -> None:
    """Wait until the resumed run has ended: its run.json says done, written after `since`
    (before the resume reopens it, it still says done from the first run)."""
    meta = workspace / "runs" / run_id / "run.json"
    deadline = time.monotonic() + timeout
    while (now := json.loads(meta.read_text())).get("status") != "done" or (
        now.get("updated_at") == since
    ):
        assert time.monotonic() < deadline, "the resume started from the page did not end"
        time.sleep(0.2)


def test_requeue_asks_first_and_an_earlier_runs_ticket_page_keeps_its_own_reply(
    tmp_path: Path, browser: Any
) -> None:
    workspace = _demo(tmp_path / "requeue", "T-1007.txt")
    first = _ran(workspace)
    first_dir = workspace / "runs" / first
    own = versions.read_json(first_dir / "agents" / "T-1004.review-1.json")["output"]
    with web_server(workspace) as url:
        page = signed_in(browser).new_page()
        # The refund ticket: requeue asks first, naming the refund; declined, nothing runs.
        page.goto(f"{url}/runs/{first}/tickets/T-1007")
        page.click("details.requeue-box summary")
        page.click("form.requeue button[name=requeue]")
        page.wait_for_selector("form.confirm")
        asked = page.inner_text("ul.again")
        assert "request_refund" in asked and "amount 89.00" in asked
        page.click("form.confirm a.decline")
        page.wait_for_url(f"**/runs/{first}/tickets/T-1007")
        assert not list((workspace / "inbox").iterdir())  # nothing moved
        assert (first_dir / "claimed" / "T-1007.txt").exists()
        assert '"requeued"' not in (first_dir / "run.jsonl").read_text()

        # T-1004 requeued from its page (nothing to ask), and run again with another reply.
        page.goto(f"{url}/runs/{first}/tickets/T-1004")
        page.click("details.requeue-box summary")
        page.click("form.requeue button[name=requeue]")
        page.wait_for_selector("pre.note")
        assert "inbox/T-1004.txt" in page.inner_text("pre.note")
        settled(workspace / "inbox" / "T-1004.txt")
        later = "Ticket T-1004: finance will reissue the invoice to your company by Friday."
        scripts = variant(demo_scripts(), "T-1004#2", replies=[{"text": later}])
        write_scenarios(workspace / "scenarios" / "demo.yaml", scripts)
        second = run_cli("run", "--quiet", cwd=workspace)
        assert second.returncode == 0, second.stdout + second.stderr
        second_id = run_id_of(workspace)
        assert later in (workspace / "out" / "T-1004.txt").read_text()

        page.goto(f"{url}/runs/{first}/tickets/T-1004")
        assert page.inner_text("#reply").strip() == own.strip()  # its own, not out/'s
        assert later not in page.inner_text("main")
        assert "has changed since this run wrote it" in page.inner_text("p.out-changed")
        assert "no longer there" in page.inner_text("dl.fields")  # its file was requeued
        assert page.locator(f".other-runs a[href='/runs/{second_id}/tickets/T-1004']").count()
        page.goto(f"{url}/runs/{second_id}/tickets/T-1004")
        assert later in page.inner_text("#reply")
        assert page.locator(f".other-runs a[href='/runs/{first}/tickets/T-1004']").count() == 1


def test_a_typed_filter_survives_the_live_page_and_its_action_bar_follows_the_run(
    tmp_path: Path, browser: Any
) -> None:
    with live_page(tmp_path, browser, 700) as (_, _run_id, running, page):
        page.fill("form.filters input[name=q]", "T-100")
        page.select_option("form.filters select[name=category]", index=1)
        chosen = page.input_value("form.filters select[name=category]")
        page.fill("#cancel-reason", "half-typed rea")
        page.evaluate("document.getElementById('live').dataset.before = 'yes'")
        page.wait_for_timeout(3000)  # three refreshes of the live parts
        assert page.locator("#live[data-before]").count() == 0  # it was refreshed
        assert page.input_value("form.filters input[name=q]") == "T-100"
        assert page.input_value("form.filters select[name=category]") == chosen
        assert page.input_value("#cancel-reason") == "half-typed rea"
        assert running.wait(timeout=120) == 1, running.communicate()  # T-1004
        # The action bar follows the run by itself: no cancel button once it ended.
        page.wait_for_selector("form.cancel", state="detached", timeout=10_000)
        assert page.locator(".live").count() == 0
        assert page.evaluate("window.__same_page") is True  # no reload
        assert page.input_value("form.filters input[name=q]") == "T-100"
