"""`ticketgraph resume` started from the web view: the CLI's own command as a subprocess of
the server (the same submission code, the same lease, the same exit codes), one at a time
per run, its outcome kept for the run's page.

A resume runs as long as its run does, so the page does not wait for it: the action waits
`EARLY_S` for a resume that ends at once (another process works on the run: exit 75; a
configuration problem: exit 78) and otherwise says it started; the run's page is live from
then on. A thread per process reaps it and keeps the end of its output. The process
outlives the server: it writes to an anonymous file, not a pipe the server's end would
break, and runs in its own session, so a Ctrl-C to the server does not reach it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from typing import IO, Literal

from orchestrator.config.workspace import Workspace
from orchestrator.exit_codes import ExitCode

EARLY_S = 1.5  # how long the action waits for a resume that ends at once
Retry = Literal["retryable", "all", "none"]


@dataclass
class Resume:
    """One resume started from the page: its process, and once ended its exit and output."""

    run_id: str
    retry: Retry
    by: str
    process: subprocess.Popen[bytes]
    exit_code: int | None = None
    output: str = ""
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def said(self) -> str:
        """How it ended, in words (or that it runs)."""
        if self.exit_code is None:
            return f"resume of {self.run_id} runs (pid {self.process.pid}, asked by {self.by})"
        try:
            meaning = ExitCode(self.exit_code).name.lower().replace("_", " ")
        except ValueError:
            meaning = "unknown"
        last = self.output.strip().splitlines()[-1:] or [""]
        return f"resume of {self.run_id} ended: exit {self.exit_code} ({meaning}) {last[0]}".strip()


class Resumes:
    """The resumes this server started, by run (the newest of each)."""

    def __init__(self, workspace: Workspace, broker_url: str | None) -> None:
        self.workspace = workspace
        self.broker_url = broker_url
        self.lock = threading.Lock()
        self.by_run: dict[str, Resume] = {}

    def start(self, run_id: str, retry: Retry, by: str) -> Resume:
        """Start `ticketgraph resume RUN --retry-failed RETRY`; wait `EARLY_S` for an early
        end. A second resume of a run whose first still runs is refused (`RuntimeError`)."""
        with self.lock:
            running = self.by_run.get(run_id)
            if running is not None and running.exit_code is None:
                raise RuntimeError(
                    f"a resume of {run_id} started from this page still runs "
                    f"(pid {running.process.pid}): its page shows it live"
                )
            output = tempfile.TemporaryFile()  # noqa: SIM115 (closed by _reap, in its thread)
            process = subprocess.Popen(
                self._command(run_id, retry),
                cwd=self.workspace.root,
                env=self._env(),
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            started = Resume(run_id, retry, by, process)
            self.by_run[run_id] = started
        threading.Thread(target=_reap, args=(started, output), daemon=True).start()
        started.done.wait(EARLY_S)
        return started

    def of(self, run_id: str) -> Resume | None:
        """The newest resume of `run_id` this server started."""
        return self.by_run.get(run_id)

    def _command(self, run_id: str, retry: Retry) -> list[str]:
        workspace = str(self.workspace.root)
        return [
            sys.executable, "-m", "orchestrator.cli", "resume", run_id,
            "--workspace", workspace, "--quiet", "--retry-failed", retry,
        ]  # fmt: skip

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.broker_url:
            env["TICKETGRAPH_BROKER_URL"] = self.broker_url
        return env


def _reap(resume: Resume, output: IO[bytes]) -> None:
    """Wait for the process, then keep its exit code and the end of its output."""
    code = resume.process.wait()
    with output:
        output.seek(0)
        resume.output = output.read()[-4000:].decode("utf-8", errors="replace")
    resume.exit_code = code
    resume.done.set()
