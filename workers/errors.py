"""Every error the harness raises, translated at one boundary each.

HarnessError
├── TokenizerError        the o200k_base ranks are missing or fail their checksum
├── ProviderError         the model endpoint failed us (HTTP status, timeout, bad body)
├── ScenarioError         a scripted-provider scenario file is invalid
├── Cancelled             the run's cancel token fired (raised inside tools)
├── Superseded            another copy of this task holds the run now: this one writes nothing
└── ToolError             a tool failed; the message goes back to the model as data
    └── PermanentToolError  no message can fix it; the run stops `failed`
"""

from __future__ import annotations


class HarnessError(Exception):
    """Base of every error this package raises on purpose."""


class TokenizerError(HarnessError):
    """The tokenizer data could not be loaded or failed verification."""


class ProviderError(HarnessError):
    """The model provider returned an error or could not be reached."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after: float | None = None  # seconds the server asked us to wait

    @property
    def retryable(self) -> bool:
        """True if asking again later may succeed: no answer at all (connection, timeout,
        a malformed body), 408/409/429, or a server error; other 4xx need a person."""
        return self.status is None or self.status in (408, 409, 429) or self.status >= 500


class ScenarioError(HarnessError):
    """A scenario file for the scripted provider is malformed."""


class Cancelled(HarnessError):
    """The run was cancelled; raised from waits inside tools."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Superseded(HarnessError):
    """This copy of a task lost its hold on the files it writes (another delivery of the same
    task took them over): it must stop, write nothing and pay for nothing more."""

    def __init__(self, message: str, epoch: int = 0, newest: int = 0) -> None:
        super().__init__(message)
        self.epoch, self.newest = epoch, newest  # this copy's hold, and the one that took over


class ToolError(HarnessError):
    """A tool failed in a way the model may be able to correct."""


class PermanentToolError(ToolError):
    """A tool failed in a way no message to the model can fix (e.g. permission denied)."""
