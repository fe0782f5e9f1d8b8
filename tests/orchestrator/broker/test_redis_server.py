"""The embedded redis-server: a port taken between its choice and the bind."""

from __future__ import annotations

import socket

from orchestrator.broker.redis_server import RedisServer


def test_a_port_taken_before_the_server_binds_it_moves_the_server_to_another() -> None:
    """Another process binds the free port chosen for the server before the server starts
    (two test suites at once did): the server exits at once, and its first start goes to
    another free port instead of failing."""
    server = RedisServer(tcp=True)
    taken = server.port
    assert taken is not None
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", taken))  # bound, not listening: the server's bind fails
        try:
            url = server.start()
            assert server.port != taken and url.endswith(f":{server.port}/0")
            assert server.client().ping()
        finally:
            server.stop(kill=True)
