"""The web view's application: pages for the runs, a run and a ticket, /metrics, and the
operator's actions (approve, reject, cancel, requeue) as POSTs calling the CLI's own code.

    GET  /                                       runs, newest first (filter, pages)
    GET  /runs/<run>                             a run: steps, counts, tickets (live)
    GET  /runs/<run>/tickets/<ticket>            a ticket's whole story
    GET  /metrics                                Prometheus text
    POST /runs/<run>/cancel                      ticketgraph cancel
    POST /runs/<run>/requeue                     ticketgraph requeue
    POST /runs/<run>/tickets/<ticket>/decide     ticketgraph approve / reject

Every id from a URL passes the id rules (run/ids.py) before a path is built from it. Pages
are Jinja2 templates with autoescaping on: ticket text, replies and tool output are customer
data and reach the page only as text. A page asked for by htmx (the live parts) gets only
its live fragment.
"""

from __future__ import annotations

import math
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

import jinja2
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from orchestrator.config.workspace import Workspace
from orchestrator.errors import GraphError, RunStateError, UsageError
from orchestrator.run import ids, store
from orchestrator.steps import report
from orchestrator.web import login, metrics, story
from orchestrator.web.catalog import Catalog, RunRow, TicketRow

HERE = Path(__file__).parent
RUNS_PER_PAGE = 50
TICKETS_PER_PAGE = 100
MAX_PER_PAGE = 1000
LIVE_EVERY_S = 1
TICKET_SORTS = ("id", "category", "handler", "rounds", "stop", "status", "cost")
CANCEL_WAIT_S = 5.0


@dataclass
class Settings:
    """What the application serves and who may act."""

    workspace: Path
    read_only: bool
    broker_url: str | None = None


class NotFound(Exception):
    """A run or ticket that is not there (or an id that is not one)."""


