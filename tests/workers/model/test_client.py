"""The model client over real HTTP: transient faults retried, permanent ones explained, and
the reply shapes real OpenAI-compatible servers send, recorded here as fixtures."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpcore
import httpx
import pytest
import trustme
import yaml
from pydantic import ValidationError

from orchestrator.broker.redis_server import free_port
from workers.cancel import CancelToken
from workers.errors import Cancelled, ProviderError
from workers.model import pool_guard
from workers.model.client import KEEPALIVE_S, ModelClient, RequestParams, under
from workers.provider import running_provider
from workers.settings import HarnessSettings
from workers.state import Message

HELLO = [Message(role="user", content="hello")]


def _scripted(tmp: Path, faults: list[dict[str, Any]], latency_ms: float = 0) -> Path:
    script = {
        "name": "one",
        "latency_ms": latency_ms,
        "faults": faults,
        "replies": [{"text": "hi", "usage": {"prompt_tokens": 3, "completion_tokens": 1}}],
    }
    path = tmp / "s.yaml"
    path.write_text(yaml.safe_dump([script]))
    return path


def _client(url: str, **settings: Any) -> ModelClient:
    return ModelClient(HarnessSettings(base_url=url, **settings))


def _requests(url: str) -> int:
    return int(httpx.get(url.replace("/v1", "/stats")).json()["requests"])


def test_the_client_never_loads_httpxs_command_line_client(tmp_path: Path) -> None:
    """httpx imports its CLI (rich, pygments: ~50 ms) whenever they are installed; a fresh
    interpreter that loads the harness and sends a request through it must not."""
    with running_provider(_scripted(tmp_path, [])) as url:
        code = (
            "import sys\n"
            "from workers.model.client import ModelClient\n"
            "from workers.settings import HarnessSettings\n"
            "from workers.state import Message\n"
            f"client = ModelClient(HarnessSettings(base_url={url!r}))\n"
            "reply = client.complete('m', [Message(role='user', content='hello')], [])\n"
            "loaded = [m for m in ('rich', 'pygments', 'httpx._main') if sys.modules.get(m)]\n"
            "print(reply.message.content, loaded)\n"
        )
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["hi", "[]"]


@pytest.mark.parametrize("status", [408, 409, 429, 500, 502, 503, 504])
def test_transient_statuses_are_retried(tmp_path: Path, status: int) -> None:
    with running_provider(_scripted(tmp_path, [{"status": status, "times": 2}])) as url:
        reply = _client(url).complete("m", HELLO, [])
        assert reply.message.content == "hi"
        assert _requests(url) == 3  # two failures, then the answer


def test_retries_are_bounded_by_count_and_say_what_failed(tmp_path: Path) -> None:
    with running_provider(_scripted(tmp_path, [{"status": 500}])) as url:
        with pytest.raises(ProviderError, match="answered HTTP 500") as caught:
            _client(url, max_retries=1).complete("m", HELLO, [])
        assert _requests(url) == 2
        assert caught.value.retryable and url in str(caught.value)


def test_retry_after_is_honoured(tmp_path: Path) -> None:
    with running_provider(
        _scripted(tmp_path, [{"status": 429, "retry_after": 1, "times": 1}])
    ) as url:
        started = time.monotonic()
        _client(url).complete("m", HELLO, [])
        assert time.monotonic() - started >= 1.0  # a lower bound: the wait asked for


@pytest.mark.parametrize(
    ("status", "hint"),
    [(401, "LLM_API_KEY"), (403, "LLM_API_KEY"), (404, "LLM_BASE_URL"), (400, "HTTP 400")],
)
def test_permanent_statuses_fail_at_once_and_say_what_to_check(
    tmp_path: Path, status: int, hint: str
) -> None:
    with running_provider(_scripted(tmp_path, [{"status": status}])) as url:
        with pytest.raises(ProviderError, match=hint) as caught:
            _client(url).complete("m", HELLO, [])
        assert _requests(url) == 1
        assert not caught.value.retryable


def test_a_refused_connection_names_the_url_and_is_retried() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(ProviderError, match=r"cannot reach .*LLM_BASE_URL") as caught:
        _client(url, max_retries=1).complete("m", HELLO, [])
    assert url in str(caught.value) and caught.value.retryable


def test_a_fragment_in_the_base_url_is_left_out_of_the_url_errors_name() -> None:
    """A fragment is never sent; the endpoint an error names is the URL requests go to, not
    `.../v1#part/chat/completions`."""
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(ProviderError, match=r"cannot reach") as caught:
        _client(f"{url}#part", max_retries=0).complete("m", HELLO, [])
    assert f"{url}/chat/completions:" in str(caught.value) and "#" not in str(caught.value)


def test_a_read_timeout_names_the_setting(tmp_path: Path) -> None:
    with (
        running_provider(_scripted(tmp_path, [], latency_ms=3000)) as url,
        pytest.raises(ProviderError, match="LLM_READ_TIMEOUT_S"),
    ):
        _client(url, read_timeout_s=0.3, max_retries=1).complete("m", HELLO, [])


def test_credentials_never_appear_in_messages() -> None:
    url = f"http://user:s3cret@127.0.0.1:{free_port()}/v1"
    with pytest.raises(ProviderError) as caught:
        _client(url, max_retries=0).complete("m", HELLO, [])
    assert "s3cret" not in str(caught.value)


def test_a_cancel_stops_a_retry_wait_at_once(tmp_path: Path) -> None:
    with running_provider(_scripted(tmp_path, [{"status": 429, "retry_after": 30}])) as url:
        cancel = CancelToken()
        cancel.cancel_after(0.3, "stop")
        started = time.monotonic()
        with pytest.raises(Cancelled):
            _client(url).complete("m", HELLO, [], cancel=cancel)
        assert time.monotonic() - started < 10  # not the 30 s the server asked for


def _stats(url: str) -> dict[str, Any]:
    return httpx.get(url.replace("/v1", "/stats")).json()  # type: ignore[no-any-return]


def test_a_cancel_cuts_the_request_and_the_server_sees_it_go(tmp_path: Path) -> None:
    # A 30 s reply: the cancel at 0.3 s must end the wait at once AND cut the connection,
    # so the server counts the request abandoned (it no longer works for nobody).
    with running_provider(_scripted(tmp_path, [], latency_ms=30_000)) as url:
        client = _client(url)
        cancel = CancelToken()
        cancel.cancel_after(0.3, "stop")
        started = time.time()
        with pytest.raises(Cancelled, match="stop"):
            client.complete("m", HELLO, [], cancel=cancel)
        assert time.time() - started < 5
        deadline = time.monotonic() + 5
        while _stats(url)["abandoned"] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        stats = _stats(url)
        assert stats["abandoned"] == 1 and stats["in_flight"] == 0
        assert stats["last_abandoned_at"] - started < 5  # seconds after the cancel, not 30


def test_a_request_that_ended_is_not_cut_by_a_late_cancel(tmp_path: Path) -> None:
    with running_provider(_scripted(tmp_path, [])) as url:
        client = _client(url)
        cancel = CancelToken()
        assert client.complete("m", HELLO, [], cancel=cancel).message.content == "hi"
        cancel.cancel("late")  # the pooled connection it used stays usable
        assert client.complete("m", HELLO, []).message.content == "hi"
        assert _stats(url)["abandoned"] == 0


# --- reply shapes of real servers ------------------------------------------------------------


class _Canned:
    """A real HTTP server answering each POST with the next canned (status, body)."""

    def __init__(self, bodies: list[Any]) -> None:
        self.bodies = list(bodies)
        self.paths: list[str] = []  # what each POST asked for
        canned = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                canned.paths.append(self.path)
                length = int(self.headers.get("content-length") or 0)
                self.rfile.read(length)
                body = canned.bodies.pop(0)
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> _Canned:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def canned() -> Iterator[type[_Canned]]:
    yield _Canned


# What llama.cpp's server sends for a tool call: content null, arguments as a string.
LLAMA_CPP_TOOL_CALL = {
    "choices": [
        {
            "finish_reason": "tool_calls",
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "type": "function",
                        "id": "abc",
                        "function": {"name": "read_file", "arguments": '{"path":"kb/a.md"}'},
                    }
                ],
            },
        }
    ],
    "usage": {"prompt_tokens": 50, "completion_tokens": 9, "total_tokens": 59},
}
# Ollama-style: arguments as an object, no `type`, finish_reason "stop" with calls present.
OBJECT_ARGUMENTS = {
    "choices": [
        {
            "finish_reason": "stop",
            "message": {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "c1", "function": {"name": "read_file", "arguments": {"path": "x"}}}
                ],
            },
        }
    ],
    "usage": {"prompt_tokens": 10, "completion_tokens": 4},
}
NO_USAGE = {
    "choices": [{"finish_reason": "stop", "message": {"role": "assistant", "content": "hi there"}}]
}
EMPTY_CHOICES = {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 0}}


def test_llama_cpp_tool_call_shape(canned: type[_Canned]) -> None:
    with canned([LLAMA_CPP_TOOL_CALL]) as server:
        reply = _client(server.url).complete("m", HELLO, [])
    (call,) = reply.message.tool_calls or []
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "read_file",
        {"path": "kb/a.md"},
    )
    assert reply.usage.prompt_tokens == 50 and not reply.usage.estimated


def test_arguments_as_an_object_and_no_type(canned: type[_Canned]) -> None:
    with canned([OBJECT_ARGUMENTS]) as server:
        reply = _client(server.url).complete("m", HELLO, [])
    (call,) = reply.message.tool_calls or []
    assert json.loads(call.function.arguments) == {"path": "x"} and call.type == "function"


def test_a_reply_without_usage_is_counted_and_marked_estimated(canned: type[_Canned]) -> None:
    with canned([NO_USAGE]) as server:
        reply = _client(server.url).complete("m", HELLO, [])
    assert reply.usage.estimated
    assert reply.usage.prompt_tokens > 0 and reply.usage.completion_tokens > 0


def test_empty_choices_is_a_clear_provider_error(canned: type[_Canned]) -> None:
    with canned([EMPTY_CHOICES]) as server, pytest.raises(ProviderError, match="no choices"):
        _client(server.url, max_retries=0).complete("m", HELLO, [])


def test_a_body_that_is_not_json_is_retried_then_explained(canned: type[_Canned]) -> None:
    with canned([b"<html>bad gateway</html>", NO_USAGE]) as server:
        reply = _client(server.url).complete("m", HELLO, [])
    assert reply.message.content == "hi there"


def test_request_settings_are_sent_as_the_server_family_expects(tmp_path: Path) -> None:
    with running_provider(_scripted(tmp_path, [])) as url:
        client = _client(url)
        client.complete("m", HELLO, [], params=RequestParams(max_tokens=64, temperature=0.0))
        newer = RequestParams(max_tokens=64, token_param="max_completion_tokens")
        client.complete("m", HELLO, [], params=newer)
        client.complete("m", HELLO, [])
        params = httpx.get(url.replace("/v1", "/stats")).json()["params"]
    assert params == {
        "one: max_tokens=64 temperature=0.0": 1,
        "one: max_completion_tokens=64": 1,
        "one: none": 1,
    }


def test_the_anthropic_api_retries_and_explains_as_the_openai_one(tmp_path: Path) -> None:
    faults = [{"status": 529, "times": 1}, {"status": 401}]
    with running_provider(_scripted(tmp_path, faults[:1])) as url:
        reply = _client(url, api="anthropic").complete("m", HELLO, [])
        assert reply.message.content == "hi" and reply.usage.prompt_tokens == 3
        assert _requests(url) == 2  # a 529 (overloaded), then the answer
    with (
        running_provider(_scripted(tmp_path, faults[1:])) as url,
        pytest.raises(ProviderError, match="LLM_API_KEY"),
    ):
        _client(url, api="anthropic").complete("m", HELLO, [])


def test_a_proxy_html_error_page_is_retried_and_shown_on_one_line(tmp_path: Path) -> None:
    with running_provider(_scripted(tmp_path, [{"status": 502, "html": True}])) as url:
        with pytest.raises(ProviderError, match=r"HTTP 502: <html>.*502 Bad Gateway") as caught:
            _client(url, max_retries=1).complete("m", HELLO, [])
        assert _requests(url) == 2 and "\n" not in str(caught.value)


def test_a_connection_reset_mid_body_is_retried(tmp_path: Path) -> None:
    with running_provider(_scripted(tmp_path, [{"reset": True, "times": 1}])) as url:
        reply = _client(url).complete("m", HELLO, [])
        assert reply.message.content == "hi" and _requests(url) == 2


FIXTURES = json.loads((Path(__file__).parent / "fixtures" / "replies.json").read_text())
TOOL_CALL_SHAPES = [k for k in FIXTURES if k.endswith(("tool_call", "arguments"))]


@pytest.mark.parametrize("shape", TOOL_CALL_SHAPES)
def test_every_server_familys_tool_call_reads_the_same(canned: type[_Canned], shape: str) -> None:
    with canned([FIXTURES[shape]]) as server:
        reply = _client(server.url).complete("m", HELLO, [])
    (call,) = reply.message.tool_calls or []
    assert call.function.name == "lookup_order" and call.id
    assert json.loads(call.function.arguments) == {"order_id": "A-77301"}
    assert reply.usage.prompt_tokens > 0 and not reply.usage.estimated


def test_a_local_server_without_usage_is_estimated(canned: type[_Canned]) -> None:
    with canned([FIXTURES["no_usage_answer"]]) as server:
        reply = _client(server.url).complete("m", HELLO, [])
    assert reply.message.content == "Ticket T-1001: refunded." and reply.usage.estimated


def _local_port(client: ModelClient) -> int:
    """The local port of the calling thread's connection to the endpoint (open)."""
    conn = client._connection()._conn
    assert conn is not None and conn.sock is not None
    return int(conn.sock.getsockname()[1])


