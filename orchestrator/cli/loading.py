"""A command's imports, loaded without garbage collection.

Each handler imports the rooms it calls when it runs, so `--help`, `status` or a misspelt
flag do not pay for Celery, redis-py and the harness (half a second here); the commands
that do load them (run, resume, worker) load them inside `loading()`.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def loading() -> Iterator[None]:
    """No garbage collection while a command loads the rooms it runs, then what they built
    frozen out of later collections.

    Importing Celery, redis-py, httpx, pydantic and the harness builds some hundred
    thousand objects and frees almost none, yet sets off about two hundred collections
    (one of them full) that find nothing: 0.12 s of the demo's whole command here. Frozen
    (`gc.freeze`), those objects are not walked again either, until a fork of worker
    processes unfreezes this process after collecting (`worker_processes.spawn`); the few
    cycles that imports leave are kept, as `entry` keeps them at exit.
    """
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_on:
            gc.enable()