def application(
    workspace: Path,
    read_only: bool = False,
    login_: login.Login | None = None,
    broker_url: str | None = None,
    hosts: list[str] | None = None,
) -> Starlette:
    """The web application for `workspace`; behind `login_` (basic auth) if given, and then
    with actions unless `read_only`; answering only requests for `hosts` (the Host header;
    None: any), so a web page whose name was rebound to this address reads nothing."""
    settings = Settings(workspace.resolve(), read_only or login_ is None, broker_url)
    view = View(settings)
    routes = [
        Route("/", view.runs_page),
        Route("/metrics", view.metrics),
        Route("/runs/{run_id}", view.run_page),
        Route("/runs/{run_id}/tickets/{ticket_id}", view.ticket_page),
        Route("/runs/{run_id}/cancel", view.cancel, methods=["POST"]),
        Route("/runs/{run_id}/requeue", view.requeue, methods=["POST"]),
        Route("/runs/{run_id}/tickets/{ticket_id}/decide", view.decide, methods=["POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    handlers = {NotFound: view.not_found, _Refused: view.refused}
    app = Starlette(routes=routes, exception_handlers=handlers)  # type: ignore[arg-type]
    if login_ is not None:
        app.add_middleware(login.BasicAuth, login=login_)
    if hosts is not None:  # outermost but one: a rebound name is refused before the login
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=hosts)
    app.add_middleware(_Headers)
    return app


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,  # every template, whatever its name
        undefined=jinja2.StrictUndefined,
    )
    env.filters["usd"] = lambda v: "-" if v is None else report.usd(v)  # as the report shows it
    env.filters["seconds"] = lambda v: "-" if v is None else f"{v:.1f} s"
    return env


class View:
    """The handlers, sharing one catalog of the workspace's runs."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.catalog = Catalog(settings.workspace)
        env = _environment()
        for name in env.list_templates():  # compiled once, before the first request
            env.get_template(name)
        self.templates = Jinja2Templates(env=env)
        self.tokens = login.Tokens()
        self.notes: dict[str, str] = {}  # what an action said, shown once after its redirect

    # --- pages ---------------------------------------------------------------------------

    async def runs_page(self, request: Request) -> Response:
        return await run_in_threadpool(self._runs_page, request)

    def _runs_page(self, request: Request) -> Response:
        query = request.query_params
        rows = self.catalog.runs()
        chosen = {k: query.get(k, "") for k in ("status", "verdict")}
        shown = [
            r
            for r in rows
            if chosen["status"] in ("", r.status) and chosen["verdict"] in ("", _shown_verdict(r))
        ]
        page = _page(query.get("page"), len(shown), RUNS_PER_PAGE)
        start = (page.number - 1) * RUNS_PER_PAGE
        context = {
            "rows": shown[start : start + RUNS_PER_PAGE],
            "total": len(rows),
            "matching": len(shown),
            "page": page,
            "chosen": chosen,
            "statuses": sorted({r.status for r in rows}),
            "verdicts": sorted({_shown_verdict(r) for r in rows}),
            "live": any(r.live for r in shown[start : start + RUNS_PER_PAGE]),
            "link": lambda **changed: _link("/", chosen, changed),
            "self_url": str(request.url.path)
            + (f"?{request.url.query}" if request.url.query else ""),
        }
        return self._render(request, "runs.html", context)

    async def run_page(self, request: Request) -> Response:
        return await run_in_threadpool(self._run_page, request)

    def _run_page(self, request: Request) -> Response:
        run_id = _run_id(request)
        view = self.catalog.view(run_id)
        if view is None:
            raise NotFound(f"no run {run_id}")
        row, meta, tickets = view.row, view.meta, view.tickets
        query = request.query_params
        chosen = {k: query.get(k, "") for k in ("status", "category", "handler", "q")}
        sort = query.get("sort", "id") if query.get("sort") in TICKET_SORTS else "id"
        descending = query.get("desc") == "1"
        shown = _filtered(tickets, chosen)
        if sort != "id" or descending:  # the catalog keeps them by id
            shown.sort(key=_sort_key(sort), reverse=descending)
        per = _per_page(query.get("per"))
        page = _page(query.get("page"), len(shown), per)
        start = (page.number - 1) * per
        state = {**chosen, "sort": sort, "desc": "1" if descending else "", "per": str(per)}
        base = f"/runs/{run_id}"
        context = {
            "run": row,
            "meta": meta,
            "nodes": _nodes(meta, view.nodes, row.live),
            "counts": sorted(row.by_status.items()),
            "rows": shown[start : start + per],
            "matching": len(shown),
            "page": page,
            "chosen": chosen,
            "sort": sort,
            "descending": descending,
            "statuses": sorted({t.status for t in tickets}),
            "categories": sorted({t.category for t in tickets}),
            "handlers": sorted({t.handler for t in tickets}),
            "rejected": meta.get("rejected") or [],
            "live": row.live,
            "link": lambda **changed: _link(base, state, changed),
            "sort_link": lambda column: _link(
                base,
                state,
                {"sort": column, "desc": "" if sort != column or descending else "1", "page": ""},
            ),
            "self_url": base + (f"?{request.url.query}" if request.url.query else ""),
            "live_every_s": LIVE_EVERY_S,
            "per": per,
        }
        return self._render(request, "run.html", context)

    async def ticket_page(self, request: Request) -> Response:
        return await run_in_threadpool(self._ticket_page, request)

    def _ticket_page(self, request: Request) -> Response:
        run_id, ticket_id = _run_id(request), _ticket_id(request)
        run_store = self._store(run_id)
        try:
            told = story.read(run_store, self.settings.workspace, ticket_id)
        except RunStateError as exc:
            raise NotFound(str(exc)) from None
        row = self.catalog.run(run_id)
        context = {"run": row, "story": told, "record": told.record}
        context["writes"] = _writes(self.settings.workspace, run_store, ticket_id)
        return self._render(request, "ticket.html", context)

    async def metrics(self, request: Request) -> Response:
        body = await run_in_threadpool(lambda: generate_latest(metrics.registry(self.catalog.runs)))
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    # --- actions -------------------------------------------------------------------------

    async def cancel(self, request: Request) -> Response:
        run_id = _run_id(request)
        form = await self._form(request)

        def act() -> str:
            from orchestrator.submission import decisions

            return decisions.cancel(
                Workspace(self.settings.workspace),
                run_id,
                [],
                _by(request),
                form.get("reason", ""),
                self.settings.broker_url,
                CANCEL_WAIT_S,
            )

        return await self._act(request, f"/runs/{run_id}", act)

    async def requeue(self, request: Request) -> Response:
        run_id = _run_id(request)
        form = await self._form(request)
        tickets = [t for t in form.getlist("ticket") if t]
        if bad := [t for t in tickets if not ids.is_ticket_id(t)]:
            raise _Refused(400, f"400: {bad[0]!r} is not a ticket id")

        def act() -> str:
            from orchestrator.submission import decisions

            moved = decisions.requeue(
                Workspace(self.settings.workspace), run_id, tickets, _by(request)
            )
            return moved or "nothing to requeue (no claimed file left)\n"

        return await self._act(request, f"/runs/{run_id}", act)

    async def decide(self, request: Request) -> Response:
        run_id, ticket_id = _run_id(request), _ticket_id(request)
        form = await self._form(request)
        approved = form.get("decision") == "approve"
        if form.get("decision") not in ("approve", "reject"):
            return PlainTextResponse("400: decision must be approve or reject\n", 400)
        reason = form.get("reason", "")
        if not approved and not reason.strip():
            return PlainTextResponse("400: a rejection needs a reason (the model reads it)\n", 400)

        def act() -> str:
            from orchestrator.submission import decisions

            return decisions.decide(
                Workspace(self.settings.workspace),
                run_id,
                ticket_id,
                form.get("call_id") or None,
                approved,
                _by(request),
                reason,
            )

        return await self._act(request, f"/runs/{run_id}/tickets/{ticket_id}", act)

    async def _form(self, request: Request) -> _Form:
        """The POST's form, once the request may act: the login, read-write, the same
        origin and the CSRF token; `_Refused` otherwise."""
        if self.settings.read_only:
            raise _Refused(403, "403: this web view is read-only (started with --no-auth)")
        if not login.same_origin(request.headers):
            raise _Refused(403, "403: the form was sent from another site")
        body = (await request.body()).decode("utf-8", errors="replace")
        form = _Form(parse_qs(body, keep_blank_values=True))
        if not self.tokens.valid(request.scope.get("user_name", ""), form.get("csrf")):
            raise _Refused(403, "403: the form's CSRF token is missing or stale; reload the page")
        return form

    async def _act(self, request: Request, back: str, act: Any) -> Response:
        try:
            said = await run_in_threadpool(act)
        except GraphError as exc:
            said = f"refused: {exc}\n"
        except OSError as exc:
            said = f"failed: {exc}\n"
        note = secrets.token_urlsafe(8)
        self.notes[note] = said
        while len(self.notes) > 100:
            self.notes.pop(next(iter(self.notes)))
        return RedirectResponse(f"{back}?note={note}", status_code=303)

    # --- helpers -------------------------------------------------------------------------

    def _store(self, run_id: str) -> store.RunStore:
        try:
            return store.find(Workspace(self.settings.workspace), run_id)
        except UsageError as exc:
            raise NotFound(str(exc)) from None

    def _render(self, request: Request, name: str, context: dict[str, Any]) -> Response:
        fragment = request.headers.get("hx-request") == "true"
        user = request.scope.get("user_name")
        context |= {
            "fragment": fragment,
            "read_only": self.settings.read_only,
            "user": user,
            "csrf": self.tokens.token(user) if user else "",
            "note": None
            if fragment
            else self.notes.pop(request.query_params.get("note", ""), None),
        }
        response = self.templates.TemplateResponse(request, name, context)
        response.headers["Vary"] = "HX-Request"  # the page and its live fragment share a URL
        response.headers["Cache-Control"] = "no-store"
        return response

    async def not_found(self, request: Request, exc: Exception) -> Response:
        return PlainTextResponse(f"404: {exc}\n", status_code=404)

    async def refused(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, _Refused)
        return PlainTextResponse(f"{exc.text}\n", status_code=exc.status)


class _Headers:
    """ASGI middleware: every response refuses to be framed by another page (a framed form
    would carry this site's token and login) and to be sniffed as another type."""

    HEADERS = (
        (b"content-security-policy", b"frame-ancestors 'none'"),
        (b"x-frame-options", b"DENY"),
        (b"x-content-type-options", b"nosniff"),
        (b"referrer-policy", b"same-origin"),
    )

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], *self.HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers if scope["type"] == "http" else send)


