"""The orchestrator tests' fixtures a demo workspace and the CLI as a subprocess, shared."""

from tests.conftest import cli, demo  # noqa: F401  (fixtures)
