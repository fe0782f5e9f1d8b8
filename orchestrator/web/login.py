"""Who may use the web view: one login from the environment, asked for with HTTP basic auth on
every path, and a CSRF token on every form.

The login is TICKETGRAPH_WEB_USER and TICKETGRAPH_WEB_PASSWORD (as `ticketgraph flower` takes
FLOWER_USER and FLOWER_PASSWORD). A browser sends basic-auth credentials by itself with every
request to the site, a request another site's page makes included; so each action is a POST
that must carry a token only a page of this server can have: an HMAC of the user name under a
key made when the server starts (a restart voids the open pages' tokens), and the request's
Origin, when the browser sends one, must be this server.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from dataclasses import dataclass, field

from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from orchestrator.errors import ConfigError

USER, PASSWORD = "TICKETGRAPH_WEB_USER", "TICKETGRAPH_WEB_PASSWORD"
REALM = "ticketgraph"


@dataclass(frozen=True)
class Login:
    """The one user name and password the server accepts."""

    user: str
    password: str = field(repr=False)

    def accepts(self, header: str | None) -> str | None:
        """The user name if `header` (an Authorization header) carries this login."""
        if not header or not header.lower().startswith("basic "):
            return None
        try:
            decoded = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        user, _, password = decoded.partition(":")
        same_user = hmac.compare_digest(user.encode(), self.user.encode())
        same_password = hmac.compare_digest(password.encode(), self.password.encode())
        return self.user if same_user and same_password else None


def required(user: str | None, password: str | None) -> Login:
    """The login TICKETGRAPH_WEB_USER / TICKETGRAPH_WEB_PASSWORD set; `ConfigError` (never
    quoting the password) if it is missing or malformed."""
    user, password = user or "", password or ""
    if not (user or password):
        raise ConfigError(
            f"the web view needs a login: set {USER} and {PASSWORD}, or pass --no-auth to "
            "serve it read-only without one"
        )
    if not (user and password):
        unset = PASSWORD if user else USER
        raise ConfigError(f"{unset} is not set ({USER} and {PASSWORD} go together)")
    if ":" in user:
        raise ConfigError(f"{USER}={user!r} holds a ':', which basic auth cannot carry")
    return Login(user, password)


class BasicAuth:
    """ASGI middleware: 401 with a basic-auth challenge unless the request carries the login;
    the user name goes to `scope["user_name"]`."""

    def __init__(self, app: ASGIApp, login: Login) -> None:
        self.app, self.login = app, login

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        user = self.login.accepts(Headers(scope=scope).get("authorization"))
        if user is None:
            response = PlainTextResponse(
                "401: this ticketgraph web view asks for its login\n",
                status_code=401,
                headers={"WWW-Authenticate": f'Basic realm="{REALM}", charset="UTF-8"'},
            )
            await response(scope, receive, send)
            return
        scope["user_name"] = user
        await self.app(scope, receive, send)


class Tokens:
    """CSRF tokens: an HMAC of the user name under a key of this server process."""

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key or secrets.token_bytes(32)

    def token(self, user: str) -> str:
        """The token forms of `user` carry."""
        return hmac.new(self._key, f"csrf:{user}".encode(), hashlib.sha256).hexdigest()

    def valid(self, user: str, token: str | None) -> bool:
        """Whether `token` is `user`'s."""
        return bool(token) and hmac.compare_digest(self.token(user), str(token))


def same_origin(headers: Headers) -> bool:
    """False if the browser says the request comes from a page of another site (the Origin
    header, or failing it Sec-Fetch-Site); True when it says nothing (not a browser)."""
    origin = headers.get("origin")
    if origin is not None:
        host = headers.get("host", "")
        return origin in (f"http://{host}", f"https://{host}")
    return headers.get("sec-fetch-site", "same-origin") in ("same-origin", "none")
