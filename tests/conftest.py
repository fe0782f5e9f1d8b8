"""Fixtures for the whole suite: a configuration folder of the tests' own."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

_HOME: dict[str, str] = {}


def pytest_configure(config: pytest.Config) -> None:
    """Point XDG_CONFIG_HOME at a folder of this test process for the whole session, as a
    user's own: `init` makes the signing key there (run/signing.py), every CLI subprocess
    inherits it, and the developer's ~/.config is never read or written."""
    _HOME["old"] = os.environ.get("XDG_CONFIG_HOME", "")
    _HOME["dir"] = tempfile.mkdtemp(prefix="ticketgraph-config-")
    os.environ["XDG_CONFIG_HOME"] = _HOME["dir"]
    os.environ.pop("TICKETGRAPH_SIGNING_KEY", None)
    os.environ.pop("TICKETGRAPH_TRUSTED_KEYS", None)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove the session's configuration folder, and give the old value back."""
    shutil.rmtree(_HOME.pop("dir", ""), ignore_errors=True)
    if old := _HOME.pop("old", ""):
        os.environ["XDG_CONFIG_HOME"] = old
    else:
        os.environ.pop("XDG_CONFIG_HOME", None)