def test_each_thread_sends_on_a_connection_of_its_own(tmp_path: Path) -> None:
    """A worker's threads share no pool (every request and reply walked a shared one under
    one lock, a fifth of a worker's CPU at 256 threads): each thread's requests go over its
    own connection, kept alive for its next request; closing the client closes them all."""
    with running_provider(_scripted(tmp_path, [], latency_ms=50)) as url:
        client = _client(url)
        assert client._native  # a plain endpoint: the standard library's http.client
        ports: dict[str, set[int]] = {}

        def ask(name: str) -> None:
            for _ in range(3):
                assert client.complete("m", HELLO, []).message.content
                ports.setdefault(name, set()).add(_local_port(client))

        threads = [threading.Thread(target=ask, args=(name,)) for name in "abc"]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert all(len(used) == 1 for used in ports.values())  # kept alive: one each
        assert len(set.union(*ports.values())) == 3  # and not shared
        assert _requests(url) == 9
        connections = list(client._per_thread)
        client.close()
        assert len(connections) == 3 and all(c._conn is None for c in connections)


def test_an_idle_connection_is_dropped_before_the_server_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Idle past the client's keep-alive, a connection is not reused: the next request
    opens a new one (servers close idle ones, and a request sent on a closing connection
    fails without an answer)."""
    monkeypatch.setattr("workers.model.client.KEEPALIVE_S", 0.3)
    with running_provider(_scripted(tmp_path, [])) as url:
        client = _client(url, max_retries=0)
        client.complete("m", HELLO, [])
        first = _local_port(client)
        client.complete("m", HELLO, [])
        assert _local_port(client) == first  # within the keep-alive: reused
        time.sleep(0.5)
        client.complete("m", HELLO, [])
        assert _local_port(client) != first


def test_a_forked_process_connects_on_its_own(tmp_path: Path) -> None:
    """A process forked after a request (a worker forked from the command that routed)
    does not send on the socket it inherited, which is its parent's: it connects anew, and
    the parent's connection stays as it was."""
    with running_provider(_scripted(tmp_path, [])) as url:
        client = _client(url, max_retries=0)
        client.complete("m", HELLO, [])
        parent = _local_port(client)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: one request, then its connection's port to the parent
            code = 1
            try:
                client.complete("m", HELLO, [])
                os.write(write, str(_local_port(client)).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        _, status = os.waitpid(pid, 0)
        child = int(os.read(read, 32) or 0)
        os.close(read)
        assert os.waitstatus_to_exitcode(status) == 0 and child not in (0, parent)
        client.complete("m", HELLO, [])
        assert _local_port(client) == parent


class _RawServer:
    """One connection at a time on a real socket: `answer(conn, head)` is given what came
    up to the end of the request's headers (and any of its body with them), writes what it
    likes, and the connection is closed when it returns."""

    def __init__(self, answer: Any) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        self.answer = answer
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.sock.accept()
                with conn:
                    head = b""
                    while b"\r\n\r\n" not in head:
                        head += conn.recv(65536)
                    self.answer(conn, head)

    def close(self) -> None:
        self.sock.close()


def test_a_connection_the_server_closed_is_not_reused() -> None:
    """The server closed the idle connection: the next request sees it (the socket reads
    ready with no request out) and connects again, with no retry spent (none allowed)."""

    def once_then_close(conn: socket.socket, head: bytes) -> None:
        # One request a connection, then closed without saying so (no `Connection: close`),
        # as a server whose idle timeout is shorter than ours does.
        _read_body_and_answer(conn, head, closing=False)

    server = _RawServer(once_then_close)
    try:
        client = _client(server.url, max_retries=0)
        for _ in range(3):
            assert client.complete("m", HELLO, []).message.content == "hi there"
            time.sleep(0.1)  # the server's close arrives
    finally:
        server.close()


def _read_body_and_answer(conn: socket.socket, head: bytes, closing: bool) -> None:
    """Read the rest of the request's body (its content-length says how much), then answer
    200 with `NO_USAGE`, saying `Connection: close` if `closing`."""
    headers, _, body = head.partition(b"\r\n\r\n")
    found = re.search(rb"(?i)content-length: *(\d+)", headers)
    assert found is not None
    while len(body) < int(found.group(1)):
        body += conn.recv(65536)
    data = json.dumps(NO_USAGE).encode()
    conn.sendall(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
        + (b"connection: close\r\n" if closing else b"")
        + f"content-length: {len(data)}\r\n\r\n".encode()
        + data
    )


def _answer_and_keep(seen: list[bytes]) -> Any:
    """A `_RawServer` answer that keeps each request's head and replies 200 (`NO_USAGE`)."""

    def answer(conn: socket.socket, head: bytes) -> None:
        seen.append(head)
        _read_body_and_answer(conn, head, closing=True)

    return answer


@pytest.mark.parametrize("slash", ["", "/"])
@pytest.mark.parametrize("credentials", ["", "user:secret@"], ids=["http.client", "httpx"])
def test_a_base_url_with_a_query_keeps_its_path_and_query(slash: str, credentials: str) -> None:
    """Azure OpenAI's base URL ends in a query (`.../deployments/D?api-version=V`): the
    request goes to `.../deployments/D/chat/completions?api-version=V`, on either path
    (credentials in the URL send it through httpx)."""
    seen: list[bytes] = []
    server = _RawServer(_answer_and_keep(seen))
    try:
        base = server.url.replace("//", f"//{credentials}", 1)
        base = base.replace("/v1", "/openai/deployments/d")
        client = _client(f"{base}{slash}?api-version=2024-06-01", max_retries=0)
        assert client.complete("m", HELLO, []).message.content == "hi there"
    finally:
        server.close()
    line = seen[0].split(b"\r\n", 1)[0]
    assert line == b"POST /openai/deployments/d/chat/completions?api-version=2024-06-01 HTTP/1.1"
    assert client.endpoint.endswith("/openai/deployments/d/chat/completions")
    assert "secret" not in client.endpoint


@pytest.mark.parametrize("api_key", [None, "sk-test"], ids=["no key", "with a key"])
def test_credentials_in_the_base_url_are_sent_as_httpxs_client_sends_them(
    api_key: str | None,
) -> None:
    """`https://user:pass@host/v1` (a gateway behind Basic auth): the request carries the
    Authorization header httpx's own client sends for that URL, byte for byte, and the
    password is never in a message."""
    seen: list[bytes] = []
    server = _RawServer(_answer_and_keep(seen))
    try:
        base = server.url.replace("//", "//team:s3cr%40t@", 1)  # the password is s3cr@t
        client = _client(base, max_retries=0, api_key=api_key)
        assert client.complete("m", HELLO, []).message.content == "hi there"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        with httpx.Client(headers=headers) as reference:
            reference.post(f"{base}/chat/completions", json={})
    finally:
        server.close()
    sent = [_header(head, b"authorization") for head in seen]
    assert sent[0] == sent[1] == b"Basic " + base64.b64encode(b"team:s3cr@t")
    assert "s3cr" not in client.endpoint
    # An empty userinfo (`//:@host`) is no credentials, to httpx and to this client.
    empty = _client(server.url.replace("//", "//:@", 1), api_key=api_key)
    assert empty._headers.get("authorization") == (f"Bearer {api_key}" if api_key else None)


def _header(head: bytes, name: bytes) -> bytes | None:
    """The value of header `name` in a request's head (None if absent)."""
    for line in head.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return value.strip()
    return None


def test_an_https_endpoint_is_verified(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, canned: type[_Canned]
) -> None:
    """Over TLS the client checks the server's certificate: one signed by a CA it trusts
    (here SSL_CERT_FILE, as httpx reads it) answers; one it does not trust fails at once,
    saying so, and nothing is sent."""
    ca = trustme.CA()
    with canned([NO_USAGE, NO_USAGE]) as server:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert("127.0.0.1").configure_cert(context)
        server.server.socket = context.wrap_socket(server.server.socket, server_side=True)
        url = server.url.replace("http://", "https://")
        untrusting = _client(url, max_retries=0)
        with pytest.raises(ProviderError, match="CERTIFICATE_VERIFY_FAILED"):
            untrusting.complete("m", HELLO, [])
        ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
        monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "ca.pem"))
        other = canned([])  # trusted, but its certificate names another host
        other_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert("other.test").configure_cert(other_context)
        other.server.socket = other_context.wrap_socket(other.server.socket, server_side=True)
        with other, pytest.raises(ProviderError, match="CERTIFICATE_VERIFY_FAILED"):
            _client(other.url.replace("http://", "https://"), max_retries=0).complete(
                "m", HELLO, []
            )
        client = _client(url, max_retries=0)
        assert client._native
        assert client.complete("m", HELLO, []).message.content == "hi there"
        assert len(server.bodies) == 1  # the untrusted attempt sent nothing


