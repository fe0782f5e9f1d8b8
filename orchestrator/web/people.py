"""The person's half of the web view: the queue of what waits for a person across every run,
and its actions, each calling the CLI's own code (orchestrator/people/, submission/):

    GET  /queue                                   people/queue.py's items, filtered and paged
    POST /queue/decide                            approve or reject several calls, confirmed once
    POST /runs/<run>/tickets/<ticket>/handle      ticketgraph handle (send, edit, close)
    POST /runs/<run>/tickets/<ticket>/audit       ticketgraph audit (good, bad)
    POST /runs/<run>/resume                       ticketgraph resume, as a subprocess

A mistake in a form (a rejection without a reason, an empty edited reply) shows the page
again with what was typed and a sentence saying what to do, never a bare error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from orchestrator.errors import GraphError
from orchestrator.people import queue, stops
from orchestrator.run import ids
from orchestrator.web import forms, paging
from orchestrator.web.resumes import Resumes
from orchestrator.web.waiting import Waiting

if TYPE_CHECKING:
    from orchestrator.web.app import View

ITEMS_PER_PAGE = 100
FILTERS = ("kind", "reason", "category", "run", "age", "order")


class People:
    """The queue page and the person's actions, sharing the view's rendering and forms."""

    def __init__(self, view: View) -> None:
        self.view = view
        settings = view.settings
        self.resumes = Resumes(settings.workspace, settings.broker_url)
        self.waiting = Waiting(settings.workspace)

    # --- the queue ------------------------------------------------------------------------

    async def queue_page(self, request: Request) -> Response:
        return await run_in_threadpool(self.render_queue, request)

    def render_queue(
        self, request: Request, extra: dict[str, Any] | None = None, status: int = 200
    ) -> Response:
        """The queue page (with `extra`: an error and what was typed, shown again)."""
        query = request.query_params
        chosen = {k: query.get(k, "") for k in FILTERS}
        every = self.waiting.items(_run_filter(chosen))
        keep = _shown(chosen)
        shown = [i for i in every if keep.keep(i)]
        if chosen["order"] == "newest":
            shown.reverse()
        page = paging.page(query.get("page"), len(shown), ITEMS_PER_PAGE)
        start = (page.number - 1) * ITEMS_PER_PAGE
        context = {
            "items": shown[start : start + ITEMS_PER_PAGE],
            "counts": queue.counts(every),
            "total": len(every),
            "matching": len(shown),
            "page": page,
            "chosen": chosen,
            "kinds": queue.KINDS,
            "reasons": sorted({i.reason for i in every}),
            "categories": sorted({i.category for i in every if i.category}),
            "runs": sorted({i.run_id for i in every}, reverse=True),
            "link": lambda **changed: paging.link("/queue", chosen, changed),
            "explain": stops.explained,
            "age": queue.age_words,  # as the CLI's queue prints it
            "key": call_key,
            "error": None,
            "typed": {},
            "checked": set(),
        }
        return self.view.render(request, "queue.html", context | (extra or {}), status)

    async def decide_many(self, request: Request) -> Response:
        """Approve or reject the chosen calls: first a page that lists them and asks once,
        then (confirmed) each decided through the CLI's code."""
        form = await self.view.form(request)
        keys = [k for k in form.getlist("call") if k]
        decision = form.get("decision")
        reason = form.get("reason", "")
        problem = _batch_problem(keys, decision, reason)
        if problem is not None:
            extra = {"error": problem, "typed": {"reason": reason}, "checked": set(keys)}
            return await run_in_threadpool(self.render_queue, request, extra, 400)
        calls = [_parsed(k) for k in keys]
        if form.get("confirmed") != "1":
            return await run_in_threadpool(self._confirm, request, keys, decision, reason)

        def act() -> str:
            from orchestrator.submission import decisions

            said = []
            for run_id, ticket_id, call_id in calls:
                try:
                    said.append(
                        decisions.decide(
                            self.view.settings.workspace,
                            run_id,
                            ticket_id,
                            call_id,
                            decision == "approve",
                            forms.by(request),
                            reason,
                        )
                    )
                except GraphError as exc:
                    said.append(f"refused: {run_id} {ticket_id} {call_id}: {exc}\n")
            return "".join(said)

        return await self.view.act(request, "/queue", act)

    def _confirm(self, request: Request, keys: list[str], decision: str, reason: str) -> Response:
        wanted = set(keys)
        cards = [i for i in self.waiting.items() if i.kind == "call" and call_key(i) in wanted]
        context = {
            "cards": cards,
            "keys": keys,
            "decision": decision,
            "reason": reason,
            "age": queue.age_words,  # as the CLI's queue prints it
            "missing": len(wanted) - len(cards),
        }
        return self.view.render(request, "confirm_decide.html", context)

    # --- a ticket -------------------------------------------------------------------------

    async def handle(self, request: Request) -> Response:
        """Send the run's reply, send an edited one, or close the ticket without one."""
        run_id, ticket_id = _ids(request)
        form = await self.view.form(request)
        action = form.get("action")
        if action not in ("send", "edit", "close"):
            return await self._again(request, form, "choose send, send edited or close")
        if action == "edit" and not form.get("reply").strip():
            said = "the edited reply is empty: write it in the box, or close without a reply"
            return await self._again(request, form, said)

        def act() -> str:
            from orchestrator.people import handling

            done = handling.handle(
                self.view.settings.workspace,
                run_id,
                ticket_id,
                action,  # type: ignore[arg-type]
                forms.by(request),
                form.get("reason") or None,
                form.get("reply") if action == "edit" else None,
            )
            made = done.made
            wrote = f", {made.out_file} written" if made.out_file else ", nothing sent"
            return f"{made.verdict}: {run_id} {ticket_id} by {made.by}{wrote}; label kept\n"

        return await self._ticket_act(request, form, act)

    async def audit(self, request: Request) -> Response:
        """Mark a pass good, or bad with a reason."""
        run_id, ticket_id = _ids(request)
        form = await self.view.form(request)
        verdict = form.get("verdict")
        if verdict not in ("good", "bad"):
            return await self._again(request, form, "choose good or bad")
        if verdict == "bad" and not form.get("reason").strip():
            said = "say why the reply is bad in the reason box (the label keeps it), then bad"
            return await self._again(request, form, said)

        def act() -> str:
            from orchestrator.people import audit

            made = audit.audit(
                self.view.settings.workspace,
                run_id,
                ticket_id,
                verdict == "good",
                forms.by(request),
                form.get("reason") or None,
            )
            return f"{made.verdict}: {run_id} {ticket_id} by {made.by}; label kept\n"

        return await self._ticket_act(request, form, act)

    async def _ticket_act(self, request: Request, form: forms.Form, act: Any) -> Response:
        """Do `act`; back to the queue with what it said, or (a mistake in the form) the
        ticket's page again with what was typed and what to do."""
        from orchestrator.errors import UsageError

        try:
            said = await run_in_threadpool(act)
        except UsageError as exc:
            return await self._again(request, form, str(exc))
        return self.view.redirect_with(request, "/queue", said)

    async def _again(self, request: Request, form: forms.Form, error: str) -> Response:
        typed = {name: form.get(name) for name in ("reason", "reply", "action", "verdict")}
        extra = {"error": self.view.public(error), "typed": typed}
        return await run_in_threadpool(self.view.ticket_page_of, request, extra, 400)

    # --- a run ----------------------------------------------------------------------------

    async def resume(self, request: Request) -> Response:
        """Start `ticketgraph resume` for the run (`--retry-failed all` when asked)."""
        run_id = forms.run_id(request)
        form = await self.view.form(request)
        retry = form.get("retry", "retryable")
        if retry not in ("retryable", "all", "none"):
            retry = "retryable"

        def act() -> str:
            try:
                started = self.resumes.start(run_id, retry, forms.by(request))  # type: ignore[arg-type]
            except RuntimeError as exc:
                return f"not started: {exc}\n"
            return started.said + "\n"

        return await self.view.act(request, f"/runs/{run_id}", act)


