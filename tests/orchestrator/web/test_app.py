"""The web view's application on real run folders: login, pages, id rules, escaping, CSRF,
/metrics, paging, and actions calling the CLI's code. The application runs in this process
(Starlette's TestClient) over folders written by real `ticketgraph run` processes; the
command itself (its login rule, its port) runs as a real process."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from bench.web import big_run
from orchestrator.config.workspace import Workspace
from orchestrator.web import catalog, login
from orchestrator.web.app import application
from tests.orchestrator.web.conftest import (
    LOGIN,
    PASSWORD,
    USER,
    free_port,
    run_cli,
    run_id_of,
    web_server,
)
from workers import versions

STATIC = Path(__file__).resolve().parents[3] / "orchestrator" / "web" / "static"
AUTH = (USER, PASSWORD)


def client(workspace: Path, read_only: bool = False) -> TestClient:
    app = application(Workspace(workspace), read_only=read_only, login_=login.Login(USER, PASSWORD))
    basic = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    return TestClient(
        app, base_url="http://testserver", headers={"Authorization": f"Basic {basic}"}
    )


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]{64})"', html)
    assert found, "the page has no form with a CSRF token"
    return found.group(1)


def test_every_path_asks_for_the_login(finished: Path) -> None:
    run_id = run_id_of(finished)
    app = application(Workspace(finished), login_=login.Login(USER, PASSWORD))
    with TestClient(app) as anonymous:
        for path in ("/", f"/runs/{run_id}", f"/runs/{run_id}/tickets/T-1004", "/metrics"):
            answer = anonymous.get(path)
            assert answer.status_code == 401, path
            assert answer.headers["www-authenticate"].startswith('Basic realm="ticketgraph"')
        wrong = "Basic " + base64.b64encode(f"{USER}:nope".encode()).decode()
        assert anonymous.get("/", headers={"Authorization": wrong}).status_code == 401
        assert anonymous.get("/", headers={"Authorization": "Basic %%%"}).status_code == 401
    with client(finished) as signed_in:
        assert signed_in.get("/").status_code == 200


def test_the_pages_show_the_reference_run(finished: Path) -> None:
    run_id = run_id_of(finished)
    with client(finished) as web:
        runs = web.get("/").text
        assert run_id in runs and "needs_human" in runs and "$0.0386" in runs
        page = web.get(f"/runs/{run_id}").text
        for node in ("route", "fanout", "merge", "review", "report"):
            assert f"<td>{node}</td>" in page
        rows = re.findall(r'data-ticket="(T-\d+)"', page)
        assert rows == [f"T-100{i}" for i in range(1, 7)]
        assert 'data-status="pass">5<' in page and 'data-status="needs_human">1<' in page
        assert "(clamped)" in page  # T-1006: the router said 'complaint'
        ticket = web.get(f"/runs/{run_id}/tickets/T-1004").text
        assert ticket.count('class="gate-round"') == 2
        assert ticket.count("filler_word:please wait a moment") >= 2
        assert "lookup_order" in ticket and "A-77420" in ticket  # the tool call and result
        assert "no_progress" in ticket and "out/T-1004.txt" in ticket


def test_ids_in_urls_pass_the_id_rules_before_any_path(finished: Path) -> None:
    run_id = run_id_of(finished)
    outside = finished.parent / "secret.txt"
    outside.write_text("not for the web")
    with client(finished) as web:
        for path in (
            "/runs/..%2F..%2Fsecret.txt",
            "/runs/run-nope",
            f"/runs/{run_id}/tickets/..%2F..%2F..%2Fsecret",
            f"/runs/{run_id}/tickets/T-9999",
            f"/runs/{run_id}/tickets/.hidden",
        ):
            answer = web.get(path)
            assert answer.status_code == 404, path
            assert "not for the web" not in answer.text


def test_customer_text_is_escaped(tmp_path: Path, finished: Path) -> None:
    workspace = tmp_path / "ws"
    shutil.copytree(finished, workspace, symlinks=True)
    run_id = run_id_of(workspace)
    run_dir = workspace / "runs" / run_id
    attack = '<script>alert(1)</script><img src=x onerror="alert(2)">'
    (run_dir / "tickets" / "T-1001.txt").write_text(f"My order {attack}")
    (workspace / "out" / "T-1001.txt").write_text(f"Reply {attack}")
    record = versions.read_json(run_dir / "records" / "T-1001.json")
    record.update(subject=attack, category=attack)
    (run_dir / "records" / "T-1001.json").write_text(json.dumps(record))
    materialised = json.loads((run_dir / "run-state.json").read_text())  # the ended run's list
    materialised["tickets"]["T-1001"] = record
    (run_dir / "run-state.json").write_text(json.dumps(materialised))
    with client(workspace) as web:
        for path in (f"/runs/{run_id}/tickets/T-1001", f"/runs/{run_id}"):
            html = web.get(path).text
            assert "<script>alert" not in html and "<img src=x" not in html, path
            assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html, path


def test_actions_need_the_token_a_page_of_this_server_carries(finished: Path) -> None:
    run_id = run_id_of(finished)
    with client(finished) as web:
        url = f"/runs/{run_id}/requeue"
        assert web.post(url, data={}).status_code == 403
        assert web.post(url, data={"csrf": "0" * 64}).status_code == 403
        token = csrf_of(web.get(f"/runs/{run_id}").text)
        other_site = {"Origin": "http://evil.example"}
        assert web.post(url, data={"csrf": token}, headers=other_site).status_code == 403
        assert web.get(url).status_code == 405  # an action is never a GET
    with client(finished, read_only=True) as web:
        page = web.get(f"/runs/{run_id}").text
        assert 'name="csrf"' not in page  # read-only: no forms
        assert web.post(f"/runs/{run_id}/requeue", data={"csrf": token}).status_code == 403


def test_requeue_through_the_form_moves_the_files_and_traces_who(
    tmp_path: Path, finished: Path
) -> None:
    workspace = tmp_path / "ws"
    shutil.copytree(finished, workspace, symlinks=True)
    run_id = run_id_of(workspace)
    with client(workspace) as web:
        token = csrf_of(web.get(f"/runs/{run_id}").text)
        done = web.post(
            f"/runs/{run_id}/requeue",
            data={"csrf": token, "ticket": ["T-1002", "T-1004"]},
            headers={"Origin": "http://testserver"},
            follow_redirects=True,
        )
        assert done.status_code == 200
        assert "inbox/T-1002.txt" in done.text and "inbox/T-1004.txt" in done.text
        ticket_page = web.get(f"/runs/{run_id}/tickets/T-1005").text
        assert 'name="ticket" value="T-1005"' in ticket_page  # its own requeue form
        bad = web.post(f"/runs/{run_id}/requeue", data={"csrf": token, "ticket": "../x"})
        assert bad.status_code == 400
    assert sorted(p.name for p in (workspace / "inbox").iterdir()) == ["T-1002.txt", "T-1004.txt"]
    trace = (workspace / "runs" / run_id / "run.jsonl").read_text().splitlines()
    requeued = [json.loads(line) for line in trace if '"requeued"' in line]
    assert [(e["by"], e["files"]) for e in requeued] == [
        (f"{USER} (web)", ["T-1002.txt", "T-1004.txt"])
    ]


def test_metrics_come_from_the_records_without_ticket_ids(finished: Path) -> None:
    run_id = run_id_of(finished)
    with client(finished) as web:
        text = web.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    value = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in families.values()
        for s in f.samples
    }
    assert value[("ticketgraph_tickets", (("status", "pass"),))] == 5
    assert value[("ticketgraph_tickets", (("status", "needs_human"),))] == 1
    assert value[("ticketgraph_runs", (("verdict", "needs_human"),))] == 1
    assert value[("ticketgraph_model_calls_total", ())] == 11
    assert value[("ticketgraph_tokens_total", ())] == 720 + 8903 + 3033
    assert value[("ticketgraph_cost_usd_total", ())] == pytest.approx(0.0386, abs=1e-4)
    labels = (("run_id", run_id), ("verdict", "needs_human"))
    assert value[("ticketgraph_run_tickets", labels)] == 6
    assert value[("ticketgraph_awaiting_approval", ())] == 0
    assert value[("ticketgraph_tickets_in_flight", ())] == 0
    assert "T-10" not in text and "ticket=" not in text


def test_a_big_run_is_paged_sorted_and_filtered(tmp_path: Path, finished: Path) -> None:
    workspace = tmp_path / "big"
    (workspace / "runs").mkdir(parents=True)
    shutil.copy(finished / "ticketgraph.toml", workspace)
    source = finished / "runs" / run_id_of(finished)
    run_id = "run-20261201-000000-big0"
    big_run(source, workspace / "runs", run_id, 250)
    with client(workspace) as web:
        first = web.get(f"/runs/{run_id}").text
        assert re.findall(r'data-ticket="(T-\d+)"', first)[:2] == ["T-00001", "T-00002"]
        assert len(re.findall(r'data-ticket="', first)) == 100
        assert "page 1 of 3" in first
        last = web.get(f"/runs/{run_id}?page=3").text
        assert len(re.findall(r'data-ticket="', last)) == 50
        human = web.get(f"/runs/{run_id}?status=needs_human&per=1000").text
        shown = re.findall(r'data-ticket="(T-\d+)"', human)
        assert len(shown) == 250 // 6 + (1 if 250 % 6 > 3 else 0)  # every 6th is T-1004's copy
        assert set(re.findall(r'<td class="status">(\w+)</td>', human)) == {"needs_human"}
        costly = web.get(f"/runs/{run_id}?sort=cost&desc=1").text
        ticket_rows = re.findall(
            r'data-ticket="[^"]+">.*?<td>\$(\d+\.\d+)</td>\s*</tr>', costly, re.S
        )
        costs = [float(c) for c in ticket_rows]
        assert costs == sorted(costs, reverse=True) and costs[0] == pytest.approx(0.012, abs=1e-3)
        runs = web.get("/?status=done").text
        assert run_id in runs


def test_a_live_runs_records_are_read_whole_even_when_one_grew_since_it_was_listed(
    tmp_path: Path, finished: Path
) -> None:
    """A live run's page reads records/ one file each, at the size it listed; a record
    replaced by a larger or a smaller one in between is read whole, to its end (a cut one
    would not parse, and its ticket would be missing from the page). The page then shows
    every ticket of the live run, the grown record's among them."""
    workspace = tmp_path / "live"
    (workspace / "runs").mkdir(parents=True)
    shutil.copy(finished / "ticketgraph.toml", workspace)
    source = finished / "runs" / run_id_of(finished)
    run_id = "run-20261201-000000-live"
    big_run(source, workspace / "runs", run_id, 12, live=True)
    record = workspace / "runs" / run_id / "records" / "T-00003.json"
    grown = versions.read_json(record) | {"category": "billing", "note": "x" * 70_000}
    text = json.dumps(grown)
    assert _read_at(record, 10) == record.read_bytes()  # listed at 10 bytes
    assert _read_at(record, 1 << 20) == record.read_bytes()  # listed at 1 MiB
    record.write_text(text)
    assert _read_at(record, 100) == text.encode()
    assert catalog._read_keyed(str(record)) == (catalog._key(record), text.encode())
    with client(workspace) as web:
        page = web.get(f"/runs/{run_id}?per=100").text
    assert len(re.findall(r'data-ticket="', page)) == 12


