"""Where a run ends. Every terminal transition of a run — its verdict, a stop (asked for, a
signal, a timeout, a broker that lost its data), a crash — goes through `end`: one trace
event, run.json's status, exit code and error, then its totals (run/totals.py), and
run-state.json materialised from the records, in that order. The event comes first: whoever
sees the run ended in run.json (a CLI that then stops its embedded workers) finds it traced."""

from __future__ import annotations

from collections.abc import Callable

from orchestrator.errors import GraphError, RunStateError, RunStorageError
from orchestrator.exit_codes import ExitCode
from orchestrator.run import totals, waitlist
from orchestrator.run.records import Cancel, RunMeta, RunStatus
from orchestrator.run.store import RunStore


def end(
    store: RunStore,
    status: RunStatus,
    exit_code: int,
    error: str | None = None,
    event: str | None = None,
    if_running: bool = False,
    cancel: Cancel | None = None,
) -> int:
    """End the run with `status` and `exit_code`; trace `event` (with the error, if any,
    and who cancelled it and why, for a `cancel`); return the exit code. `if_running`: a
    run that already ended stays as it ended, and its own exit code is returned."""

    def ends(meta: RunMeta) -> bool:
        if if_running and meta.status is not RunStatus.RUNNING:
            return False
        meta.cancel = cancel or meta.cancel
        meta.end(status, exit_code, error)
        return True

    def trace() -> None:
        if event is None:
            return
        fields: dict[str, object] = {"error": error} if error else {}
        if cancel is not None:
            fields |= {"by": cancel.by, "reason": cancel.reason}
        store.tracer(node="run").emit(event, **fields)

    if (ended := _end(store, ends, trace)) is not None:
        return ended
    waitlist.materialise(store)
    return exit_code


def _end(store: RunStore, ends: Callable[[RunMeta], bool], trace: Callable[[], None]) -> int | None:
    """Under the run's lock: let `ends` end the run in its run.json (False: it had ended
    already, and its own exit code is returned), `trace` the end, write it, then count its
    totals and write them; None once done.

    The end is written before the count: a step that saves a record after the count began
    finds the run ended, and counts again (totals.recount)."""
    with store.locked():
        meta = store.meta()
        if not ends(meta):
            return ExitCode.CRASHED if meta.exit_code is None else meta.exit_code
        untraced: OSError | None = None
        try:
            trace()
        except OSError as exc:  # run.json still records the end; the caller hears of it
            untraced = exc
        meta.totals = None
        store.write_meta(meta)
        try:
            totals.count(store, meta)
            store.write_meta(meta, touch=False)
        except (OSError, RunStateError):  # the end is written: readers count for themselves
            pass
    if untraced is not None:
        raise untraced
    return None


def verdict(store: RunStore, exit_code: int) -> int:
    """End the run done, with its verdict's exit code (a run already done keeps its own)."""
    done = store.meta()
    if done.status is RunStatus.DONE and done.exit_code is not None:
        return done.exit_code
    return end(store, RunStatus.DONE, exit_code)


def stop_early(store: RunStore) -> int:
    """End the run at the stop point it was asked to stop at (exit 2, resumable)."""
    return end(store, RunStatus.STOPPED, ExitCode.STOPPED)


def stopped(store: RunStore, why: str, if_running: bool = False) -> int:
    """End the run stopped early, for `why` (a signal, a timeout, a lost broker): exit 2,
    resumable."""
    return end(
        store, RunStatus.STOPPED, ExitCode.STOPPED, why, "run_interrupted", if_running=if_running
    )


def cancelled(store: RunStore, cancel: Cancel, event: str) -> int:
    """End a running run stopped because someone cancelled it (exit 2, resumable); a run
    that already ended stays as it ended."""

    why = cancel.why
    return end(store, RunStatus.STOPPED, ExitCode.STOPPED, why, event, True, cancel)


def crashed(store: RunStore, exc: BaseException, if_running: bool = False) -> int:
    """End the run crashed, with the error; return exit code 3 (`if_running`: a run that
    already ended stays as it ended, and its own exit code is returned).

    If the run folder itself cannot be written (the usual cause of such a crash), raise
    `RunStorageError` with both errors: the caller reports it, and `resume` works once fixed.
    """
    error = crash_text(exc)
    try:
        return end(
            store, RunStatus.CRASHED, ExitCode.CRASHED, error, "run_crashed", if_running=if_running
        )
    except OSError as unwritable:
        if isinstance(exc, RunStorageError):  # already the story of a crash left unrecorded
            raise exc from unwritable
        raise RunStorageError(
            f"{error} (and the crash could not be recorded: {crash_text(unwritable)})"
        ) from exc


def crash_text(exc: BaseException) -> str:
    """An error as one line; an OSError names its path. Our own errors are sentences that
    say what failed; another's is named by its type (`KeyError: 'x'`)."""
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{type(exc).__name__}: {exc.strerror or exc}: {exc.filename}"
    if isinstance(exc, GraphError) and str(exc):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"