def call_key(item: queue.Item) -> str:
    """A call's key in forms: RUN/TICKET/CALL (a call id may hold a slash; ids do not)."""
    return f"{item.run_id}/{item.ticket}/{item.call_id}"


def _parsed(key: str) -> tuple[str, str, str]:
    run_id, ticket_id, call_id = key.split("/", 2)
    return run_id, ticket_id, call_id


def _batch_problem(keys: list[str], decision: str, reason: str) -> str | None:
    """What is wrong with a batch decision's form, in a sentence saying what to do."""
    if decision not in ("approve", "reject"):
        return "choose approve or reject"
    if not keys:
        return "tick the calls to decide first (the boxes in the first column)"
    for key in keys:
        parts = key.split("/", 2)
        if len(parts) != 3 or not ids.is_ticket_id(parts[1]) or not ids.is_run_id(parts[0]):
            return f"{key!r} is not a call of this workspace: reload the queue and tick again"
    if decision == "reject" and not reason.strip():
        return "a rejection needs a reason (the model reads it): write one and reject again"
    return None


def _run_filter(chosen: dict[str, str]) -> str | None:
    """The one filter applied while reading: the run (it narrows the scan; only a run id
    that passes the id rules becomes a path). The rest are `_shown`'s, so the counts are
    the whole queue's."""
    return chosen["run"] if ids.is_run_id(chosen["run"]) else None


def _shown(chosen: dict[str, str]) -> queue.Filters:
    """The filters a person chose (an age in hours; one that is not a number is ignored)."""
    try:
        older = float(chosen["age"]) * 3600 if chosen["age"] else None
    except ValueError:
        older = None
    return queue.Filters(
        kind=chosen["kind"] or None,
        reason=chosen["reason"] or None,
        category=chosen["category"] or None,
        run_id=chosen["run"] or None,
        older_than_s=older,
    )


def _ids(request: Request) -> tuple[str, str]:
    return forms.run_id(request), forms.ticket_id(request)