def _read_at(path: Path, size: int) -> bytes:
    """The catalog's read of an open record that was listed at `size` bytes."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return catalog._read_fd(fd, size)
    finally:
        os.close(fd)


def test_run_json_keeps_the_totals_a_list_reads(finished: Path) -> None:
    meta = json.loads((finished / "runs" / run_id_of(finished) / "run.json").read_text())
    assert meta["totals"] == {
        "tickets": 6,
        "by_status": {"pass": 5, "needs_human": 1},
        "calls": 11,
        "tokens": 12656,
        "cost_usd": pytest.approx(0.0386, abs=1e-4),
    }


def test_the_vendored_htmx_is_the_pinned_file() -> None:
    table = (STATIC / "VENDORED.md").read_text()
    name, _package, version, digest = re.search(
        r"\| (htmx-[\d.]+\.min\.js) \| (.+?) \| ([\d.]+) \| ([0-9a-f]{64}) \|", table
    ).groups()
    assert hashlib.sha256((STATIC / name).read_bytes()).hexdigest() == digest
    assert version in name
    templates = (STATIC.parent / "templates" / "base.html").read_text()
    assert f'src="/static/{name}"' in templates


def test_the_command_refuses_to_start_without_a_login(finished: Path) -> None:
    refused = run_cli("web", "--workspace", str(finished), "--port", str(free_port()), cwd=finished)
    assert refused.returncode == 78
    assert "TICKETGRAPH_WEB_USER" in refused.stderr and "--no-auth" in refused.stderr
    half = run_cli(
        "web",
        "--port",
        str(free_port()),
        cwd=finished,
        env={"TICKETGRAPH_WEB_USER": USER},
    )
    assert half.returncode == 78 and "TICKETGRAPH_WEB_PASSWORD is not set" in half.stderr
    assert PASSWORD not in half.stderr
    nowhere = run_cli("web", "--workspace", str(finished / "nope"), cwd=finished, env=LOGIN)
    assert nowhere.returncode == 64


def test_the_command_serves_with_its_login_and_read_only_without(finished: Path) -> None:
    run_id = run_id_of(finished)
    with web_server(finished) as url:
        assert httpx.get(f"{url}/").status_code == 401
        page = httpx.get(f"{url}/runs/{run_id}", auth=AUTH)
        assert page.status_code == 200 and 'name="csrf"' in page.text
        port = url.rsplit(":", 1)[1]  # taken by the server
        taken = run_cli("web", "--port", port, cwd=finished, env=LOGIN)
        assert taken.returncode == 78 and "cannot listen" in taken.stderr
        rebound = httpx.get(f"{url}/", auth=AUTH, headers={"Host": "evil.example"})
        assert rebound.status_code == 400  # a page whose name was rebound to 127.0.0.1
        assert run_id not in rebound.text
        for header, value in (
            ("content-security-policy", "frame-ancestors 'none'"),
            ("x-frame-options", "DENY"),
            ("x-content-type-options", "nosniff"),
        ):
            assert page.headers[header] == value
    with web_server(finished, "--no-auth") as url:
        page = httpx.get(f"{url}/runs/{run_id}")
        assert page.status_code == 200 and 'name="csrf"' not in page.text
        assert httpx.post(f"{url}/runs/{run_id}/requeue").status_code == 403


def test_made_up_run_ids_are_not_kept(finished: Path) -> None:
    from orchestrator.web.catalog import Catalog

    catalog = Catalog(Workspace(finished))
    for k in range(50):
        assert catalog.run(f"run-made-up-{k}") is None
    assert catalog.run(run_id_of(finished)) is not None
    assert len(catalog._folders) == 1


def test_agent_runs_are_listed_in_the_order_they_ran() -> None:
    from orchestrator.web.story import AgentView, _ran_order

    steps = ["review-10", "evaluate-1", "review-2", "draft", "review-1", "evaluate-2"]
    views = sorted((AgentView(step=s, status="completed", stop="") for s in steps), key=_ran_order)
    assert [v.step for v in views] == [
        "draft",
        "evaluate-1",
        "review-1",
        "evaluate-2",
        "review-2",
        "review-10",
    ]


def test_a_waiting_call_is_rejected_through_the_form_with_its_reason(tmp_path: Path) -> None:
    from orchestrator.config.workspace import init_demo
    from tests.conftest import write_scenarios
    from tests.orchestrator.run.test_approvals import _with_refund

    workspace = tmp_path / "reject"
    init_demo(workspace)
    write_scenarios(workspace / "scenarios" / "demo.yaml", _with_refund(39900))
    assert run_cli("run", "--quiet", cwd=workspace).returncode == 1
    run_id = run_id_of(workspace)
    url = f"/runs/{run_id}/tickets/T-1001"
    with client(workspace) as web:
        token = csrf_of(web.get(url).text)
        form = {"csrf": token, "call_id": "call_r1", "decision": "reject"}
        assert web.post(f"{url}/decide", data=form).status_code == 400  # a reason is needed
        done = web.post(f"{url}/decide", data={**form, "reason": "not in policy"})
        assert done.status_code == 200 and "rejected:" in done.text
        assert f"rejected by {USER} (web)" in done.text and "not in policy" in done.text
    made = [json.loads(p.read_text()) for p in (workspace / "runs" / run_id).glob("decisions/*")]
    assert [(d["approved"], d["by"], d["reason"]) for d in made] == [
        (False, f"{USER} (web)", "not in policy")
    ]