def test_a_cancel_cuts_a_reply_that_will_close_its_connection() -> None:
    """A reply that says `Connection: close` (or an HTTP/1.0 one) is read from a socket
    the connection has already let go of: a cancel after its headers still cuts it."""

    def slow_body(conn: socket.socket, _head: bytes) -> None:
        body = json.dumps(NO_USAGE).encode()
        conn.sendall(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
            + f"content-length: {len(body)}\r\n\r\n".encode()
        )
        time.sleep(6)
        with contextlib.suppress(OSError):
            conn.sendall(body)

    server = _RawServer(slow_body)
    try:
        cancel = CancelToken()
        cancel.cancel_after(0.3, "stop")
        started = time.monotonic()
        with pytest.raises(Cancelled):
            _client(server.url).complete("m", HELLO, [], cancel=cancel)
        assert time.monotonic() - started < 3  # not the 6 s the body took
    finally:
        server.close()


def test_an_answer_sent_before_the_body_was_read_is_the_error() -> None:
    """A server that answers a large request before reading it all (413, or 401 from a
    gateway) and closes: its answer is the error, not a broken pipe to retry."""

    def too_large(conn: socket.socket, _head: bytes) -> None:
        body = b'{"error": {"message": "request too large"}}'
        conn.sendall(
            b"HTTP/1.1 413 Payload Too Large\r\ncontent-type: application/json\r\n"
            + f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
            + body
        )
        conn.shutdown(socket.SHUT_WR)
        time.sleep(0.2)

    server = _RawServer(too_large)
    try:
        big = [Message(role="user", content="x" * 8_000_000)]
        with pytest.raises(ProviderError, match="HTTP 413: request too large") as caught:
            _client(server.url).complete("m", big, [])
        assert not caught.value.retryable
    finally:
        server.close()


