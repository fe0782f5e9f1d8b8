"""Worker processes × threads: the layout both `ticketgraph worker` and embedded runs use.

A ticket's step is mostly waiting on the model, so each process runs a Celery worker with a
threads pool; several processes let the CPU work of many tickets (JSON, Celery, the harness)
use every core instead of one GIL. Processes are forked from a parent that has loaded and
configured the app but started no thread and opened no connection; each child tells the
parent through a pipe when its consumer is ready (a blocking read, no polling).

SIGTERM or SIGINT in a child is Celery's warm shutdown (finish what runs, then stop); the
parent sends it to every child it started and waits for them by PID.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import select
import signal
import socket
import sys
import time
import traceback
from dataclasses import dataclass, field

from celery import Celery, signals
from celery.utils.log import get_logger
from celery.worker import WorkController
from celery.worker import state as worker_state

from orchestrator.broker import cpu_quota
from orchestrator.broker.pool import TaskPool
from orchestrator.broker.redis_server import die_with_parent
from orchestrator.coordination import control, heartbeat, slot
from orchestrator.errors import BrokerError

logger = get_logger(__name__)

READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0


class _ReadyWorker(WorkController):
    """A worker that writes one byte to a pipe once its consumer takes tasks."""

    def __init__(self, ready_fd: int, **kwargs: object) -> None:
        self.ready_fd = ready_fd
        super().__init__(**kwargs)

    def on_consumer_ready(self, consumer: object) -> None:
        """Called by Celery once the consumer is connected."""
        super().on_consumer_ready(consumer)
        signals.worker_ready.send(sender=consumer)
        heartbeat.start(self.app.conf)
        slot.attach(consumer)  # its event dispatcher shows tickets run in a row in Flower
        control.start(self.app.conf.broker_url)  # cancels reach this process's steps
        logger.info("%s ready.", self.hostname)
        os.write(self.ready_fd, b"1")


# A ticket's step allocates tens of thousands of containers (pydantic models, JSON, httpx's
# requests) that reference counting frees; at Python's default of 700 a worker ran young
# collections that found almost nothing. At 20,000 a run spends 6% less CPU a ticket
# (N = 2,000, latency 0, pool 16: 7.65 -> 7.21 ms median, 5 interleaved pairs); garbage in
# cycles waits at most 20,000 allocations longer. Older generations keep Python's thresholds.
YOUNG_COLLECTION_AFTER = 20_000


@dataclass
class Child:
    """One worker process: its PID, node name and the pipe it reports readiness on."""

    pid: int
    hostname: str
    ready_fd: int  # -1 once closed

    def close_pipe(self) -> None:
        """Close the readiness pipe, once: a second stop after a failed one must not close
        a descriptor number the process has since given to another file."""
        if self.ready_fd >= 0:
            fd, self.ready_fd = self.ready_fd, -1
            os.close(fd)


@dataclass
class Fleet:
    """The worker processes one command started, stopped by PID."""

    app: Celery
    threads: int
    loglevel: str = "WARNING"
    logfile: str | None = None  # None: stderr
    children: list[Child] = field(default_factory=list)

    def spawn(self, hostname: str) -> Child:
        """Fork one worker process serving `hostname`."""
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child never returns from here
            os.close(read_fd)
            _child_main(self.app, hostname, self.threads, (self.loglevel, self.logfile), write_fd)
        os.close(write_fd)
        child = Child(pid, hostname, read_fd)
        self.children.append(child)
        return child

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Block until every child's consumer is ready; `BrokerError` if one is not."""
        deadline = time.monotonic() + timeout
        waiting = {c.ready_fd: c for c in self.children}
        while waiting:
            left = deadline - time.monotonic()
            ready, _w, _x = select.select(list(waiting), [], [], max(left, 0))
            if not ready:
                names = ", ".join(c.hostname for c in waiting.values())
                raise BrokerError(f"workers not ready after {timeout:.0f} s: {names}")
            for fd in ready:
                child = waiting.pop(fd)
                if os.read(fd, 1) != b"1":
                    raise BrokerError(f"worker {child.hostname} exited before it was ready")

    def stop(self, graceful: bool = True, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop every child: warm shutdown (SIGTERM), or SIGKILL; SIGKILL what outlives it."""
        for child in self.children:
            _signal(child.pid, signal.SIGTERM if graceful else signal.SIGKILL)
        deadline = time.monotonic() + timeout
        for child in self.children:
            if not _reap(child.pid, deadline):
                _signal(child.pid, signal.SIGKILL)
                _reap(child.pid, None)
            child.close_pipe()
        self.children.clear()


def cores() -> int:
    """The cores this process may use: those it may run on (its CPU affinity: a container's
    `--cpuset-cpus`, `taskset`), fewer if its cgroup's CPU quota (`docker --cpus`, a
    Kubernetes CPU limit, systemd's CPUQuota=) allows less, rounded up. `os.cpu_count`
    sees neither: a container limited to 2 CPUs on a 64-core host would start 64 processes."""
    try:
        allowed = len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # no affinity on this platform
        allowed = os.cpu_count() or 1
    quota = cpu_quota.of_this_process()
    return allowed if quota is None else max(1, min(allowed, math.ceil(quota)))


def start(app: Celery, name: str, processes: int, threads: int, loglevel: str = "WARNING") -> Fleet:
    """Fork `processes` workers of `threads` threads each, named `<name>-<i>@<host>`, and
    wait until they take tasks."""
    fleet = spawn(app, name, processes, threads, loglevel)
    try:
        fleet.wait_ready()
    except BaseException:
        fleet.stop(graceful=False)
        raise
    return fleet


def spawn(
    app: Celery,
    name: str,
    processes: int,
    threads: int,
    loglevel: str = "WARNING",
    logfile: str | None = None,
) -> Fleet:
    """Fork the workers and return at once; `Fleet.wait_ready` waits for them. They log at
    `loglevel` to `logfile` (None: stderr)."""
    from orchestrator.plan.tasks import warm_up  # the tasks' module registers them on the app

    warm_up()
    # What the parent has built so far (modules, the app, the client) is frozen for the
    # fork: a child's collections never walk it again, so they neither pay for it nor touch
    # its pages (copy-on-write keeps them shared), as the gc module's docs advise before a
    # fork. The parent goes on collecting as before once its children are made.
    gc.collect()
    gc.freeze()
    fleet = Fleet(app, threads, loglevel, logfile)
    host = socket.gethostname()
    try:
        for i in range(1, processes + 1):
            fleet.spawn(f"{name}-{i}@{host}")
    except BaseException:
        fleet.stop(graceful=False)
        raise
    finally:
        gc.unfreeze()
    return fleet


def _child_main(
    app: Celery, hostname: str, threads: int, logs: tuple[str, str | None], ready_fd: int
) -> None:
    """The body of a forked worker process; it exits the process, never returns. `logs`:
    the level and the file (None: stderr) of its log."""
    loglevel, logfile = logs
    code = 0
    try:
        die_with_parent()
        gc.set_threshold(YOUNG_COLLECTION_AFTER, *gc.get_threshold()[1:])
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, _warm_shutdown)
        app.log.setup(loglevel=loglevel, logfile=logfile, redirect_stdouts=False)
        worker = _ReadyWorker(
            ready_fd=ready_fd,
            app=app,
            hostname=hostname,
            concurrency=threads,
            pool=TaskPool,  # Celery's threads pool that wakes its loop (broker/pool.py)
            loglevel=loglevel,
            without_heartbeat=False,  # Flower shows a worker as online only with heartbeats
            without_mingle=True,
            without_gossip=True,
        )
        try:
            worker.start()
        finally:
            heartbeat.stop()
            control.stop()
        code = worker.exitcode or 0
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _warm_shutdown(_signum: int, _frame: object) -> None:
    worker_state.should_stop = 0  # Celery's own flag: finish running tasks, then stop


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def _reap(pid: int, deadline: float | None) -> bool:
    """Wait for `pid` to exit (until `deadline`, or for ever if None); True if it did.

    A pidfd becomes readable when the process exits: a blocking wait with a timeout.
    """
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        left = None if deadline is None else max(deadline - time.monotonic(), 0)
        if not select.select([pidfd], [], [], left)[0]:
            return False
        os.waitpid(pid, 0)
        return True
    except ChildProcessError:
        return True
    finally:
        os.close(pidfd)


class _Shutdown(Exception):
    """SIGTERM or SIGINT reached the parent of the workers."""


def _shut_down(_signum: int, _frame: object) -> None:
    raise _Shutdown


def serve(app: Celery, name: str, processes: int, threads: int, loglevel: str) -> int:
    """`ticketgraph worker`: run the workers until SIGTERM/SIGINT; restart one that dies."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _shut_down)
    workers = start(app, name, processes, threads, loglevel)
    names = ", ".join(c.hostname for c in workers.children)
    print(f"ticketgraph worker ready: {processes} x {threads} threads ({names})", flush=True)
    try:
        while True:
            pid, status = os.wait()  # a blocking wait; a signal unwinds it
            _replace(workers, pid, status)
    except (_Shutdown, ChildProcessError):
        pass
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, signal.SIG_IGN)  # the children get it from stop() below
        workers.stop(graceful=True)
    return 0


def _replace(workers: Fleet, pid: int, status: int) -> None:
    """A worker process died on its own: say so, and start another under its name."""
    dead = next((c for c in workers.children if c.pid == pid), None)
    if dead is None:
        return
    workers.children.remove(dead)
    dead.close_pipe()
    code = os.waitstatus_to_exitcode(status)
    print(f"worker {dead.hostname} exited ({code}); restarting", file=sys.stderr, flush=True)
    workers.spawn(dead.hostname)
