"""The person's pages of the web view on real run folders (one real demo run with the refund
example, copied per test): the queue's filters and counts, a batch decision asked once,
requeue asking first, forms kept on a mistake and on a stale token, no server path in a
response, and one rounding of costs. The application runs in this process (Starlette's
TestClient); the runs were written by a real `ticketgraph run`."""

from __future__ import annotations

import base64
import json
import re
import shutil
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from orchestrator.config.workspace import Workspace, init_demo
from orchestrator.steps.report import usd
from orchestrator.web import login
from orchestrator.web.app import application
from tests.conftest import settled
from tests.orchestrator.web.conftest import PASSWORD, USER, run_cli, run_id_of
from tests.orchestrator.web.test_app import client, csrf_of

SAME_SITE = {"Origin": "http://testserver"}
BY = f"{USER} (web)"


@pytest.fixture(scope="module")
def waiting(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A demo workspace after one real run with T-1007 and T-1008 (two refunds waiting for a
    person) besides the demo's six (T-1004 needs a human)."""
    root = tmp_path_factory.mktemp("people") / "demo"
    init_demo(root)
    for name in ("T-1007.txt", "T-1008.txt"):
        (root / "inbox" / name).write_bytes((root / "examples" / name).read_bytes())
        settled(root / "inbox" / name)
    done = run_cli("run", "--quiet", cwd=root)
    assert done.returncode == 1, done.stderr
    return root


@pytest.fixture
def workspace(tmp_path: Path, waiting: Path) -> Path:
    copy = tmp_path / "ws"
    shutil.copytree(waiting, copy, symlinks=True)
    return copy


def _rows(html: str) -> list[tuple[str, str]]:
    return re.findall(r'<tr class="item [^"]*" data-kind="(\w+)" data-ticket="([^"]+)"', html)


def test_the_queue_lists_what_waits_in_words_and_filters_it(workspace: Path) -> None:
    run_id = run_id_of(workspace)
    with client(workspace) as web:
        page = web.get("/queue").text
        assert sorted(_rows(page)) == [("call", "T-1007"), ("call", "T-1008"), ("ticket", "T-1004")]
        assert 'data-kind="call">2<' in page and 'data-kind="ticket">1<' in page
        assert "amount 1,280.00" in page and "128000" not in page
        assert "amount_cents &gt; 5000" in page and "expires 20" in page
        assert "the same report twice" in page  # the stop in words
        assert _rows(web.get("/queue?kind=ticket").text) == [("ticket", "T-1004")]
        approvals = sorted(_rows(web.get("/queue?reason=approval").text))
        assert approvals == [("call", "T-1007"), ("call", "T-1008")]
        assert _rows(web.get("/queue?category=bug").text) == []
        assert _rows(web.get("/queue?age=1").text) == []  # nothing waited an hour
        assert len(_rows(web.get(f"/queue?run={run_id}").text)) == 3
        assert _rows(web.get("/queue?run=run-20000101-000000-0000").text) == []
        # A run filter is a run id or nothing: never a pattern that reaches another folder.
        assert _rows(web.get("/queue?run=../../*").text) == []
        for path in ("/", f"/runs/{run_id}", f"/runs/{run_id}/tickets/T-1004", "/queue"):
            assert 'href="/queue"' in web.get(path).text, path  # linked from every page


def test_several_calls_are_decided_with_one_confirmation(workspace: Path) -> None:
    run_id = run_id_of(workspace)
    decisions = workspace / "runs" / run_id / "decisions"
    with client(workspace) as web:
        token = csrf_of(web.get("/queue").text)
        calls = re.findall(r'name="call" value="([^"]+)"', web.get("/queue").text)
        assert len(calls) == 2
        form = {"csrf": token, "call": calls, "decision": "approve"}
        asked = web.post("/queue/decide", data=form, headers=SAME_SITE)
        assert asked.status_code == 200 and "approve 2 calls?" in asked.text
        assert "amount 89.00" in asked.text and "amount 1,280.00" in asked.text
        assert not decisions.exists()  # nothing decided before the confirmation
        done = web.post("/queue/decide", data=form | {"confirmed": "1"}, headers=SAME_SITE)
        assert done.status_code == 200
        assert done.text.count("approved: ") == 2
        assert done.text.count("decided, not resumed") == 2  # shown as such until resumed
        page = web.get(f"/runs/{run_id}").text
        assert 'class="resume"' in page and "2 decided calls wait for it" in page
    made = [json.loads(p.read_text()) for p in sorted(decisions.glob("*.json"))]
    assert [(d["ticket"], d["approved"], d["by"]) for d in made] == [
        ("T-1007", True, BY),
        ("T-1008", True, BY),
    ]


def test_a_rejection_without_a_reason_shows_the_form_again_with_what_to_do(
    workspace: Path,
) -> None:
    run_id = run_id_of(workspace)
    url = f"/runs/{run_id}/tickets/T-1007"
    with client(workspace) as web:
        token = csrf_of(web.get(url).text)
        form = {"csrf": token, "call_id": "call_e2", "decision": "reject", "reason": "  "}
        again = web.post(f"{url}/decide", data=form, headers=SAME_SITE)
        assert again.status_code == 400
        assert "a rejection needs a reason" in again.text and "write one" in again.text
        assert 'class="decide"' in again.text  # the form is still there
        batch = {"csrf": token, "call": f"{run_id}/T-1007/call_e2", "decision": "reject"}
        typed = web.post("/queue/decide", data=batch | {"reason": ""}, headers=SAME_SITE)
        assert typed.status_code == 400 and "a rejection needs a reason" in typed.text
        assert "checked" in typed.text  # the ticked call stays ticked
        edit = {"csrf": token, "action": "edit", "reply": "   ", "reason": "kept"}
        handled = web.post(f"/runs/{run_id}/tickets/T-1004/handle", data=edit, headers=SAME_SITE)
        assert handled.status_code == 400 and "the edited reply is empty" in handled.text
        assert 'value="kept"' in handled.text  # what was typed is still there
    assert not (workspace / "runs" / run_id / "decisions").exists()
    assert not (workspace / "runs" / run_id / "handled").exists()


def test_a_form_with_a_stale_token_is_shown_again_to_send_once_more(workspace: Path) -> None:
    run_id = run_id_of(workspace)
    url = f"/runs/{run_id}/tickets/T-1004"
    with client(workspace) as before_restart:
        old = csrf_of(before_restart.get(url).text)
    reply = "Ticket T-1004: finance reissues the invoice this week."
    form = {"csrf": old, "action": "edit", "reply": reply, "reason": "filler"}
    with client(workspace) as restarted:
        stale = restarted.post(f"{url}/handle", data=form, headers=SAME_SITE)
        assert stale.status_code == 403
        assert "nothing was done" in stale.text and "send it again" in stale.text
        assert reply in stale.text and 'value="filler"' in stale.text  # the form is kept
        assert not (workspace / "runs" / run_id / "handled").exists()
        again = {k: v for k, v in re.findall(r'name="([a-z_]+)" value="([^"]*)"', stale.text)} | {
            "reply": reply
        }
        sent = restarted.post(f"{url}/handle", data=again, headers=SAME_SITE)
        assert sent.status_code == 200 and f"edited: {run_id} T-1004 by {BY}" in sent.text
    assert (workspace / "out" / "T-1004.txt").read_text().strip() == reply


def test_requeue_of_a_waiting_refund_asks_and_moves_only_once_confirmed(workspace: Path) -> None:
    run_id = run_id_of(workspace)
    run_dir = workspace / "runs" / run_id
    with client(workspace) as web:
        token = csrf_of(web.get(f"/runs/{run_id}").text)
        form = {"csrf": token, "ticket": "T-1007"}
        asked = web.post(f"/runs/{run_id}/requeue", data=form, headers=SAME_SITE)
        assert asked.status_code == 200 and "Requeue T-1007?" in asked.text
        assert "waits for a decision on request_refund" in asked.text
        assert "amount 89.00" in asked.text
        assert not list((workspace / "inbox").iterdir())  # asked, nothing moved
        whole = web.post(f"/runs/{run_id}/requeue", data={"csrf": token}, headers=SAME_SITE)
        assert "every ticket of" in whole.text and "T-1008" in whole.text
        done = web.post(
            f"/runs/{run_id}/requeue", data=form | {"confirmed": "1"}, headers=SAME_SITE
        )
        assert done.status_code == 200 and "inbox/T-1007.txt" in done.text
        assert "refused" not in done.text
    assert [p.name for p in (workspace / "inbox").iterdir()] == ["T-1007.txt"]
    requeued = [e for e in (run_dir / "run.jsonl").read_text().splitlines() if "requeued" in e]
    assert len(requeued) == 1 and BY in requeued[0]


def test_no_response_names_a_path_of_the_server(workspace: Path) -> None:
    run_id = run_id_of(workspace)
    root = str(workspace.resolve())
    with client(workspace) as web:
        for path in (
            f"/runs/{run_id}/tickets/T-9999",
            "/runs/run-20000101-000000-0000",
            "/runs/run-20000101-000000-0000/tickets/T-1004",
        ):
            answer = web.get(path)
            assert answer.status_code == 404, path
            assert root not in answer.text and "/tmp" not in answer.text, answer.text
        assert "has no ticket T-9999" in web.get(f"/runs/{run_id}/tickets/T-9999").text
        token = csrf_of(web.get("/queue").text)
        (workspace / "runs" / run_id / "claimed" / "T-1004.txt").unlink()
        said = web.post(
            f"/runs/{run_id}/requeue", data={"csrf": token, "ticket": "T-1004"}, headers=SAME_SITE
        )
        assert root not in said.text


def test_web_and_cli_round_a_cost_the_same_way(finished: Path) -> None:
    # A half, and the same half summed in another order (its last bits either side of it).
    assert usd(0.01675) == usd(0.016749999999999998) == usd(0.0167500000001) == "$0.0168"
    run_id = run_id_of(finished)
    listed = run_cli("runs", cwd=finished).stdout
    cost = re.search(rf"{run_id}.*?(\$\d+\.\d{{4}})", listed)
    assert cost is not None
    app = application(Workspace(finished), read_only=True)
    with TestClient(app) as web:
        assert cost.group(1) in web.get("/").text
        assert cost.group(1) in web.get(f"/runs/{run_id}").text


def test_a_crashed_run_is_resumed_from_its_page_with_retry_failed_all(
    tmp_path: Path, finished: Path
) -> None:
    from orchestrator.exit_codes import ExitCode
    from orchestrator.run.records import RunStatus
    from orchestrator.run.store import RunStore
    from orchestrator.web.resumes import Resume

    workspace = tmp_path / "ws"
    shutil.copytree(finished, workspace, symlinks=True)
    run_id = run_id_of(workspace)
    with RunStore(workspace / "runs" / run_id).update_meta() as meta:
        meta.end(RunStatus.CRASHED, ExitCode.CRASHED, "the worker process died")
    app = application(Workspace(workspace), login_=login.Login(USER, PASSWORD))
    basic = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    with TestClient(app, headers={"Authorization": f"Basic {basic}"}) as web:
        page = web.get(f"/runs/{run_id}").text
        assert 'name="retry" value="all"' in page and "(--retry-failed all)" in page
        token = csrf_of(page)
        form = {"csrf": token, "retry": "all"}
        started = web.post(f"/runs/{run_id}/resume", data=form, headers=SAME_SITE)
        assert started.status_code == 200 and f"resume of {run_id}" in started.text
        resume = app.state.view.people.resumes.of(run_id)
        assert isinstance(resume, Resume) and resume.retry == "all"
        assert "--retry-failed" in resume.process.args and "all" in resume.process.args
        assert resume.done.wait(120), "the resume did not end"
        assert resume.exit_code == ExitCode.NEEDS_HUMAN, resume.output  # T-1004, as before
        assert f"resume of {run_id} ended: exit 1" in web.get(f"/runs/{run_id}").text
    meta_now = json.loads((workspace / "runs" / run_id / "run.json").read_text())
    assert (meta_now["status"], meta_now["exit_code"]) == ("done", 1)


def test_a_ticket_page_shows_the_policys_decision_and_the_refund_its_tool_wrote(
    tmp_path: Path,
) -> None:
    from tests.conftest import write_scenarios
    from tests.orchestrator.run.test_approvals import ORDER, _with_refund

    workspace = tmp_path / "policy"
    init_demo(workspace)
    write_scenarios(workspace / "scenarios" / "demo.yaml", _with_refund(2000))  # under 50.00
    assert run_cli("run", "--quiet", cwd=workspace).returncode == 1  # T-1004
    run_id = run_id_of(workspace)
    with client(workspace) as web:
        page = web.get(f"/runs/{run_id}/tickets/T-1001").text
        assert "approved by the policy (rule <code>amount_cents &gt; 5000</code>)" in page
        recorded = page[page.index('class="actions-recorded"') :]
        assert f"refund (order_id {ORDER}, amount 20.00" in recorded  # the key is not shown
        token = csrf_of(page)
        asked = web.post(
            f"/runs/{run_id}/requeue", data={"csrf": token, "ticket": "T-1001"}, headers=SAME_SITE
        )
        assert "Requeue T-1001?" in asked.text and "its tool wrote: refund (" in asked.text
        assert "amount 20.00" in asked.text and "answered from the ledger" in asked.text
    assert not list((workspace / "inbox").iterdir())
