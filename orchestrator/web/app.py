"""The web view's application: pages for the runs, a run and a ticket, /metrics, and the
operator's actions (approve, reject, cancel, requeue) as POSTs calling the CLI's own code;
the queue of what waits for a person and its actions are people.py's.

    GET  /                                       runs, newest first (filter, pages)
    GET  /queue                                  what waits for a person, across runs
    GET  /runs/<run>                             a run: steps, counts, tickets (live)
    GET  /runs/<run>/tickets/<ticket>            a ticket's whole story
    GET  /metrics                                Prometheus text
    POST /runs/<run>/cancel                      ticketgraph cancel
    POST /runs/<run>/requeue                     ticketgraph requeue (asks first when a
                                                 ticket would set something in motion again)
    POST /runs/<run>/tickets/<ticket>/decide     ticketgraph approve / reject

A mistake in a form shows its page again with what was typed and what to do; a form whose
CSRF token went stale (the server restarted) is shown again, to be sent once more. No
response names a path of the server: what the CLI's code says is made relative to the
workspace first.

Every id from a URL passes the id rules (run/ids.py) before a path is built from it. Pages
are Jinja2 templates with autoescaping on: ticket text, replies and tool output are customer
data and reach the page only as text. A page asked for by htmx (the live parts) gets only
its live fragment.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

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
from orchestrator.people import effects, money, queue, stops
from orchestrator.run import ids, ledger, store
from orchestrator.steps import report
from orchestrator.web import forms, login, metrics, paging, story
from orchestrator.web.catalog import Catalog, RunRow, TicketRow
from orchestrator.web.people import People

HERE = Path(__file__).parent
RUNS_PER_PAGE = 50
LIVE_EVERY_S = 1
TICKET_SORTS = ("id", "category", "handler", "rounds", "stop", "status", "calls", "cost")
CANCEL_WAIT_S = 5.0


@dataclass
class Settings:
    """What the application serves and who may act."""

    workspace: Workspace
    read_only: bool
    broker_url: str | None = None


def application(
    workspace: Workspace,
    read_only: bool = False,
    login_: login.Login | None = None,
    broker_url: str | None = None,
    hosts: list[str] | None = None,
) -> Starlette:
    """The web application for `workspace`; behind `login_` (basic auth) if given, and then
    with actions unless `read_only`; answering only requests for `hosts` (the Host header;
    None: any), so a web page whose name was rebound to this address reads nothing."""
    settings = Settings(
        Workspace(workspace.root.resolve()), read_only or login_ is None, broker_url
    )
    view = View(settings)
    people = view.people
    routes = [
        Route("/", view.runs_page),
        Route("/queue", people.queue_page),
        Route("/queue/decide", people.decide_many, methods=["POST"]),
        Route("/metrics", view.metrics),
        Route("/runs/{run_id}", view.run_page),
        Route("/runs/{run_id}/tickets/{ticket_id}", view.ticket_page),
        Route("/runs/{run_id}/cancel", view.cancel, methods=["POST"]),
        Route("/runs/{run_id}/requeue", view.requeue, methods=["POST"]),
        Route("/runs/{run_id}/resume", people.resume, methods=["POST"]),
        Route("/runs/{run_id}/tickets/{ticket_id}/decide", view.decide, methods=["POST"]),
        Route("/runs/{run_id}/tickets/{ticket_id}/handle", people.handle, methods=["POST"]),
        Route("/runs/{run_id}/tickets/{ticket_id}/audit", people.audit, methods=["POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    handlers = {
        forms.NotFound: view.not_found,
        forms.Refused: view.refused,
        forms.Stale: view.stale,
    }
    app = Starlette(routes=routes, exception_handlers=handlers)  # type: ignore[arg-type]
    app.state.view = view  # what a test asks of it (the resumes it started)
    if login_ is not None:
        app.add_middleware(login.BasicAuth, login=login_)
    if hosts is not None:  # outermost but one: a rebound name is refused before the login
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=hosts)
    app.add_middleware(forms.Headers)
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
        self.people = People(self)

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
        page = paging.page(query.get("page"), len(shown), RUNS_PER_PAGE)
        start = (page.number - 1) * RUNS_PER_PAGE
        on_page = shown[start : start + RUNS_PER_PAGE]
        context = {
            "rows": on_page,
            "handled": {r.run_id: len(self._handled(r.run_id)) for r in on_page},
            "total": len(rows),
            "matching": len(shown),
            "page": page,
            "chosen": chosen,
            "statuses": sorted({r.status for r in rows}),
            "verdicts": sorted({_shown_verdict(r) for r in rows}),
            "live": any(r.live for r in shown[start : start + RUNS_PER_PAGE]),
            "link": lambda **changed: paging.link("/", chosen, changed),
            "self_url": str(request.url.path)
            + (f"?{request.url.query}" if request.url.query else ""),
        }
        return self.render(request, "runs.html", context)

    async def run_page(self, request: Request) -> Response:
        return await run_in_threadpool(self._run_page, request)

    def _run_page(self, request: Request) -> Response:
        run_id = forms.run_id(request)
        view = self.catalog.view(run_id)
        if view is None:
            raise forms.NotFound(f"no run {run_id}")
        row, meta, tickets = view.row, view.meta, view.tickets
        query = request.query_params
        chosen = {k: query.get(k, "") for k in ("status", "category", "handler", "q")}
        sort = query.get("sort", "id") if query.get("sort") in TICKET_SORTS else "id"
        descending = query.get("desc") == "1"
        shown = _filtered(tickets, chosen)
        if sort != "id" or descending:  # the catalog keeps them by id
            shown.sort(key=_sort_key(sort), reverse=descending)
        per = paging.per_page(query.get("per"))
        page = paging.page(query.get("page"), len(shown), per)
        start = (page.number - 1) * per
        state = {**chosen, "sort": sort, "desc": "1" if descending else "", "per": str(per)}
        base = f"/runs/{run_id}"
        context = {
            "run": row,
            "meta": meta,
            "nodes": _nodes(meta, view.nodes, row),
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
            "link": lambda **changed: paging.link(base, state, changed),
            "sort_link": lambda column: paging.link(
                base,
                state,
                {"sort": column, "desc": "" if sort != column or descending else "1", "page": ""},
            ),
            "self_url": base + (f"?{request.url.query}" if request.url.query else ""),
            "live_every_s": LIVE_EVERY_S,
            "per": per,
            "explain": stops.explained,
            "resume": self.people.resumes.of(run_id),
            "waits": self._waits(run_id, row),
            "handled": self._handled(run_id),
        }
        return self.render(request, "run.html", context)

    def _handled(self, run_id: str) -> set[str]:
        """The run's tickets a person handled (names in handled/: nothing parsed)."""
        from orchestrator.run import verdicts

        return verdicts.tickets_with(
            store.RunStore(self.settings.workspace.runs / run_id), verdicts.HANDLED
        )

    def _waits(self, run_id: str, row: RunRow) -> dict[str, int]:
        """What of the run waits for a person (people/queue.py's counts, and `decided`:
        calls a person decided that wait for resume); nothing while the run is live."""
        if row.live:
            return {}
        found = self.people.waiting.items(run_id)
        return queue.counts(found) | {"decided": sum(i.state == "decided" for i in found)}

    async def ticket_page(self, request: Request) -> Response:
        return await run_in_threadpool(self.ticket_page_of, request)

    def ticket_page_of(
        self, request: Request, extra: dict[str, Any] | None = None, status: int = 200
    ) -> Response:
        """A ticket's page (with `extra`: a form's error and what was typed, shown again)."""
        run_id, ticket_id = forms.run_id(request), forms.ticket_id(request)
        run_store = self._store(run_id)
        try:
            told = story.read(run_store, self.settings.workspace, ticket_id)
        except RunStateError:
            raise forms.NotFound(f"run {run_id} has no ticket {ticket_id}") from None
        row = self.catalog.run(run_id)
        context = {
            "run": row,
            "story": told,
            "record": told.record,
            "explain": stops.explained,
            "money": money.words,
            "again": effects.would_run_again(run_store, [ticket_id]).get(ticket_id, []),
            "error": None,
            "typed": {},
            "resume": self.people.resumes.of(run_id),
        }
        context["writes"] = _writes(self.settings.workspace, run_store, ticket_id)
        return self.render(request, "ticket.html", context | (extra or {}), status)

    async def metrics(self, request: Request) -> Response:
        body = await run_in_threadpool(lambda: generate_latest(metrics.registry(self.catalog.runs)))
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    # --- actions -------------------------------------------------------------------------

    async def cancel(self, request: Request) -> Response:
        run_id = forms.run_id(request)
        form = await self.form(request)

        def act() -> str:
            from orchestrator.submission import decisions

            return decisions.cancel(
                self.settings.workspace,
                run_id,
                [],
                forms.by(request),
                form.get("reason", ""),
                self.settings.broker_url,
                CANCEL_WAIT_S,
            )

        return await self.act(request, f"/runs/{run_id}", act)

    async def requeue(self, request: Request) -> Response:
        """Put ticket files back in inbox/; when a ticket would set something in motion
        again (a write its tools made, a call waiting for a decision), first a page that
        names each and asks (`confirmed` then forces it)."""
        run_id = forms.run_id(request)
        form = await self.form(request)
        tickets = [t for t in form.getlist("ticket") if t]
        if bad := [t for t in tickets if not ids.is_ticket_id(t)]:
            raise forms.Refused(400, f"400: {bad[0]!r} is not a ticket id")
        back = form.get("back") if form.get("back", "").startswith(f"/runs/{run_id}") else ""
        confirmed = form.get("confirmed") == "1"
        if not confirmed:
            asked = await run_in_threadpool(self._requeue_asks, request, run_id, tickets, back)
            if asked is not None:
                return asked

        def act() -> str:
            from orchestrator.submission import decisions

            moved = decisions.requeue(
                self.settings.workspace,
                run_id,
                tickets,
                forms.by(request),
                force=confirmed,
            )
            return moved or "nothing to requeue (no claimed file left)\n"

        return await self.act(request, back or f"/runs/{run_id}", act)

    def _requeue_asks(
        self, request: Request, run_id: str, tickets: list[str], back: str
    ) -> Response | None:
        """The page that asks before a requeue that would run something again (None: it
        would not, so nothing is asked)."""
        run_store = self._store(run_id)
        chosen = tickets or run_store.ticket_ids()
        again = effects.would_run_again(run_store, chosen)
        if not again:
            return None
        context = {
            "run_id": run_id,
            "tickets": tickets,
            "again": sorted(again.items()),
            "fates": ledger.fates(self.settings.workspace, run_store, sorted(again)),
            "back": back or f"/runs/{run_id}",
        }
        return self.render(request, "confirm_requeue.html", context)

    async def decide(self, request: Request) -> Response:
        run_id, ticket_id = forms.run_id(request), forms.ticket_id(request)
        form = await self.form(request)
        approved = form.get("decision") == "approve"
        reason = form.get("reason", "")
        problem = None
        if form.get("decision") not in ("approve", "reject"):
            problem = "choose approve or reject"
        elif not approved and not reason.strip():
            problem = "a rejection needs a reason (the model reads it): write one and reject again"
        if problem is not None:
            extra = {"error": problem, "typed": {"reason": reason, "call": form.get("call_id")}}
            return await run_in_threadpool(self.ticket_page_of, request, extra, 400)

        def act() -> str:
            from orchestrator.submission import decisions

            return decisions.decide(
                self.settings.workspace,
                run_id,
                ticket_id,
                form.get("call_id") or None,
                approved,
                forms.by(request),
                reason,
            )

        return await self.act(request, f"/runs/{run_id}/tickets/{ticket_id}", act)

    async def form(self, request: Request) -> forms.Form:
        """The POST's form, once the request may act: the login, read-write, the same
        origin and the CSRF token; `forms.Refused` otherwise (`forms.Stale` for a token of another
        server process: the form is shown again to be sent once more)."""
        if self.settings.read_only:
            raise forms.Refused(403, "403: this web view is read-only (started with --no-auth)")
        if not login.same_origin(request.headers):
            raise forms.Refused(403, "403: the form was sent from another site")
        body = (await request.body()).decode("utf-8", errors="replace")
        form = forms.Form(parse_qs(body, keep_blank_values=True))
        if not self.tokens.valid(request.scope.get("user_name", ""), form.get("csrf")):
            if request.scope.get("user_name") and form.get("csrf"):
                raise forms.Stale(form)
            raise forms.Refused(403, "403: the form's CSRF token is missing; reload the page")
        return form

    async def act(self, request: Request, back: str, act: Any) -> Response:
        """Do `act` (the CLI's code), then back to `back` with what it said."""
        try:
            said = await run_in_threadpool(act)
        except GraphError as exc:
            said = f"refused: {exc}\n"
        except OSError as exc:
            said = f"failed: {exc}\n"
        return self.redirect_with(request, back, said)

    def redirect_with(self, request: Request, back: str, said: str) -> Response:
        """A redirect to `back` that shows `said` once (made relative to the workspace)."""
        note = secrets.token_urlsafe(8)
        self.notes[note] = self.public(said)
        while len(self.notes) > 100:
            self.notes.pop(next(iter(self.notes)))
        return RedirectResponse(f"{back}?note={note}", status_code=303)

    def public(self, text: str) -> str:
        """`text` with the server's paths made relative to the workspace (`runs/...`)."""
        root = str(self.settings.workspace.root)
        return text.replace(root + "/", "").replace(root, ".")

    # --- helpers -------------------------------------------------------------------------

    def _store(self, run_id: str) -> store.RunStore:
        try:
            return store.find(self.settings.workspace, run_id)
        except UsageError:
            raise forms.NotFound(f"no run {run_id} in this workspace") from None

    def render(
        self, request: Request, name: str, context: dict[str, Any], status: int = 200
    ) -> Response:
        """A page (or, asked by htmx, its live fragment) from template `name`."""
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
        response = self.templates.TemplateResponse(request, name, context, status_code=status)
        response.headers["Vary"] = "HX-Request"  # the page and its live fragment share a URL
        response.headers["Cache-Control"] = "no-store"
        return response

    async def not_found(self, request: Request, exc: Exception) -> Response:
        said = self.public(str(exc))
        if request.method != "GET":
            return PlainTextResponse(f"404: {said}\n", status_code=404)
        context = {"status": 404, "said": said}
        return self.render(request, "error.html", context, 404)

    async def refused(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, forms.Refused)
        return PlainTextResponse(f"{self.public(exc.text)}\n", status_code=exc.status)

    async def stale(self, request: Request, exc: Exception) -> Response:
        """A form whose token this server did not make (it restarted since the page was
        loaded): nothing was done; the same form, with what was typed, to send again."""
        assert isinstance(exc, forms.Stale)
        fields = [(k, v) for k, values in exc.form.fields.items() if k != "csrf" for v in values]
        context = {"action": request.url.path, "fields": fields, "status": 403}
        return self.render(request, "resend.html", context, 403)


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
    meta: dict[str, Any], nodes: dict[str, dict[str, Any]], run: RunRow
) -> list[dict[str, Any]]:
    """The report's steps table: the plan's nodes in order, then any other (the report's).
    A live run's open step shows what it paid so far: the summary's figures (its tickets'
    records and agents, catalog.py) less the closed steps', so the rows add up to it."""
    order = (meta.get("config") or {}).get("nodes") or []
    names = [n for n in order if n in nodes] + sorted(set(nodes) - set(order))
    open_now = [n for n in names if nodes[n].get("status", "running") != "ok"]
    rows = []
    for name in names:
        node = nodes[name]
        status = node.get("status", "running")
        ms = node.get("ms", 0)
        counted: dict[str, Any] = {}
        if status != "ok" and node.get("started"):
            if run.live:
                ms = round((time.time() - node["started"]) * 1000)
                counted = _so_far(run, nodes, name) if open_now == [name] else UNCOUNTED
            else:
                status = "crashed" if meta.get("status") == "crashed" else "stopped"
        rows.append({**node, "name": name, "status": status, "ms": ms, **counted})
    return rows


# Two steps at work at once (a step that crashed open): which paid what is not known yet.
UNCOUNTED = {"calls": None, "tokens": None, "cost_usd": None}


def _so_far(run: RunRow, nodes: dict[str, dict[str, Any]], name: str) -> dict[str, Any]:
    """What the one open step `name` of a live run paid so far: the run's figures less the
    other steps' (each closed step counted what it paid when it ended)."""
    others = [n for key, n in nodes.items() if key != name]
    paid = {"calls": run.calls, "tokens": run.tokens, "cost_usd": run.cost_usd}
    left = {f: total - sum(n.get(f, 0) for n in others) for f, total in paid.items()}
    left["cost_usd"] = round(left["cost_usd"], 8)
    return {f: max(v, 0) for f, v in left.items()}


def _writes(
    workspace: Workspace, run_store: store.RunStore, ticket_id: str
) -> list[tuple[Any, str]]:
    """The ticket's writes in the workspace's ledger, each with what a requeue does with it."""
    held = ledger.of_tickets(workspace, run_store, [ticket_id])[ticket_id]
    return [(w, ledger.fate(w, False)) for w in held]