def test_a_key_with_a_line_break_is_refused_without_showing_it() -> None:
    # Refused with the settings now (the run's command says so before claiming anything).
    with pytest.raises(ValidationError, match="api_key") as caught:
        _client(f"http://127.0.0.1:{free_port()}/v1", api_key="sk-secret\n")
    assert "sk-secret" not in str(caught.value)


def test_a_proxy_from_the_environment_is_used(
    monkeypatch: pytest.MonkeyPatch, canned: type[_Canned]
) -> None:
    """With HTTP_PROXY set, requests go through the proxy as httpx sends them (the
    endpoint's name is resolved by the proxy, never here)."""
    with canned([NO_USAGE]) as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url.removesuffix("/v1"))
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        client = _client("http://model.invalid/v1", max_retries=0)
        assert not client._native
        assert client.complete("m", HELLO, []).message.content == "hi there"
        assert proxy.paths == ["http://model.invalid/v1/chat/completions"]


def test_the_pool_never_closes_a_connection_it_gave_a_request(tmp_path: Path) -> None:
    """encode/httpcore#1110: the pool gives an idle connection to a waiting request, and
    before that request's thread starts on it, another thread's pass over the pool finds
    it idle with its keep-alive expired and closes it (under the request, once started).
    Here the pass runs at that moment on a pool two threads share (a client passed in,
    guarded): the given connection must stay open and pooled; an expired one no request
    holds is still closed."""
    from httpcore._sync.connection_pool import PoolRequest

    with running_provider(_scripted(tmp_path, [], latency_ms=300)) as url:
        limits = httpx.Limits(
            max_connections=None, max_keepalive_connections=None, keepalive_expiry=KEEPALIVE_S
        )
        shared = httpx.Client(base_url=url + "/", limits=limits)
        assert pool_guard.guard(shared)
        client = ModelClient(HarnessSettings(base_url=url), http=shared)
        asking = [threading.Thread(target=client.complete, args=("m", HELLO, [])) for _ in "ab"]
        for thread in asking:  # two at once (300 ms each): two connections, idle once answered
            thread.start()
        for thread in asking:
            thread.join(10)
        pool = shared._transport._pool  # type: ignore[attr-defined]
        given, spare = pool.connections[:2]
        time.sleep(KEEPALIVE_S + 0.2)  # both idle past their keep-alive
        waiting = PoolRequest(httpcore.Request("POST", f"{url}/chat/completions"))
        waiting.assign_to_connection(given)  # the pool gave it; its thread has not run yet
        pool._requests.append(waiting)
        closing = pool._assign_requests_to_connections()  # another thread's pass
        pool._requests.remove(waiting)
        assert given not in closing and given in pool.connections and not given.is_closed()
        assert spare in closing  # expired and held by nobody: closed as httpcore does


@pytest.mark.parametrize(
    ("base", "url"),
    [
        ("https://h/v1/", "https://h/v1/chat/completions"),
        ("https://h/d?api-version=V", "https://h/d/chat/completions?api-version=V"),
        ("https://h/a%3Fb/v1", "https://h/a%3Fb/v1/chat/completions"),
        ("https://h/a%2Fb/v1", "https://h/a%2Fb/v1/chat/completions"),
        ("https://h/a%2541/v1", "https://h/a%2541/v1/chat/completions"),
    ],
)
def test_under_keeps_the_base_path_as_it_is_encoded(base: str, url: str) -> None:
    assert str(under(httpx.URL(base), "chat/completions")) == url