class _Refused(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status, self.text = status, text


class _Form:
    """A urlencoded form (every action's body)."""

    def __init__(self, fields: dict[str, list[str]]) -> None:
        self.fields = fields

    def get(self, name: str, default: str = "") -> str:
        values = self.fields.get(name)
        return values[0] if values else default

    def getlist(self, name: str) -> list[str]:
        return self.fields.get(name, [])


@dataclass(frozen=True)
class _Page:
    number: int
    count: int

    @property
    def previous(self) -> int | None:
        return self.number - 1 if self.number > 1 else None

    @property
    def next(self) -> int | None:
        return self.number + 1 if self.number < self.count else None


def _page(asked: str | None, items: int, per: int) -> _Page:
    count = max(1, math.ceil(items / per))
    try:
        number = int(asked or 1)
    except ValueError:
        number = 1
    return _Page(min(max(number, 1), count), count)


def _per_page(asked: str | None) -> int:
    try:
        return min(max(int(asked or TICKETS_PER_PAGE), 1), MAX_PER_PAGE)
    except ValueError:
        return TICKETS_PER_PAGE


def _link(base: str, state: dict[str, str], changed: dict[str, Any]) -> str:
    merged = {**state, **{k: "" if v is None else str(v) for k, v in changed.items()}}
    query = urlencode({k: v for k, v in merged.items() if v not in ("", None)})
    return f"{base}?{query}" if query else base


def _filtered(tickets: list[TicketRow], chosen: dict[str, str]) -> list[TicketRow]:
    q = chosen["q"].strip().lower()
    return [
        t
        for t in tickets
        if chosen["status"] in ("", t.status)
        and chosen["category"] in ("", t.category)
        and chosen["handler"] in ("", t.handler)
        and (not q or q in t.id.lower())
    ]


def _sort_key(column: str) -> Any:
    field = {"cost": "cost_usd"}.get(column, column)
    return lambda t: (getattr(t, field), t.id)


def _shown_verdict(row: RunRow) -> str:
    return "cancelled" if row.cancelled else row.verdict


def _nodes(
    meta: dict[str, Any], nodes: dict[str, dict[str, Any]], live: bool
) -> list[dict[str, Any]]:
    """The report's steps table: the plan's nodes in order, then any other (the report's)."""
    order = (meta.get("config") or {}).get("nodes") or []
    names = [n for n in order if n in nodes] + sorted(set(nodes) - set(order))
    rows = []
    for name in names:
        node = nodes[name]
        status = node.get("status", "running")
        ms = node.get("ms", 0)
        if status != "ok" and node.get("started"):
            if live:
                ms = round((time.time() - node["started"]) * 1000)
            else:
                status = "crashed" if meta.get("status") == "crashed" else "stopped"
        rows.append({**node, "name": name, "status": status, "ms": ms})
    return rows


def _run_id(request: Request) -> str:
    value = request.path_params["run_id"]
    try:
        return ids.run(value)
    except RunStateError:
        raise NotFound(f"{value!r} is not a run id") from None


def _ticket_id(request: Request) -> str:
    value = request.path_params["ticket_id"]
    if not ids.is_ticket_id(value):
        raise NotFound(f"{value!r} is not a ticket id")
    return value


def _by(request: Request) -> str:
    """Who acts: the login's user name, marked as the web view's."""
    return f"{request.scope.get('user_name', 'unknown')} (web)"


def _writes(workspace: Path, run_store: store.RunStore, ticket_id: str) -> list[tuple[Any, str]]:
    """The ticket's writes in the workspace's ledger, each with what a requeue does with it."""
    from orchestrator.run import ledger

    return [
        (w, ledger.fate(w, False))
        for w in ledger.of_ticket(Workspace(workspace), run_store, ticket_id)
    ]
