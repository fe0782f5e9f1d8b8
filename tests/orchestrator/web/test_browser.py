"""The web view in a real headless browser (Debian's chromium, driven by Playwright) against
`ticketgraph web` as a real process, beside real `ticketgraph run` processes.

Set TICKETGRAPH_SCREENSHOTS=docs to have these tests write the README's screenshots
(docs/web-runs.png, docs/web-run.png, docs/web-ticket.png); otherwise they go to the test's
temporary folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config.workspace import init_demo
from tests.conftest import clean_env, demo_scripts, settled, write_scenarios
from tests.orchestrator.run.test_approvals import _with_refund
from tests.orchestrator.web.conftest import PASSWORD, USER, command, run_cli, run_id_of, web_server
from workers import versions

pytestmark = pytest.mark.slow
XSS = '<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2">'


def shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("TICKETGRAPH_SCREENSHOTS") or tmp_path / "shots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def signed_in(browser: Any) -> Any:
    context = browser.new_context(
        http_credentials={"username": USER, "password": PASSWORD},
        viewport={"width": 1200, "height": 800},
    )
    context.set_default_timeout(30_000)
    return context


def slow_demo(root: Path, latency_ms: int) -> Path:
    """A demo workspace whose scripted model answers each call in `latency_ms`."""
    init_demo(root)
    scripts = demo_scripts()
    for script in scripts:
        script["latency_ms"] = latency_ms
    write_scenarios(root / "scenarios" / "demo.yaml", scripts)
    return root


def wait_for_run(workspace: Path, process: subprocess.Popen[str], timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while not list((workspace / "runs").glob("run-*/records/*.json")):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the run did not start"
        time.sleep(0.1)
    return run_id_of(workspace)


def statuses(page: Any) -> list[str]:
    return page.locator("table.tickets td.status").all_inner_texts()  # type: ignore[no-any-return]


@contextlib.contextmanager
def live_page(
    tmp_path: Path, browser: Any, latency_ms: int
) -> Iterator[tuple[Path, str, subprocess.Popen[str], Any]]:
    """A slow demo run on one lane (`run --quiet`), the web view beside it, and a signed-in
    page open on the run's live page: (workspace, run id, the run's command, the page). The
    command is killed after, if it still runs."""
    workspace = slow_demo(tmp_path / "live", latency_ms=latency_ms)
    running = subprocess.Popen(
        command("run", "--quiet"),
        cwd=workspace,
        env={**clean_env(), "POOL_SIZE": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        run_id = wait_for_run(workspace, running)
        with web_server(workspace) as url:
            page = signed_in(browser).new_page()
            page.goto(f"{url}/runs/{run_id}")
            assert page.locator(".live").count() == 1
            page.evaluate("window.__same_page = true")
            yield workspace, run_id, running, page
    finally:
        if running.poll() is None:
            running.kill()
            running.wait()


def test_the_live_run_page_changes_by_itself_and_its_form_cancels_the_run(
    tmp_path: Path, browser: Any
) -> None:
    with live_page(tmp_path, browser, 1500) as (workspace, run_id, running, page):
        before = statuses(page)
        page.wait_for_function(
            "before => JSON.stringify([...document.querySelectorAll("
            "'table.tickets td.status')].map(e => e.innerText)) !== JSON.stringify(before)",
            arg=before,
            timeout=30_000,
        )
        assert page.evaluate("window.__same_page") is True  # changed in place, no reload
        assert statuses(page) != before
        page.screenshot(path=str(shots(tmp_path) / "web-run-live.png"), full_page=True)

        page.fill("form.cancel input[name=reason]", "stopped from the browser")
        page.click("form.cancel button[name=cancel]")
        page.wait_for_selector("pre.note")
        assert f"cancelled run {run_id}: cancelled by {USER} (web)" in page.inner_text("pre.note")
        assert running.wait(timeout=60) == 2  # the run's command: stopped early
        page.reload()
        assert page.inner_text("strong.verdict") == "cancelled"
        assert page.locator(".live").count() == 0
    meta = json.loads((workspace / "runs" / run_id / "run.json").read_text())
    assert meta["cancel"]["by"] == f"{USER} (web)"
    assert meta["cancel"]["reason"] == "stopped from the browser"
    trace = (workspace / "runs" / run_id / "run.jsonl").read_text().splitlines()
    ended = [json.loads(line) for line in trace if '"by": ' in line]
    assert any(e.get("by") == f"{USER} (web)" for e in ended)


def test_a_ticket_shows_both_gate_reports_and_customer_html_as_text(
    tmp_path: Path, browser: Any
) -> None:
    workspace = tmp_path / "xss"
    init_demo(workspace)
    attack = workspace / "inbox" / "T-1007.txt"
    attack.write_text(f"Hello {XSS} my order A-1 is late\n", encoding="utf-8")
    settled(attack)
    assert run_cli("run", "--quiet", cwd=workspace).returncode == 1
    run_id = run_id_of(workspace)
    folder = shots(tmp_path)
    with web_server(workspace) as url:
        page = signed_in(browser).new_page()
        page.goto(f"{url}/")
        assert page.locator(f"tr[data-run='{run_id}']").count() == 1
        page.screenshot(path=str(folder / "web-runs.png"), full_page=True)
        page.click(f"a[href='/runs/{run_id}']")
        page.wait_for_url(f"**/runs/{run_id}")
        page.wait_for_selector("table.tickets")
        page.screenshot(path=str(folder / "web-run.png"), full_page=True)
        page.click(f"a[href='/runs/{run_id}/tickets/T-1004']")
        page.wait_for_url(f"**/runs/{run_id}/tickets/T-1004")  # count() does not wait for it
        page.wait_for_selector("tr.gate-round")
        rounds = page.locator("tr.gate-round")
        assert rounds.count() == 2
        for k in range(2):
            assert "filler_word:please wait a moment" in rounds.nth(k).inner_text()
        assert "no_progress" in page.inner_text("dl.fields")
        page.screenshot(path=str(folder / "web-ticket.png"), full_page=True)

        page.goto(f"{url}/runs/{run_id}/tickets/T-1007")
        assert XSS in page.inner_text("#ticket-text")  # shown as the customer wrote it
        assert page.evaluate("window.__xss") is None  # and nothing of it ran
        assert page.locator("#ticket-text img, #ticket-text script").count() == 0


def test_a_waiting_refund_is_approved_through_the_form_and_resume_runs_it_once(
    tmp_path: Path, browser: Any
) -> None:
    workspace = tmp_path / "approve"
    init_demo(workspace)
    write_scenarios(workspace / "scenarios" / "demo.yaml", _with_refund(39900))
    assert run_cli("run", "--quiet", cwd=workspace).returncode == 1
    run_id = run_id_of(workspace)
    with web_server(workspace) as url:
        page = signed_in(browser).new_page()
        page.goto(f"{url}/runs/{run_id}/tickets/T-1001")
        assert "request_refund" in page.inner_text(".decision")
        page.click("form.decide button[value=approve]")
        page.wait_for_selector("pre.note")
        assert f"approved: {run_id} T-1001 request_refund" in page.inner_text("pre.note")
        assert f"approved by {USER} (web)" in page.inner_text(".decided")
        assert page.locator("form.decide").count() == 0  # decided: no form any more
    decisions = list((workspace / "runs" / run_id / "decisions").glob("T-1001.*.json"))
    assert [json.loads(p.read_text())["by"] for p in decisions] == [f"{USER} (web)"]
    resumed = run_cli("resume", run_id, "--quiet", cwd=workspace)
    assert resumed.returncode == 1, resumed.stderr  # T-1004 still needs a human
    record = versions.read_json(workspace / "runs" / run_id / "records" / "T-1001.json")
    assert record["status"] == "pass"
    refunds = (workspace / "runs" / run_id / "actions.jsonl").read_text().splitlines()
    assert len(refunds) == 1


def test_without_the_login_the_browser_gets_401(finished: Path, browser: Any) -> None:
    from playwright.sync_api import Error

    with web_server(finished) as url:
        page_url = f"{url}/runs/{run_id_of(finished)}"
        context = browser.new_context()
        try:
            answer = context.request.get(page_url)  # the browser context's own HTTP client
            assert answer.status == 401
            assert answer.headers["www-authenticate"].startswith("Basic")
            assert run_id_of(finished) not in answer.text()
            # Headless chromium has no login dialog: a 401 with a challenge and no
            # credentials ends the navigation with this error.
            with pytest.raises(Error, match="ERR_INVALID_AUTH_CREDENTIALS"):
                context.new_page().goto(page_url)
        finally:
            context.close()
