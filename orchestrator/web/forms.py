"""What a request to the web view carries and may do: its form (a urlencoded body), why an
action is refused, ids from its URL (through the id rules before any path is built from
them), who acts, and the headers every response gets."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from orchestrator.errors import RunStateError
from orchestrator.run import ids


class NotFound(Exception):
    """A run or ticket that is not there (or an id that is not one)."""


class Headers:
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


class Stale(Exception):
    """A form with a CSRF token another server process made."""

    def __init__(self, form: Form) -> None:
        super().__init__("stale CSRF token")
        self.form = form


class Refused(Exception):
    """An action the request may not take: its status and the sentence that says why."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status, self.text = status, text


class Form:
    """A urlencoded form (every action's body)."""

    def __init__(self, fields: dict[str, list[str]]) -> None:
        self.fields = fields

    def get(self, name: str, default: str = "") -> str:
        values = self.fields.get(name)
        return values[0] if values else default

    def getlist(self, name: str) -> list[str]:
        return self.fields.get(name, [])


def run_id(request: Request) -> str:
    value = request.path_params["run_id"]
    try:
        return ids.run(value)
    except RunStateError:
        raise NotFound(f"{value!r} is not a run id") from None


def ticket_id(request: Request) -> str:
    value = request.path_params["ticket_id"]
    if not ids.is_ticket_id(value):
        raise NotFound(f"{value!r} is not a ticket id")
    return value


def by(request: Request) -> str:
    """Who acts: the login's user name, marked as the web view's."""
    return f"{request.scope.get('user_name', 'unknown')} (web)"
